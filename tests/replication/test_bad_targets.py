"""Rounds with a target that cannot be used, or a copy that fails verification (issue 11, items 6 and 9).

An unusable target (its root replaced by a plain file, a URI its file system cannot open, a copier that gives
up) fails that target only: the report names it and the reason, its leases are released, the round's record
is finished (never left `running`) and the other target still replicates. A corrupt copy (INVALID) is named in
the report (segment, site, path, the verification error) with what to run, and the round ``has_problems``.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from sqlalchemy import select, update

from segrep.catalog import models as m
from segrep.core.errors import SegrepError
from segrep.replication.orchestrator import run_round
from segrep.replication.reports import RoundReport, RoundStatus
from segrep.replication.status import status_rows
from segrep.storage.transport import CopyItem, CopyOutcome, copy_one
from tests.support.checks import assert_replicas_equal_leader, lease_count, segment_rows, triples
from tests.support.cli import cli
from tests.support.env import Env
from tests.support.models import Model
from tests.support.rounds import bring_up, corrupting_copier, no_spark, take_down
from tests.support.tables import TABLE


def _round_statuses(env: Env) -> list[str]:
    with env.catalog.read() as s:
        return list(s.scalars(select(m.Round.status).order_by(m.Round.round_id)))


def _assert_failed_cleanly(env: Env, report: RoundReport, reason: str) -> None:
    """dr failed for ``reason``, edge replicated, no lease left, no round left running."""
    assert report.status == RoundStatus.FAILED and report.failed == ["dr"], str(report)
    assert reason in (report.targets["dr"].error or ""), str(report)
    assert report.targets["edge"].status == "ok" and report.has_problems
    assert lease_count(env.catalog) == 0
    assert "running" not in _round_statuses(env)
    assert triples(env.catalog, "edge") == triples(env.catalog)  # the other target is replicated


def test_a_plain_file_in_place_of_the_leaders_table_directory_is_named_in_each_target(env: Env) -> None:
    """Before: each target failed with a bare `NotADirectoryError: [Errno 20] Not a directory: '...'`."""
    model = Model()
    model.upsert(env, range(10), "a")
    table_dir = env.site_dir("primary") / TABLE
    table_dir.rename(table_dir.with_name("aside"))
    table_dir.write_text("in the way\n")
    report = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert report.failed == ["dr", "edge"], str(report)
    for target in ("dr", "edge"):
        error = report.targets[target].error or ""
        assert f"site primary: {table_dir} is a plain file where a directory is needed" in error, str(report)
    assert lease_count(env.catalog) == 0 and "running" not in _round_statuses(env)


def test_a_target_root_replaced_by_a_plain_file_fails_that_target_only(env: Env) -> None:
    model = Model()
    model.upsert(env, range(10), "a")
    defs = env.defs  # loaded while every site is up (the round's own load happens before the outage)
    assert run_round(env.catalog, defs, TABLE, submit=no_spark).status == "ok"
    model.upsert(env, range(5, 20), "b")
    aside = take_down(env, "dr")  # mid-life: dr holds segments, then its root becomes a plain file
    report = run_round(env.catalog, defs, TABLE, submit=no_spark)
    _assert_failed_cleanly(env, report, f"site dr: its root {env.site_dir('dr')} is a plain file, not a directory")
    text = str(report)
    assert "  dr: failed" in text and f"{env.site_dir('dr')}" in text and "  edge: ok" in text, text
    assert triples(env.catalog, "edge") == model.snapshot()
    bring_up(env, "dr", aside)
    retry = run_round(env.catalog, defs, TABLE, reoffer=True, submit=no_spark)
    assert retry.status == "ok" and not retry.has_problems, str(retry)
    assert_replicas_equal_leader(env.catalog)


def test_a_target_whose_store_cannot_be_opened_fails_that_target_only(env: Env) -> None:
    """A URI pyarrow's file systems refuse (ArrowInvalid, not an OSError) was an internal error that left
    the round running and its leases behind."""
    Model().upsert(env, range(10), "a")
    with env.catalog.write() as s:
        s.execute(update(m.Site).where(m.Site.name == "dr").values(uri="ftp://host/segrep"))
    report = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    _assert_failed_cleanly(env, report, "ArrowInvalid: Unrecognized filesystem type in URI: ftp://host/segrep")
    assert segment_rows(env.catalog, "dr") == []


@pytest.mark.parametrize(
    "error",
    [
        OSError("No space left on device"),
        pa.ArrowIOError("connection reset by peer"),
        SegrepError("Spark job distributed_copy failed (exit 1)"),
    ],
    ids=["os", "arrow", "spark"],
)
def test_a_copier_that_gives_up_fails_that_target_and_releases_its_leases(env: Env, error: Exception) -> None:
    Model().upsert(env, range(10), "a")

    def copier(items: list[CopyItem]) -> list[CopyOutcome]:
        if any(item.target == "dr" for item in items):
            raise error
        return [copy_one(item) for item in items]

    report = run_round(env.catalog, env.defs, TABLE, submit=no_spark, copier=copier)
    _assert_failed_cleanly(env, report, f"copy failed: {type(error).__name__}: {error}")
    assert segment_rows(env.catalog, "dr") == []
    retry = run_round(env.catalog, env.defs, TABLE, reoffer=True, submit=no_spark)
    assert retry.status == "ok", str(retry)
    assert_replicas_equal_leader(env.catalog)


def test_a_corrupt_copy_is_named_with_what_to_run(env: Env) -> None:
    Model().upsert(env, range(10), "a")

    def copier(items: list[CopyItem]) -> list[CopyOutcome]:
        return corrupting_copier(items) if items[0].target == "dr" else [copy_one(i) for i in items]

    report = run_round(env.catalog, env.defs, TABLE, submit=no_spark, copier=copier)
    assert report.status == RoundStatus.PARTIAL and report.failed == [] and report.has_problems
    leader = {seg: rel for _p, seg, _h, rel in segment_rows(env.catalog, "primary")}
    invalid = report.targets["dr"].invalid
    assert sorted(bad.segment_id for bad in invalid) == sorted(leader)  # the first segment of each partition
    for bad in invalid:
        assert bad.site == "primary" and bad.path == f"{env.site_dir('primary')}/{leader[bad.segment_id]}"
        assert "does not match the catalog" in bad.error and leader[bad.segment_id] in bad.error
    assert report.targets["edge"].invalid == [] and report.invalid == [("dr", bad) for bad in invalid]
    assert lease_count(env.catalog) == 0 and segment_rows(env.catalog, "dr") == []

    text = str(report)
    for bad in invalid:
        assert f"INVALID: segment {bad.segment_id} of partition {bad.partition_id}, file {bad.path} at primary" in text
    assert f"run `segrep round {TABLE} --target dr --reoffer`" in text and "damaged at primary" in text, text
    assert RoundReport.from_dict(json.loads(json.dumps(report.to_dict()))).invalid == report.invalid

    row = next(r for r in status_rows(env.catalog, TABLE) if r.target == "dr")  # from the stored report
    assert row.invalid == invalid
    assert f"segrep round {TABLE} --target dr --reoffer" in row.note()
    code, out, err = cli(env, "status", TABLE)
    assert code == 0, err
    dr_line = next(line for line in out.splitlines() if line.split()[:2] == [TABLE, "dr"])
    assert "--target dr --reoffer` to copy again now" in dr_line and invalid[0].segment_id in dr_line, out

    retry = run_round(env.catalog, env.defs, TABLE, reoffer=True, submit=no_spark)
    assert retry.status == "ok" and not retry.has_problems, str(retry)
    assert_replicas_equal_leader(env.catalog)
    row = next(r for r in status_rows(env.catalog, TABLE) if r.target == "dr")
    assert row.invalid == [] and "INVALID" not in row.note()


def test_a_round_with_only_declines_that_clear_by_themselves_has_no_problems(env: Env) -> None:
    Model().upsert(env, range(10), "a")
    first = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert first.status == "ok" and not first.has_problems
    again = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert not again.has_problems
