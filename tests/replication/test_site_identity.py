"""Site identity (issue 32, found 1 and deliver 1; DESIGN 13): a vanished, empty or foreign site root is
DOWN/UNIDENTIFIED and never recreated or filled.

Before the marker, renaming a replica's directory (an unmounted volume) made the next round recreate an empty
root, copy files into it, report the target `ok`, move its safe time and pass `verify`; the real site's
reads then failed on missing files when it came back.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.core.errors import SegrepError
from segrep.replication.orchestrator import run_round
from segrep.replication.reports import RoundStatus, TargetStatus
from segrep.storage.identity import MARKER_NAME
from tests.support.checks import assert_replicas_equal_leader, segment_rows, triples
from tests.support.cli import cli
from tests.support.env import Env
from tests.support.models import Model
from tests.support.rounds import no_spark
from tests.support.s3 import S3Endpoint
from tests.support.tables import TABLE


def _safe_time(env: Env, site: str) -> int | None:
    with env.catalog.read() as s:
        return s.scalar(
            select(m.SafeTime.safe_time_us)
            .join(m.Site, m.Site.site_id == m.SafeTime.site_id)
            .join(m.Table, m.Table.table_id == m.SafeTime.table_id)
            .where(m.Site.name == site, m.Table.name == TABLE)
        )


def _tree(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*")) if d.exists() else []


def _replicated(env: Env, model: Model) -> None:
    model.upsert(env, range(10), "a")
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).status == RoundStatus.OK


def test_a_vanished_replica_root_is_down_and_never_recreated(env: Env) -> None:
    model = Model()
    _replicated(env, model)
    held, safe = segment_rows(env.catalog, "dr"), _safe_time(env, "dr")
    aside = env.site_dir("dr").with_name("dr.unmounted")
    env.site_dir("dr").rename(aside)  # the volume is unmounted: its mount point is gone
    model.upsert(env, range(5, 20), "b")

    report = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    dr = report.targets["dr"]
    assert dr.status == TargetStatus.DOWN and report.status == RoundStatus.FAILED and report.failed == ["dr"]
    assert f"DOWN/UNIDENTIFIED: site dr: its root {env.site_dir('dr')} does not exist" in (dr.error or "")
    assert dr.segments_copied == 0 and report.targets["edge"].status == TargetStatus.OK
    assert not env.site_dir("dr").exists()  # nothing created in its place
    assert segment_rows(env.catalog, "dr") == held and _safe_time(env, "dr") == safe  # no ack, no safe time
    assert _safe_time(env, "edge") != safe  # the healthy replica moves on

    code, out, _ = cli(env, "status", TABLE)
    line = next(x for x in out.splitlines() if x.startswith(f"{TABLE}  dr "))
    assert code == 0 and "backing off (DOWN/UNIDENTIFIED: site dr: its root" in line, out
    code, out, err = cli(env, "verify", TABLE, "--site", "dr")
    assert code != 0 and "DOWN/UNIDENTIFIED" in out + err, (out, err)
    assert not env.site_dir("dr").exists()

    aside.rename(env.site_dir("dr"))  # the volume is back, with its files and its marker
    retry = run_round(env.catalog, env.defs, TABLE, reoffer=True, submit=no_spark)
    assert retry.status == RoundStatus.OK and retry.targets["dr"].segments_copied > 0
    assert_replicas_equal_leader(env.catalog)
    assert triples(env.catalog, "dr") == model.snapshot()


def test_an_empty_mount_point_is_not_the_site(env: Env) -> None:
    model = Model()
    _replicated(env, model)
    shutil.rmtree(env.site_dir("dr"))
    env.site_dir("dr").mkdir()  # an empty directory where the volume should be mounted
    model.upsert(env, range(5, 20), "b")
    report = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert report.targets["dr"].status == TargetStatus.DOWN
    assert f"has no identity marker {MARKER_NAME}" in (report.targets["dr"].error or "")
    assert _tree(env.site_dir("dr")) == []  # nothing copied into it


def test_a_replaced_root_is_down_until_adopted(env: Env) -> None:
    """A marker of another catalog (a restored backup, a catalog that was lost) is DOWN; `site adopt` claims it."""
    model = Model()
    _replicated(env, model)
    marker = env.site_dir("dr") / MARKER_NAME
    doc = json.loads(marker.read_text())
    marker.write_text(json.dumps({**doc, "catalog_uuid": "0" * 32}))
    model.upsert(env, range(5, 20), "b")
    report = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert report.targets["dr"].status == TargetStatus.DOWN
    assert f"belongs to catalog {'0' * 32}, not to this catalog" in (report.targets["dr"].error or "")

    code, out, err = cli(env, "site", "adopt", "dr", "--dry-run")
    assert code == 0 and "would write the identity marker of site dr" in out, (out, err)
    assert json.loads(marker.read_text())["catalog_uuid"] == "0" * 32
    code, out, err = cli(env, "site", "adopt", "dr")
    assert code == 0 and out.startswith("site dr: identity marker adopted (its marker named site dr"), (out, err)
    assert json.loads(marker.read_text())["catalog_uuid"] == doc["catalog_uuid"]
    assert json.loads(marker.read_text())["site_uuid"] == doc["site_uuid"]
    retry = run_round(env.catalog, env.defs, TABLE, reoffer=True, submit=no_spark)
    assert retry.status == RoundStatus.OK, retry
    assert triples(env.catalog, "dr") == model.snapshot()


def test_adopt_never_takes_another_sites_root(env: Env) -> None:
    _replicated(env, Model())
    marker = env.site_dir("dr") / MARKER_NAME
    before = marker.read_text()
    shutil.copyfile(env.site_dir("edge") / MARKER_NAME, marker)  # dr's root now says it is edge's
    code, _, err = cli(env, "site", "adopt", "dr")
    assert code == 2 and "holds the marker of site edge" in err and "two sites cannot share a root" in err, err
    assert marker.read_text() != before and json.loads(marker.read_text())["site"] == "edge"
    code, _, err = cli(env, "site", "adopt", "nosuch")
    assert code == 2 and "unknown site 'nosuch'" in err, err


def test_a_write_to_a_vanished_leader_is_refused_and_creates_nothing(env: Env) -> None:
    model = Model()
    _replicated(env, model)
    env.site_dir("primary").rename(env.site_dir("primary").with_name("primary.gone"))
    with pytest.raises(SegrepError, match=r"DOWN/UNIDENTIFIED: .*primary does not exist"):
        model.upsert(env, range(3), "c")
    assert not env.site_dir("primary").exists()


def test_site_list_shows_each_sites_identity(env: Env) -> None:
    _replicated(env, Model())
    (env.site_dir("edge") / MARKER_NAME).unlink()
    code, out, _ = cli(env, "site", "list")
    lines = {x.split()[0]: x for x in out.splitlines()[1:]}
    assert code == 0 and "identity" in out.splitlines()[0]
    assert "ok (" in lines["primary"] and "ok (" in lines["dr"], out
    assert lines["edge"].endswith("DOWN/UNIDENTIFIED: no identity marker"), out


def test_apply_never_recreates_a_claimed_root(env: Env) -> None:
    _replicated(env, Model())
    env.site_dir("edge").rename(env.site_dir("edge").with_name("edge.gone"))
    code, out, err = cli(env, "apply")
    assert code == 0 and "down    DOWN/UNIDENTIFIED" not in out, (out, err)
    assert f"down    site edge: its root {env.site_dir('edge')} does not exist" in out, out
    assert not env.site_dir("edge").exists()


def test_a_rebuild_refuses_a_root_without_a_marker(env: Env) -> None:
    """An empty mount point rebuilt from would drop every segment the site holds as lost."""
    _replicated(env, Model())
    shutil.rmtree(env.site_dir("dr"))
    env.site_dir("dr").mkdir()
    held = segment_rows(env.catalog, "dr")
    code, out, err = cli(env, "catalog", "rebuild", "--site", "dr", "--accept-loss")
    assert code == 2 and "has no identity marker, so nothing says it is this site" in err, (out, err)
    assert "segrep site adopt dr" in err and segment_rows(env.catalog, "dr") == held


def test_an_object_store_site_whose_marker_is_gone_is_down(
    s3_env: Env, s3_endpoints: tuple[S3Endpoint, S3Endpoint]
) -> None:
    """On S3 a root is a prefix: a lost prefix (or bucket policy that hides it) shows as a missing marker, and
    no round writes a segment under it until it is back."""
    a, _ = s3_endpoints
    model = Model()
    _replicated(s3_env, model)
    bucket, _, prefix = s3_env.defs.site("dr").uri.removeprefix("s3://").partition("/")
    marker_key = f"{prefix}/{MARKER_NAME}"
    assert marker_key in a.keys(bucket, prefix)  # apply wrote it
    client = a.client()
    saved = client.get_object(Bucket=bucket, Key=marker_key)["Body"].read()  # type: ignore[attr-defined]
    before = a.keys(bucket, prefix)
    client.delete_object(Bucket=bucket, Key=marker_key)  # type: ignore[attr-defined]
    model.upsert(s3_env, range(5, 20), "b")
    report = run_round(s3_env.catalog, s3_env.defs, TABLE, submit=no_spark)
    assert report.targets["dr"].status == TargetStatus.DOWN, report
    assert "has no identity marker" in (report.targets["dr"].error or "")
    assert a.keys(bucket, prefix) == [k for k in before if k != marker_key]  # nothing written there
    client.put_object(Bucket=bucket, Key=marker_key, Body=saved)  # type: ignore[attr-defined]
    retry = run_round(s3_env.catalog, s3_env.defs, TABLE, reoffer=True, submit=no_spark)
    assert retry.status == RoundStatus.OK, retry
    assert triples(s3_env.catalog, "dr") == model.snapshot()
