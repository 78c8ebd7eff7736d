"""Crash tests of the round's non-Spark steps (DESIGN section 9, invariants 1, 3, 4 and 6).

For every fault point a round without Spark reaches, the round dies there (``SEGREP_FAULTS``); the test checks
the state the crash left (so the point is really where its name says), clears the fault, retries the same
interval (what Airflow does with a failed task), then runs rounds until idle. Replicas must then equal the
leader, every segment must be listed once per target, no lease may be left, committed files must be intact
and safe time must never have gone backwards. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.core import faults, hlc
from segrep.replication.orchestrator import run_round
from segrep.storage.identity import MARKER_NAME
from tests.support.checks import (
    assert_acks_are_prefixes,
    assert_each_segment_once,
    assert_files_match_catalog,
    assert_replicas_equal_leader,
    assert_safe_time_honest,
    lease_count,
    safe_times,
    segment_rows,
    triples,
)
from tests.support.env import Env
from tests.support.models import Model
from tests.support.rounds import no_spark, round_until_idle
from tests.support.tables import REPLICAS, TABLE

NON_SPARK_POINTS = ("before_copy", "after_copy_before_commit", "after_commit_before_ack", "before_checkpoint")


def test_the_points_exist() -> None:
    assert set(NON_SPARK_POINTS) <= set(faults.POINTS)
    split_points = {x for x in faults.POINTS if x.startswith("split_")}  # tests/split/test_split.py
    moves = {x for x in faults.POINTS if x.startswith(("failover_", "switchover_"))}  # tests/failover/
    # in_merge_job: see test_round_merge; disk_full: test_storage and bench/chaos.py (an injected ENOSPC);
    # mid_upload: tests/storage/test_s3_uploads.py; write_between_batches: tests/cli/test_table_rewrite.py;
    # publish_before_commit: tests/publish/test_publication.py; in_spark_write: tests/spark/test_write_dataframe.py
    left = set(faults.POINTS) - set(NON_SPARK_POINTS) - split_points - moves
    points = {"in_merge_job", "disk_full", "mid_upload", "write_between_batches", "publish_before_commit"}
    assert left == points | {"in_spark_write"}


def _leader_acks_to(env: Env, site: str) -> set[str]:
    """Segment ids of leader segments that the placement at ``site`` is recorded to hold."""
    with env.catalog.read() as s:
        return set(
            s.scalars(
                select(m.Ack.segment_id)
                .join(m.Placement, m.Placement.placement_id == m.Ack.target_placement_id)
                .join(m.Site, m.Site.site_id == m.Placement.site_id)
                .where(m.Site.name == site)
            )
        )


@pytest.mark.parametrize("point", NON_SPARK_POINTS)
def test_crash_at_point_then_retry_converges(env: Env, monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    model = Model()
    model.upsert(env, range(40), "a")
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).status == "ok"
    model.upsert(env, range(20, 60), "b")
    model.delete(env, range(0, 6))
    model.upsert(env, range(50, 70), "c")
    expected = model.snapshot()
    safe_before = safe_times(env.catalog)
    leader_segs = {seg: rel for _p, seg, _h, rel in segment_rows(env.catalog, "primary")}
    new_for_dr = set(leader_segs) - {seg for _p, seg, _h, _r in segment_rows(env.catalog, "dr")}
    assert len(new_for_dr) == 6  # three writes x two partitions
    acks_before = _leader_acks_to(env, "dr")
    end = hlc.now_us()

    monkeypatch.setenv(faults.FAULTS_ENV, point)
    with pytest.raises(faults.InjectedFault, match=point):
        run_round(env.catalog, env.defs, TABLE, end, submit=no_spark)
    monkeypatch.delenv(faults.FAULTS_ENV)

    # the crash left what the point's name says
    dr_rows = {seg for _p, seg, _h, _r in segment_rows(env.catalog, "dr")}
    on_disk = {seg for seg in new_for_dr if (env.site_dir("dr") / leader_segs[seg]).exists()}
    if point == "before_copy":
        assert lease_count(env.catalog) > 0 and not on_disk and not dr_rows & new_for_dr
    elif point == "after_copy_before_commit":
        assert on_disk and not dr_rows & new_for_dr and lease_count(env.catalog) > 0
    elif point == "after_commit_before_ack":
        committed = dr_rows & new_for_dr  # receivers committed their first batches (partitions go side by side)
        assert committed and not committed & _leader_acks_to(env, "dr")
    else:  # before_checkpoint: every ack is in, safe time has not moved
        assert new_for_dr <= dr_rows and new_for_dr <= _leader_acks_to(env, "dr") - acks_before
        assert safe_times(env.catalog) == safe_before
    assert_files_match_catalog(env)  # committed files are intact whatever the crash
    assert_acks_are_prefixes(env.catalog, TABLE)
    assert safe_times(env.catalog) == safe_before  # nothing claimed by the crashed round

    retry = run_round(env.catalog, env.defs, TABLE, end, submit=no_spark)  # the retried task: same interval
    assert retry.status == "ok", str(retry)
    for site in REPLICAS:
        assert triples(env.catalog, site) == expected, site
        assert safe_before[site] <= retry.safe_time_us[site] <= end
    assert lease_count(env.catalog) == 0
    round_until_idle(env)

    assert triples(env.catalog) == expected
    assert_replicas_equal_leader(env.catalog)
    assert_each_segment_once(env.catalog)
    assert_files_match_catalog(env)
    assert lease_count(env.catalog) == 0
    final = safe_times(env.catalog)
    assert all(final[s] >= retry.safe_time_us[s] for s in REPLICAS)
    for site in REPLICAS:
        assert_safe_time_honest(env.catalog, TABLE, site, final[site])
    assert_acks_are_prefixes(env.catalog, TABLE)
    # the copy that preceded the crash was not registered twice, and no stray file is left at the target
    for site in REPLICAS:
        listed = {rel for _p, _s, _h, rel in segment_rows(env.catalog, site)}
        root = env.site_dir(site)
        files = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != MARKER_NAME}
        assert files == listed, (site, files ^ listed)


def test_every_point_at_once_on_successive_retries(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Crash at each point in turn on the same interval, each retry getting one step further."""
    model = Model()
    model.upsert(env, range(30), "a")
    model.delete(env, range(5))
    end = hlc.now_us()
    for point in NON_SPARK_POINTS:
        monkeypatch.setenv(faults.FAULTS_ENV, point)
        with pytest.raises(faults.InjectedFault, match=point):  # each retry has work left at the next point
            run_round(env.catalog, env.defs, TABLE, end, submit=no_spark)
        assert_files_match_catalog(env)
    monkeypatch.delenv(faults.FAULTS_ENV)
    assert run_round(env.catalog, env.defs, TABLE, end, submit=no_spark).status == "ok"
    round_until_idle(env)
    assert triples(env.catalog, "dr") == triples(env.catalog, "edge") == model.snapshot()
    assert_each_segment_once(env.catalog)
    assert lease_count(env.catalog) == 0
