"""`segrep failover --at safe-time` (issue 14 item 1): every listed table is cut at one instant T, the smallest
safe time of those tables at the new site, so that the promoted tables are consistent with each other; rows
newer than T are set aside in the new leader site's rollback area, not destroyed.

`orders` (replicated to dr) stops being replicated at T while `events` (dr, edge) goes on; both fail over to
dr at T: `events` loses at its leader the rows written after T (into the rollback file at dr), `orders` keeps
all it has (nothing of it at dr is newer than T).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.core.errors import RefusedError
from segrep.data.reader import read_table
from segrep.data.writer import write_batch
from segrep.failover.promote import Cut, failover
from segrep.replication.orchestrator import run_round
from tests.support.checks import assert_replicas_equal_leader, safe_times, triples
from tests.support.cli import cli
from tests.support.env import Env
from tests.support.failback import rows_past_a_cut
from tests.support.models import Model
from tests.support.rounds import bring_up, inprocess_submit, no_spark, take_down
from tests.support.tables import TABLE

pytestmark = pytest.mark.spark


def test_two_tables_fail_over_cut_at_their_common_safe_time(sqlite_env: Env, spark: Any) -> None:
    env = sqlite_env
    model = Model()
    kept, cut_us = rows_past_a_cut(env, model)  # keys 20-39 rewritten after the cut (at dr too, later)
    model.delete(env, range(0, 2))
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert safe_times(env.catalog)["dr"] > cut_us and triples(env.catalog, "dr") == model.snapshot()
    with env.catalog.read() as s:
        orders_before = s.scalars(select(m.Segment.segment_id)).all()

    calls: list[str] = []
    report = failover(
        env.catalog, env.defs, [TABLE, "orders"], to="dr", cut=Cut.SAFE_TIME, submit=inprocess_submit(spark, calls)
    )
    assert report.cut_us == cut_us  # the smallest safe time of the two tables at dr
    by_table = {c.table: c for c in report.cuts}
    assert by_table["orders"].partitions_cut == 0  # nothing of orders at dr is newer than the cut
    assert by_table[TABLE].partitions_cut == 2 and by_table[TABLE].rows_set_aside == 20 + 2
    assert calls == []  # one merge job folds the cut partitions, in process (a small fold: no Spark application)
    assert triples(env.catalog) == kept  # events at dr as of the cut
    with env.catalog.read() as s:
        assert set(s.scalars(select(m.Partition.paused_us))) == {None}  # writes resumed
        assert {f.cut_us for f in s.scalars(select(m.Failover))} == {cut_us}
        assert set(orders_before) <= set(s.scalars(select(m.Segment.segment_id)))

    code, out, err = cli(env, "rollback", "list", TABLE)
    assert code == 0, err
    files = [line.split() for line in out.splitlines()[1:]]
    assert {f[2] for f in files} == {"dr"} and sum(int(f[4]) for f in files) == 22
    aside = set()
    for f in files:
        rows = pq.read_table(env.site_dir("dr") / f[-1]).to_pylist()
        aside |= {(r["seq"], r["payload"], r["_deleted"]) for r in rows}
    assert aside == {(k, f"after_cut{k}", False) for k in range(20, 40)} | {(k, None, True) for k in range(2)}

    model.rows = {(t, k): p for t, k, p in kept}
    model.upsert(env, range(100, 105), "at_dr")
    for _ in range(3):
        run_round(env.catalog, env.defs, TABLE, submit=inprocess_submit(spark, calls))
    assert triples(env.catalog) == model.snapshot()
    assert_replicas_equal_leader(env.catalog, ("edge", "primary"))  # edge took the cut too; primary followed


def test_a_cut_that_leaves_a_partition_empty_and_the_old_leaders_rows_stay_aside_under_merge(
    tmp_path: Any, spark: Any
) -> None:
    """Found by the failover state machine. `on_return: merge`: primary's unreplicated rows are merged into dr
    after a failover; then primary takes the lead back at its safe time, which is older than those rows. (1)
    Every row of that partition at primary is newer than the cut: the major built as of the cut is empty, and
    it must be committed (it was refused as "nothing won", leaving writes paused). (2) dr's copy of the rows,
    newer than the cut, is set aside at dr when it returns, not merged back: a merge would undo the cut."""
    from segrep.replication.rollback import list_rollbacks
    from tests.support.env import KV_YAML, make_env

    env = make_env(
        tmp_path,
        f"sqlite:///{tmp_path}/catalog.db",
        KV_YAML.replace("{retry_delay_s: 0}", "{retry_delay_s: 0, on_return: merge}"),
    )
    calls: list[str] = []
    submit = inprocess_submit(spark, calls)
    rows = write_batch(env.catalog, "kv", pa.table({"k": pa.array([0, 1], pa.int64()), "v": ["a0", "a1"]}))
    failover(env.catalog, env.defs, ["kv"], to="dr")  # dr lacks both rows: given up, then merged back
    run_round(env.catalog, env.defs, "kv", submit=submit)
    assert sorted(read_table(env.catalog, "kv")["k"].to_pylist()) == [0, 1]  # merged at dr

    report = failover(env.catalog, env.defs, ["kv"], to="primary", cut=Cut.SAFE_TIME, submit=submit)
    assert report.cut_us is not None and report.cut_us < rows.segments[0].version
    (cut,) = report.cuts
    assert (cut.partitions_cut, cut.rows_set_aside) == (1, 2)
    with env.catalog.read() as s:
        assert set(s.scalars(select(m.Partition.paused_us))) == {None}  # the cut committed: writes flow
    write_batch(env.catalog, "kv", pa.table({"k": pa.array([7], pa.int64()), "v": ["b7"]}))
    for _ in range(3):
        run_round(env.catalog, env.defs, "kv", submit=submit)
    assert read_table(env.catalog, "kv").to_pylist() == [{"k": 7, "v": "b7"}]  # as of the cut, plus the new
    for site in ("dr", "edge"):
        assert read_table(env.catalog, "kv", site).to_pylist() == [{"k": 7, "v": "b7"}], site
    aside = {(f.site, f.relpath.endswith("-cut.parquet"), f.rows) for f in list_rollbacks(env.catalog, "kv")}
    assert aside == {("primary", True, 2), ("dr", False, 2)}, aside  # the cut's file, and dr's return
    env.catalog.dispose()


def test_a_cut_on_a_site_that_is_down_is_refused_and_changes_nothing(sqlite_env: Env, spark: Any) -> None:
    """A cut reads the new leader's segments and writes there after the move has paused writes: with that
    site's store unusable, the failover is refused before anything changes (found by the merge state machine:
    the cut failed half-way and left the table paused, the move made). Once the site is back it goes through."""
    env = sqlite_env
    model = Model()
    model.upsert(env, range(0, 10), "a")
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    leaders = select(m.Partition.partition_id, m.Partition.leader_placement_id, m.Partition.epoch)
    with env.catalog.read() as s:
        before = sorted(tuple(r) for r in s.execute(leaders))
    aside = take_down(env, "dr")
    try:
        with pytest.raises(RefusedError, match=r"cannot cut at the safe time on dr: site dr .* nothing changed"):
            failover(env.catalog, env.defs, [TABLE], to="dr", cut=Cut.SAFE_TIME, submit=no_spark)
        code, out, err = cli(env, "failover", TABLE, "--to", "dr", "--at", "safe-time")
        assert code == 2 and "cannot cut at the safe time on dr" in err and "Traceback" not in err, (out, err)
        with env.catalog.read() as s:
            assert sorted(tuple(r) for r in s.execute(leaders)) == before
            assert set(s.scalars(select(m.Partition.paused_us))) == {None}
            assert s.scalars(select(m.Failover)).all() == []
    finally:
        bring_up(env, "dr", aside)
    report = failover(env.catalog, env.defs, [TABLE], to="dr", cut=Cut.SAFE_TIME, submit=inprocess_submit(spark, []))
    assert report.cut_us is not None and report.moves[0].failover_id is not None
    with env.catalog.read() as s:
        assert set(s.scalars(select(m.Partition.paused_us))) == {None}
    assert triples(env.catalog) == model.snapshot()
