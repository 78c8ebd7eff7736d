"""Fast-forward rounds between a local site and sites on two S3-compatible stores (DESIGN 14), on SQLite.

`primary` is a local directory, `dr` a prefix on moto endpoint a and `edge` one on endpoint b, each site with
its own keys by reference (DR_S3_*, EDGE_S3_*; no AWS_* variable is set). Rounds copy local -> S3 (two
endpoints, two identities), S3 -> local and S3 -> S3 across endpoints once `dr` leads; the replicas read as
the leader. The secrets appear nowhere in the catalog, the work directory or the command output; a store
that refuses the credentials or lacks its bucket is one clear line and nothing is written.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.replication.orchestrator import run_round
from segrep.replication.reports import TargetStatus
from segrep.storage.site import Site
from tests.support.badinput import assert_user_error, catalog_rows, unchanged
from tests.support.checks import assert_replicas_equal_leader, lease_count, triples
from tests.support.cli import cli
from tests.support.env import Env, make_env, sqlite_url
from tests.support.models import Model
from tests.support.rounds import no_spark, round_until_idle, set_leader
from tests.support.s3 import BUCKETS, S3Endpoint, s3_events_yaml, secrets_of
from tests.support.tables import TABLE

Endpoints = tuple[S3Endpoint, S3Endpoint]


def _site_keys(e: S3Endpoint, env: Env, site: str) -> list[str]:
    """The segment objects under a site's root in its bucket."""
    uri = env.defs.site(site).uri.removeprefix("s3://")
    bucket, _, prefix = uri.partition("/")
    return [k for k in e.keys(bucket, prefix) if k.endswith(".parquet")]


def _assert_no_secret(secrets: list[str], where: str, text: str) -> None:
    for secret in secrets:
        assert secret not in text, f"a secret appears in {where}"


def test_rounds_replicate_to_two_regions_and_no_secret_is_stored_or_printed(
    s3_env: Env, s3_endpoints: Endpoints
) -> None:
    a, b = s3_endpoints
    model = Model()
    model.upsert(s3_env, range(200), "a")
    model.upsert(s3_env, range(100, 300), "b")
    model.delete(s3_env, range(0, 30))
    reports = round_until_idle(s3_env)
    assert reports[0].targets["dr"].segments_copied == reports[0].targets["edge"].segments_copied > 0
    assert_replicas_equal_leader(s3_env.catalog)
    assert triples(s3_env.catalog, "edge") == model.snapshot()
    assert len(_site_keys(a, s3_env, "dr")) == len(_site_keys(b, s3_env, "edge")) > 0
    _assert_copies_match_catalog(s3_env)

    secrets = secrets_of(a, b)
    _assert_no_secret(secrets, "the catalog", repr(catalog_rows(s3_env)))
    for path in s3_env.root.rglob("*"):
        if path.is_file():
            _assert_no_secret(secrets, str(path), path.read_bytes().decode("latin-1"))
    for args in (("apply",), ("apply", "--dry-run"), ("site", "list"), ("status", TABLE)):
        code, out, err = cli(s3_env, *args)
        assert code == 0, (args, out, err)
        _assert_no_secret(secrets, f"segrep {' '.join(args)}", out + err)
    code, out, _ = cli(s3_env, "site", "list")
    assert f"s3://{BUCKETS[0]}/" in out and f"s3://{BUCKETS[1]}/" in out


def _assert_copies_match_catalog(env: Env) -> None:
    """Invariant 1 at every site, S3 ones included: each committed copy has the catalog's size and sha256."""
    with env.catalog.read() as s:
        rows = s.execute(
            select(m.Site.name, m.Site.uri, m.Segment.relpath, m.Segment.byte_size, m.Segment.sha256)
            .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
            .join(m.Site, m.Site.site_id == m.Placement.site_id)
        ).all()
    assert {r.name for r in rows} == {"primary", "dr", "edge"}
    for r in rows:
        Site(r.name, r.uri).verify(r.relpath, r.byte_size, r.sha256)


def test_an_s3_leader_replicates_to_a_local_site_and_across_endpoints(s3_env: Env) -> None:
    model = Model()
    model.upsert(s3_env, range(100), "a")
    round_until_idle(s3_env)
    set_leader(s3_env.catalog, "dr")  # now dr (endpoint a) leads: writes go to S3
    model.upsert(s3_env, range(50, 150), "b")
    model.delete(s3_env, range(0, 10))
    reports = round_until_idle(s3_env)
    assert reports[0].targets["primary"].segments_copied > 0  # S3 -> local
    assert reports[0].targets["edge"].segments_copied > 0  # S3 (a) -> S3 (b)
    assert triples(s3_env.catalog) == model.snapshot()
    assert_replicas_equal_leader(s3_env.catalog, ("primary", "edge"))


def _backoffs(env: Env) -> list[tuple[int, int]]:
    from sqlalchemy import select

    from segrep.catalog import models as m

    with env.catalog.read() as s:
        return [(b.site_id, b.failures) for b in s.scalars(select(m.Backoff))]


def test_wrong_credentials_fail_that_target_only_and_write_nothing_there(
    s3_env: Env, s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = s3_endpoints
    monkeypatch.setenv("EDGE_S3_SECRET_ACCESS_KEY", "not-the-secret")
    Model().upsert(s3_env, range(100), "a")
    rep = run_round(s3_env.catalog, s3_env.defs, TABLE, submit=no_spark)
    edge = rep.targets["edge"]
    assert edge.status == TargetStatus.FAILED and edge.segments_copied == 0
    assert edge.error is not None and len(edge.error.splitlines()) == 1
    assert "site edge: the store refused to read s3://" in edge.error, edge.error  # its identity marker, first
    assert edge.refused  # a refusal does not back off: the next round names it again, or replicates once fixed
    assert [site for site, _ in _backoffs(s3_env)] == []
    _assert_no_secret(secrets_of(a, b), "the target's error", edge.error)
    assert rep.targets["dr"].status == TargetStatus.OK and rep.targets["dr"].segments_copied > 0
    assert _site_keys(b, s3_env, "edge") == []
    assert lease_count(s3_env.catalog) == 0  # the failed target released its leases
    assert_replicas_equal_leader(s3_env.catalog, ("dr",))


def test_a_missing_credentials_variable_fails_that_target_naming_it(
    s3_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EDGE_S3_ACCESS_KEY_ID")
    Model().upsert(s3_env, range(20), "a")
    rep = run_round(s3_env.catalog, s3_env.defs, TABLE, submit=no_spark)
    edge = rep.targets["edge"]
    assert edge.status == TargetStatus.FAILED
    assert "EDGE_S3_ACCESS_KEY_ID" in (edge.error or "") and "site edge" in (edge.error or "")
    assert rep.targets["dr"].status == TargetStatus.OK


@pytest.mark.parametrize("problem", ["wrong credentials", "missing bucket", "missing variable"])
def test_apply_refuses_an_unusable_s3_site_in_one_line_and_writes_nothing(
    s3_endpoints: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, problem: str
) -> None:
    a, b = s3_endpoints
    for name, value in {**a.env("DR_S3"), **b.env("EDGE_S3")}.items():
        monkeypatch.setenv(name, value)
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    prefix = os.urandom(6).hex()
    env = make_env(tmp_path, sqlite_url(tmp_path), s3_events_yaml(a, b, prefix), apply=False)
    if problem == "wrong credentials":
        monkeypatch.setenv("EDGE_S3_SECRET_ACCESS_KEY", a.secret_key)  # the other region's secret
    elif problem == "missing variable":
        monkeypatch.delenv("EDGE_S3_SECRET_ACCESS_KEY")
    else:
        env.config.write_text(s3_events_yaml(a, b, prefix, bucket_b="no-such-bucket"))
    with unchanged(env):
        code, out, err = cli(env, "apply")
    line = assert_user_error(code, out, err, "site edge")
    _assert_no_secret(secrets_of(a, b), "apply's error", out + err)
    expected = {
        "wrong credentials": "access_denied",
        "missing bucket": "no_such_bucket",
        "missing variable": "EDGE_S3_SECRET_ACCESS_KEY",
    }[problem]
    assert expected.lower() in line.lower(), line
    # nothing written: no object but the empty "dir/" marker pyarrow's delete leaves behind dr's probe object
    assert [k for k in a.keys(BUCKETS[0], prefix) + b.keys(BUCKETS[1], prefix) if not k.endswith("/")] == []
