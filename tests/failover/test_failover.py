"""Unplanned failover (issue 14 items 1 and 2): the loss named before anything changes, the promotion while the
old leader's site is down, fencing of a writer of the old epoch, and replication from the new leader.

`events` is led by `primary` and replicated to `dr` and `edge` (tests.support.env.ORDERS_YAML).
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.data import writer
from segrep.data.writer import write_batch
from segrep.failover.promote import failover
from segrep.replication.orchestrator import run_round
from segrep.replication.rollback import list_rollbacks
from segrep.storage.transport import CopyItem, CopyOutcome, local_copier
from tests.support.badinput import unchanged
from tests.support.checks import assert_replicas_equal_leader, leaders, triples
from tests.support.cli import cli
from tests.support.env import Env
from tests.support.models import Model
from tests.support.rounds import bring_up, no_spark, take_down
from tests.support.tables import TABLE, TENANTS, batch


def segments_written_since(env: Env, entry_id: int) -> list[m.Segment]:
    with env.catalog.read() as s:
        return list(s.scalars(select(m.Segment).where(m.Segment.entry_id > entry_id)))


def primary_entries(env: Env) -> list[str]:
    with env.catalog.read() as s:
        return list(
            s.scalars(
                select(m.Segment.segment_id)
                .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
                .join(m.Site, m.Site.site_id == m.Placement.site_id)
                .where(m.Site.name == "primary")
            )
        )


def newest_entry(env: Env) -> int:
    with env.catalog.read() as s:
        return max(s.scalars(select(m.Segment.entry_id)).all(), default=0)


def test_dry_run_names_the_loss_then_failover_promotes_while_the_leader_is_down(env: Env) -> None:
    model = Model()
    model.upsert(env, range(0, 40), "a")
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    mark = newest_entry(env)
    kept = model.snapshot()
    model.upsert(env, range(30, 60), "unreplicated")  # at primary only
    model.delete(env, range(0, 3))
    unreplicated = segments_written_since(env, mark)
    before = leaders(env.catalog)
    aside = take_down(env, "primary")

    code, out, err = cli(env, "failover", TABLE, "--dry-run")
    assert code == 0, err
    assert leaders(env.catalog) == before  # nothing changed
    assert "failover of events: primary -> dr, at latest (dry run: nothing changed)" in out, out
    assert "dr is the most advanced live replica" in out and "ties go to the lower site id" in out, out
    rows = sum(seg.row_count for seg in unreplicated)
    assert f"{len(unreplicated)} segment(s), {rows:,} rows, {sum(s.byte_size for s in unreplicated):,} bytes" in out
    for seg in unreplicated:
        assert f"partition {seg.partition_id}: " in out

    report = failover(env.catalog, env.defs, [TABLE])
    (move,) = report.moves
    assert move.assessment.to_site == "dr" and move.failover_id is not None
    assert {x.partition_id for x in move.assessment.loss} == {seg.partition_id for seg in unreplicated}
    assert sorted(sid for x in move.assessment.loss for sid in x.segment_ids) == sorted(
        seg.segment_id for seg in unreplicated
    )
    after = leaders(env.catalog)
    assert {site for site, _ in after.values()} == {"dr"}
    assert all(after[pid][1] == before[pid][1] + 1 for pid in before)
    with env.catalog.read() as s:
        record = s.scalars(select(m.Failover)).one()
        assert (record.kind, record.cut) == ("failover", "latest") and len(record.loss) == len(move.assessment.loss)

    lost_rows = move.assessment.rows_lost
    for args in (("status", TABLE), ("table", "describe", TABLE)):
        code, out, err = cli(env, *args)
        assert code == 0, err
        assert f"events: leader dr (2 partitions), epoch {max(e for _, e in after.values())}; last failover " in out
        assert f"primary -> dr at latest, given up {len(unreplicated)} segment(s), {lost_rows:,} rows" in out, out
        assert "(on return: rollback)" in out

    # Writes route to dr with no change to the definitions; rounds replicate from dr to edge (primary is down).
    assert triples(env.catalog) == kept  # the new leader serves what it held: the unreplicated rows are lost
    model.rows = {(t, k): p for t, k, p in kept}
    model.upsert(env, range(100, 120), "after")
    report = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert report.targets["edge"].status == "ok" and report.targets["primary"].status == "down"
    assert triples(env.catalog, "edge") == model.snapshot()
    bring_up(env, "primary", aside)
    code, _out, err = cli(env, "apply")  # the definitions still say `leader: primary`: still valid
    assert code == 0, err
    assert leaders(env.catalog) == {pid: ("dr", epoch) for pid, (_, epoch) in after.items()}


def test_a_writer_of_the_old_epoch_cannot_commit_and_retries_at_the_new_leader(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Model()
    model.upsert(env, range(0, 20), "a")
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    info_targets = writer.write_targets
    with env.catalog.read() as s:
        stale = info_targets(env.catalog, q.table_info(s, TABLE))  # what a writer read before the failover
    failover(env.catalog, env.defs, [TABLE], to="edge")
    calls: list[int] = []

    def zombie_then_fresh(catalog: Any, info: Any, site: str | None = None) -> Any:
        calls.append(1)
        return stale if len(calls) == 1 else info_targets(catalog, info, site)

    monkeypatch.setattr(writer, "write_targets", zombie_then_fresh)
    before = primary_entries(env)
    result = write_batch(env.catalog, TABLE, batch(list(range(50, 60)), "z"))
    assert result.attempts == 2 and {seg.site for seg in result.segments} == {"edge"}
    assert primary_entries(env) == before  # the zombie's segments never committed at the old leader
    leftovers = [p for p in env.site_dir("primary").rglob("*.parquet") if "z" in p.name]
    assert leftovers == []
    for k in range(50, 60):
        model.rows[(TENANTS[k % len(TENANTS)], k)] = f"z{k}"
    assert triples(env.catalog) == model.snapshot()


def test_failover_refuses_what_it_cannot_do_and_changes_nothing(env: Env) -> None:
    Model().upsert(env, range(0, 10), "a")
    before = leaders(env.catalog)
    for args, needle in (
        (("failover", "nope"), "nope"),
        (("failover", TABLE, "--to", "primary"), "leads it already"),
        (("failover", TABLE, "--to", "mars"), "unknown site 'mars'"),
        (("failover", TABLE, "--at", "yesterday"), "yesterday"),
    ):
        with unchanged(env):
            code, out, err = cli(env, *args)
        assert code == 2 and needle in err and "Traceback" not in err, (args, out, err)
    assert leaders(env.catalog) == before


def test_failover_back_and_forth_keeps_every_site_equal(env: Env) -> None:
    model = Model()
    model.upsert(env, range(0, 30), "a")
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    failover(env.catalog, env.defs, [TABLE], to="dr")
    model.upsert(env, range(20, 50), "b")
    for _ in range(2):
        run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    failover(env.catalog, env.defs, [TABLE], to="primary")
    model.upsert(env, range(40, 70), "c")
    for _ in range(2):
        run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert triples(env.catalog) == model.snapshot()
    assert_replicas_equal_leader(env.catalog)
    with env.catalog.read() as s:
        assert len(s.scalars(select(m.Failover)).all()) == 2


def test_a_round_of_the_old_epoch_cannot_commit_what_it_copied(env: Env) -> None:
    """A fast-forward planned under the old leader whose copy finishes after the failover: its commit is
    conditional on the leader and epoch it started with, so nothing of it is registered (the copied files are
    orphans for GC), and the next rounds replicate from the new leader."""
    model = Model()
    model.upsert(env, range(0, 20), "a")
    moved: list[int] = []

    def copy_then_fail_over(items: list[CopyItem]) -> list[CopyOutcome]:
        if not moved:  # the failover lands while the first batch is being copied
            moved.append(failover(env.catalog, env.defs, [TABLE], to="dr").moves[0].partitions_moved)
        return local_copier(items)

    report = run_round(env.catalog, env.defs, TABLE, submit=no_spark, copier=copy_then_fail_over)
    assert moved == [2]
    # the report says why nothing was committed: stale offers, not leases held by another round (INFLIGHT)
    # (the batch being copied when the failover landed; another partition may have decided before it, or after)
    assert report.targets["dr"].superseded >= 1
    assert not [site for site, t in report.targets.items() if "INFLIGHT" in t.outcomes], report.targets
    assert "copied but not committed: leadership changed or the placement was removed" in str(report)
    with env.catalog.read() as s:
        at_edge = s.scalars(
            select(m.Segment.segment_id)
            .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
            .join(m.Site, m.Site.site_id == m.Placement.site_id)
            .where(m.Site.name.in_(["dr", "edge"]))
        ).all()
    assert at_edge == []  # nothing the old epoch copied was registered at a replica
    # dr held nothing when it was promoted: the 20 rows were given up (the loss said so), and primary, the old
    # leader, sets them aside at the next round; then every site is the (empty) table and new writes flow.
    model.rows.clear()
    model.upsert(env, range(50, 55), "at_dr")
    for _ in range(2):
        run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert triples(env.catalog) == model.snapshot()
    assert_replicas_equal_leader(env.catalog, ("primary", "edge"))
    assert sum(f.rows for f in list_rollbacks(env.catalog, TABLE)) == 20
