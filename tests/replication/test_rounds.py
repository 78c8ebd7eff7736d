"""Replication rounds without Spark (DESIGN sections 6, 7, 9), on SQLite and PostgreSQL.

Every round here runs the real engine (plan -> fast-forward per target -> commit) with a ``submit`` that fails
the test if Spark is asked for: nothing in these scenarios needs a merge. Replicas are compared with the leader
through ``read_table`` (sorted), and with an independent model of the writes where the interval matters.
"""

from __future__ import annotations

import errno
import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, func, select

from segrep.catalog import Catalog
from segrep.catalog import leases as ls
from segrep.catalog import models as m
from segrep.core import hlc
from segrep.data.writer import write_batch
from segrep.replication.commit import commit_round
from segrep.replication.fast_forward import fast_forward_target
from segrep.replication.orchestrator import RoundSteps, run_round
from segrep.replication.plan import plan_round
from segrep.replication.round import TargetHeldBack, TargetUnreachable
from segrep.replication.status import status_rows
from segrep.replication.view import RoundProblems
from segrep.spark.results import CommitSummary
from segrep.storage.transport import CopyItem, copy_one
from tests.support.checks import (
    assert_acks_are_prefixes,
    assert_each_segment_once,
    assert_files_match_catalog,
    assert_replicas_equal_leader,
    assert_safe_time_honest,
    catalog_state,
    lease_count,
    partitions,
    placement_id,
    safe_times,
    segment_rows,
    sorted_table,
    triples,
)
from tests.support.cli import cli
from tests.support.crc import crc64nvme_reference
from tests.support.env import ORDERS_YAML, Env, env_fixture, make_env, pg_schema_url
from tests.support.models import Model
from tests.support.rounds import bring_up, corrupting_copier, no_spark, round_until_idle, take_down
from tests.support.tables import REPLICAS, TABLE, batch

# -- tests ------------------------------------------------------------------------------------------------------


def test_two_targets_converge_and_a_second_round_does_nothing(env: Env) -> None:
    model = Model()
    model.upsert(env, range(100), "a")
    model.upsert(env, range(50, 150), "b")
    model.delete(env, range(0, 20))
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert rep.status == "ok" and rep.failed == [] and rep.spark_apps == 0
    for site in REPLICAS:
        t = rep.targets[site]
        assert t.status == "ok"
        assert t.outcomes == {"FAST_FORWARD": 6}, t  # 3 batches x 2 partitions
        assert t.segments_copied == 6 and t.bytes_copied > 0
    leader = assert_replicas_equal_leader(env.catalog)
    assert triples(env.catalog) == model.snapshot() and leader.num_rows == 130
    assert_each_segment_once(env.catalog)
    assert_files_match_catalog(env)
    assert set(rep.safe_time_us) == set(REPLICAS)
    assert all(v == rep.end_us - 1 for v in rep.safe_time_us.values())

    before = catalog_state(env, skip=("rounds", "round_targets", "safe_times", "checkpoints"))
    again = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert again.round_id != rep.round_id and again.status == "ok" and again.spark_apps == 0
    for site in REPLICAS:
        t = again.targets[site]
        assert (t.outcomes, t.segments_copied, t.bytes_copied) == ({}, 0, 0)
    assert again.merges.items == 0
    text = str(again)
    assert text.count("nothing to offer; copied 0 segments, 0 bytes") == 2, text
    assert "spark applications: 0" in text
    assert catalog_state(env, skip=("rounds", "round_targets", "safe_times", "checkpoints")) == before
    assert all(again.safe_time_us[s] >= rep.safe_time_us[s] for s in REPLICAS)
    assert lease_count(env.catalog) == 0


def test_local_copies_carry_the_writers_crc64nvme_and_one_the_catalog_lacks_is_checked_by_sha256(env: Env) -> None:
    """The writer records each segment's CRC-64/NVME with its sha256; a fast-forward copies both into the
    replica's row (the local copy is checked by the CRC). A segment written before revision 0008 has no
    CRC-64/NVME: its copies are checked by sha256, so a damaged source is still INVALID and not registered."""
    model = Model()
    model.upsert(env, range(100), "a")
    with env.catalog.write() as s:  # the newest write of partition 1, as a catalog before 0008 holds it
        old = s.scalars(select(m.Segment).order_by(m.Segment.entry_id.desc())).first()
        assert old is not None
        old.crc64nvme = None
        old_id = old.segment_id
        written = s.scalar(select(func.count()).select_from(m.Segment))
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert rep.status == "ok" and all(t.segments_copied == written for t in rep.targets.values())
    with env.catalog.read() as s:
        rows = s.scalars(select(m.Segment)).all()
        placed = select(m.Placement.placement_id, m.Site.name).join(m.Site, m.Site.site_id == m.Placement.site_id)
        sites = {placement_id: name for placement_id, name in s.execute(placed)}
    assert len(rows) == written * (1 + len(REPLICAS))
    for row in rows:
        data = (env.site_dir(sites[row.placement_id]) / row.relpath).read_bytes()
        want = None if row.segment_id == old_id else crc64nvme_reference(data)
        assert row.crc64nvme == want, (row.segment_id, row.crc64nvme)
    assert_replicas_equal_leader(env.catalog)

    model.upsert(env, range(100, 101), "b")  # one more segment, then bit rot in the old one at the leader
    with env.catalog.write() as s:
        newest = s.scalars(select(m.Segment).order_by(m.Segment.entry_id.desc())).first()
        assert newest is not None
        newest.crc64nvme = None
        path = env.site_dir("primary") / newest.relpath
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    for site in REPLICAS:
        t = rep.targets[site]
        assert t.invalid and "does not match the catalog" in t.invalid[0].error, t
        assert not (env.site_dir(site) / newest.relpath).exists()


def test_interval_end_limits_what_is_offered_and_safe_time_never_decreases(env: Env) -> None:
    first, second = Model(), Model()
    first.upsert(env, range(40), "a")
    t = hlc.now_us()
    second.rows = dict(first.rows)
    second.upsert(env, range(30, 60), "b")
    rep = run_round(env.catalog, env.defs, TABLE, t, submit=no_spark)
    assert rep.end_us == t and rep.status == "ok"
    for site in REPLICAS:
        assert triples(env.catalog, site) == first.snapshot(), site  # nothing of the second write
        assert rep.targets[site].outcomes == {"FAST_FORWARD": 2}
        assert rep.safe_time_us[site] <= t
        # invariant 4: everything the leader holds up to the safe time is readable at the target
        assert sorted_table(env.catalog, site, as_of=rep.safe_time_us[site]).equals(
            sorted_table(env.catalog, as_of=rep.safe_time_us[site])
        )
    previous = safe_times(env.catalog)
    assert previous == rep.safe_time_us

    earlier = run_round(env.catalog, env.defs, TABLE, t - 10_000_000, submit=no_spark)
    assert earlier.status == "ok"
    assert all(earlier.targets[s].segments_copied == 0 for s in REPLICAS)
    assert earlier.safe_time_us == previous  # an earlier interval never lowers it
    assert safe_times(env.catalog) == previous
    for site in REPLICAS:
        assert triples(env.catalog, site) == first.snapshot()

    later = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    for site in REPLICAS:
        assert later.safe_time_us[site] > previous[site]
        assert triples(env.catalog, site) == second.snapshot()
    assert_replicas_equal_leader(env.catalog)


def test_a_round_with_nothing_to_do_launches_no_spark(env: Env) -> None:
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)  # empty table
    assert rep.spark_apps == 0 and rep.status == "ok" and rep.merges == CommitSummary()
    assert not (env.root / "data" / "work" / "rounds" / TABLE / str(rep.end_us) / "merge-manifest.json").exists()
    assert all(rep.targets[s].outcomes == {} for s in REPLICAS)
    write_batch(env.catalog, TABLE, batch(range(10), "a"))
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).spark_apps == 0
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert rep.spark_apps == 0 and rep.merges.items == 0
    orders = run_round(env.catalog, env.defs, "orders", submit=no_spark)  # another table, one replica
    assert orders.spark_apps == 0 and set(orders.targets) == {"dr"}


def test_corruption_in_transit_is_invalid_backs_off_and_a_retry_replicates(env: Env) -> None:
    written = write_batch(env.catalog, TABLE, batch(range(30), "a"))
    plan = plan_round(env.catalog, env.defs, TABLE)
    probe = corrupting_copier([_item_for_first_segment(env)])[0]  # the flipping link really corrupts
    assert not probe.ok and "does not match the catalog" in (probe.invalid or ""), probe
    assert not [p for p in (env.root / "scratch").rglob("*") if p.is_file()]

    report = fast_forward_target(env.catalog, env.defs, TABLE, "dr", plan.end_us, copier=corrupting_copier)
    assert report.status == "declined" and report.outcomes == {"INVALID": 2}, report  # one per partition
    assert (report.segments_copied, report.bytes_copied) == (0, 0), report  # nothing copied
    assert segment_rows(env.catalog, "dr") == []  # the corrupt segment was not registered (and none after it)
    dr_dir = env.site_dir("dr") / TABLE
    assert not dr_dir.exists() or not [p for p in dr_dir.rglob("*") if p.is_file()], list(dr_dir.rglob("*"))
    with env.catalog.read() as s:
        backoff = s.scalars(
            select(m.Backoff).join(m.Site, m.Site.site_id == m.Backoff.site_id).where(m.Site.name == "dr")
        ).one()
        assert backoff.failures == 1 and backoff.last_reason == "INVALID" and backoff.next_attempt_us > hlc.now_us()
    assert lease_count(env.catalog) == 0

    edge = fast_forward_target(env.catalog, env.defs, TABLE, "edge", plan.end_us)  # another target is unaffected
    assert edge.status == "ok" and edge.segments_copied == 2
    rep = commit_round(env.catalog, env.defs, TABLE, plan.end_us, merge_ran=False)
    assert rep.status == "partial" and rep.targets["dr"].status == "declined"
    # dr lacks the write in both partitions: its safe time stops just before the write's oldest version
    assert rep.safe_time_us == {"dr": min(seg.version for seg in written.segments) - 1, "edge": plan.end_us - 1}
    row = next(r for r in status_rows(env.catalog, TABLE) if r.target == "dr")
    assert row.declines == {"INVALID": 2} and "backing off (INVALID)" in row.note() and row.pending_segments == 2

    held_off = run_round(env.catalog, env.defs, TABLE, submit=no_spark)  # still inside the back-off window
    assert held_off.targets["dr"].status == "backoff" and held_off.targets["dr"].segments_copied == 0

    retry = run_round(env.catalog, env.defs, TABLE, reoffer=True, submit=no_spark)
    assert retry.status == "ok" and retry.targets["dr"].segments_copied == 2, str(retry)
    assert_replicas_equal_leader(env.catalog)
    assert_files_match_catalog(env)
    with env.catalog.read() as s:
        assert s.scalar(select(func.count()).select_from(m.Backoff)) == 0  # success clears the back-off


WINDOW_OF_2 = ORDERS_YAML.replace(
    "    replicas: [dr, edge]\n", "    replicas: [dr, edge]\n    policy: {max_incoming_segments: 2}\n"
)


@pytest.fixture
def window_of_2_env(catalog_url: str, tmp_path: Path) -> Iterator[Env]:
    """The usual environment, with a window of two segments in flight per replica of ``events``."""
    yield from env_fixture(tmp_path, catalog_url, WINDOW_OF_2)


def test_an_invalid_copy_in_a_full_window_stops_its_partition_once(window_of_2_env: Env) -> None:
    """Five segments per partition, a window of two: the first batch's copy is INVALID. The partition stops
    there for the round (the protocol's INVALID: retry later), once; it used to decide again at once, since
    the window had held offers back, and copy the same corrupt segment again without end."""
    env = window_of_2_env
    assert env.defs.policy(TABLE).max_incoming_segments == 2
    for k in range(5):
        write_batch(env.catalog, TABLE, batch(range(30), f"v{k}"))
    plan = plan_round(env.catalog, env.defs, TABLE)
    batches: list[int] = []

    def counting(items: list[CopyItem]) -> list[Any]:
        batches.append(len(items))
        if len(batches) > 10:
            raise AssertionError(f"the same offers copied again and again: {batches}")
        return corrupting_copier(items)

    report = fast_forward_target(env.catalog, env.defs, TABLE, "dr", plan.end_us, copier=counting)
    assert report.status == "declined" and report.outcomes == {"INVALID": 2}, report  # one per partition
    assert batches == [2, 2] and len(report.invalid) == 2, (batches, report.invalid)
    assert segment_rows(env.catalog, "dr") == [] and lease_count(env.catalog) == 0

    retry = run_round(env.catalog, env.defs, TABLE, reoffer=True, submit=no_spark)
    assert retry.status == "ok" and retry.targets["dr"].segments_copied == 10, str(retry)
    assert_replicas_equal_leader(env.catalog)


def _item_for_first_segment(env: Env) -> CopyItem:
    with env.catalog.read() as s:
        seg = s.scalars(select(m.Segment).order_by(m.Segment.entry_id).limit(1)).one()
    scratch = env.root / "scratch"
    scratch.mkdir(exist_ok=True)  # a root that exists: copies never create one
    return CopyItem(
        "primary", str(env.site_dir("primary")), "edge", str(scratch), seg.relpath, seg.byte_size, seg.sha256
    )


def test_corrupting_copier_through_run_round(env: Env) -> None:
    """The same through the copier given to run_round (both targets corrupt): nothing lands anywhere."""
    write_batch(env.catalog, TABLE, batch(range(10), "a"))
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark, copier=corrupting_copier)
    assert rep.status == "partial" and rep.failed == []
    assert {rep.targets[s].status for s in REPLICAS} == {"declined"}
    assert segment_rows(env.catalog, "dr") == [] and segment_rows(env.catalog, "edge") == []
    rep = run_round(
        env.catalog, env.defs, TABLE, reoffer=True, submit=no_spark, copier=lambda items: [copy_one(i) for i in items]
    )
    assert rep.status == "ok"
    assert_replicas_equal_leader(env.catalog)


def test_outage_fails_one_target_and_a_backfill_catches_up_in_order(outage_env: Env) -> None:
    env = outage_env
    model = Model()
    model.upsert(env, range(20), "a")
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).status == "ok"
    expected_at: list[list[tuple[str, int, str]]] = []
    ends: list[int] = []
    first_missing = []
    for n in range(3):
        first_missing.append(model.upsert(env, range(10 * n, 10 * n + 25), f"w{n}_"))
        if n == 1:
            model.delete(env, range(0, 5))
        ends.append(hlc.now_us())
        expected_at.append(model.snapshot())
    safe_before = safe_times(env.catalog)

    aside = take_down(env, "dr")
    # what the round records for dr: its root is a plain file, found when its identity marker is looked for
    dr_down = f"PathBlockedError: site dr: its root {env.site_dir('dr')} is a plain file, not a directory"
    for end, expected in zip(ends, expected_at, strict=True):
        rep = run_round(env.catalog, env.defs, TABLE, end, submit=no_spark)
        assert rep.status == "failed" and rep.failed == ["dr"], str(rep)
        assert rep.targets["dr"].status == "failed" and rep.targets["edge"].status == "ok"
        assert (rep.targets["dr"].error or "").startswith(dr_down), str(rep)
        assert triples(env.catalog, "edge") == expected  # edge proceeds interval by interval
        # dr's safe time may reach the instant before the oldest write it lacks, never further (nor back)
        assert safe_before["dr"] <= rep.safe_time_us["dr"] < first_missing[0]
        assert ": failed" in str(rep).splitlines()[0]
    with pytest.raises(TargetUnreachable, match="target dr"):
        fast_forward_target(env.catalog, env.defs, TABLE, "dr", ends[-1])
    with env.catalog.read() as s:
        backoff = s.scalars(select(m.Backoff)).one()
        assert backoff.failures == 4 and backoff.last_reason.startswith("unreachable")
    row = next(r for r in status_rows(env.catalog, TABLE) if r.target == "dr")
    assert row.last_status == "failed" and row.last_round_text().endswith("failed") and row.pending_segments > 0
    code, out, err = cli(env, "status", TABLE)
    assert code == 0, err
    dr_line = next(line for line in out.splitlines() if line.split()[:2] == [TABLE, "dr"])
    assert "failed" in dr_line, out
    assert not list(Path(aside).rglob(".*tmp*"))  # no partial copy left behind

    bring_up(env, "dr", aside)
    last_safe = safe_times(env.catalog)["dr"]
    for end, expected in zip(ends, expected_at, strict=True):  # the backfill: the same intervals, in order
        rep = run_round(env.catalog, env.defs, TABLE, end, submit=no_spark)
        assert rep.status == "ok", str(rep)
        assert triples(env.catalog, "dr") == expected
        safe = rep.safe_time_us["dr"]
        assert last_safe <= safe <= end
        last_safe = safe
        leader_then = sorted_table(env.catalog, as_of=safe)
        assert sorted_table(env.catalog, "dr", as_of=safe).equals(leader_then)
        assert_safe_time_honest(env.catalog, TABLE, "dr", safe)
        assert_acks_are_prefixes(env.catalog, TABLE)
    round_until_idle(env)
    assert_replicas_equal_leader(env.catalog)
    assert_each_segment_once(env.catalog)
    assert_files_match_catalog(env)
    assert lease_count(env.catalog) == 0


def test_fast_forward_and_commit_twice_change_nothing(env: Env) -> None:
    model = Model()
    model.upsert(env, range(30), "a")
    model.upsert(env, range(10, 40), "b")
    plan = plan_round(env.catalog, env.defs, TABLE)
    first = fast_forward_target(env.catalog, env.defs, TABLE, "dr", plan.end_us)
    assert first.segments_copied == 4
    after_first = catalog_state(env)
    second = fast_forward_target(env.catalog, env.defs, TABLE, "dr", plan.end_us)
    assert second.status == "ok" and second.segments_copied == 0 and second.outcomes == {}
    assert catalog_state(env) == after_first
    again = fast_forward_target(env.catalog, env.defs, TABLE, "dr", plan.end_us, reoffer=True)
    assert again.segments_copied == 0 and again.outcomes == {"SEGMENT_EXISTS": 4}
    assert catalog_state(env) == after_first

    fast_forward_target(env.catalog, env.defs, TABLE, "edge", plan.end_us)
    one = commit_round(env.catalog, env.defs, TABLE, plan.end_us, merge_ran=False)
    after_commit = catalog_state(env)
    two = commit_round(env.catalog, env.defs, TABLE, plan.end_us, merge_ran=False)
    assert catalog_state(env) == after_commit
    assert two.advanced == []  # the repeat moved no safe time: no Asset event to announce
    same = {"round_id": 0, "advanced": [], "duration_s": None}  # this commit's own facts
    assert replace(one, **same) == replace(two, **same)
    with env.catalog.read() as s:
        assert s.scalar(select(func.count()).select_from(m.Round)) == 1
        assert s.scalar(select(func.count()).select_from(m.RoundTarget)) == 2
    assert triples(env.catalog, "dr") == triples(env.catalog, "edge") == model.snapshot()
    assert_each_segment_once(env.catalog)


def _fast_forward_in_thread(
    url: str, env: Env, end: int, barrier: threading.Barrier, results: list[Any], i: int
) -> None:
    cat = Catalog(url)  # its own engine and connections, as a second worker would have
    try:
        barrier.wait()
        results[i] = fast_forward_target(cat, env.defs, TABLE, "dr", end, reoffer=True)
    except Exception as exc:  # reported by the test
        results[i] = exc
    finally:
        cat.dispose()


@pytest.mark.parametrize("when", ["before the decision", "during the decision"])
def test_a_lease_held_elsewhere_stops_the_batch_before_it_and_no_lease_of_this_round_remains(
    env: Env, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """A segment another round holds at the target stops the batch there (INFLIGHT), what precedes it is
    committed, and this round keeps none of its leases past it. Seen before the decision, the offer meets
    it; taken while the decision runs (a concurrent round on PostgreSQL: simulated by hiding it from the
    decision's read), the batch's leases, taken in one statement, lose it. Once the other lease is gone, the
    next round brings the rest."""
    model = Model()
    for k in range(4):  # keys below the first split point: four segments in the first partition
        model.upsert(env, range(10 * k, 10 * k + 5), f"k{k}_")
    pid = partitions(env.catalog)[0]
    with env.catalog.read() as s:
        lead = s.scalars(select(m.Partition.leader_placement_id).where(m.Partition.partition_id == pid)).one()
        order = list(
            s.scalars(select(m.Segment.segment_id).where(m.Segment.placement_id == lead).order_by(m.Segment.entry_id))
        )
    assert len(order) == 4
    dr = placement_id(env.catalog, "dr", pid)
    with env.catalog.write() as s:
        s.add(m.Lease(target_placement_id=dr, segment_id=order[2], holder="another-round", expires_us=hlc.FOREVER_US))

    if when == "during the decision":
        visible = ls.in_flight
        monkeypatch.setattr(ls, "in_flight", lambda s, target, now: {} if target == dr else visible(s, target, now))
    report = fast_forward_target(env.catalog, env.defs, TABLE, "dr")
    monkeypatch.undo()
    assert report.outcomes.get("INFLIGHT") == 1, report
    held = {seg for p, seg, _h, _r in segment_rows(env.catalog, "dr") if p == pid}
    assert held == set(order[:2])  # the batch stopped before the segment leased elsewhere
    with env.catalog.read() as s:
        leases = s.execute(select(m.Lease.target_placement_id, m.Lease.segment_id, m.Lease.holder)).all()
    assert leases == [(dr, order[2], "another-round")]
    assert_files_match_catalog(env)

    with env.catalog.write() as s:
        s.execute(delete(m.Lease))
    again = fast_forward_target(env.catalog, env.defs, TABLE, "dr")
    assert again.status == "ok", again
    assert {seg for p, seg, _h, _r in segment_rows(env.catalog, "dr") if p == pid} == set(order)
    assert lease_count(env.catalog) == 0


@pytest.mark.postgres
@pytest.mark.parametrize("rounds", ["same round", "two rounds"])
def test_two_concurrent_fast_forwards_commit_each_segment_once(pg_server: str, tmp_path: Path, rounds: str) -> None:
    """Two task runs at once against one target, on PostgreSQL (row locks, separate connections): the same
    round run twice (a retried task racing its first try) or two rounds whose leases collide (INFLIGHT)."""
    urls = pg_schema_url(pg_server)
    url = next(urls)
    try:
        env = make_env(tmp_path, url)
        model = Model()
        for n in range(4):
            for k in range(3):
                model.upsert(env, range(100 * n + 10 * k, 100 * n + 10 * k + 15), f"r{n}k{k}_")
            plan = plan_round(env.catalog, env.defs, TABLE)
            ends = [plan.end_us, plan.end_us if rounds == "same round" else hlc.now_us()]
            barrier = threading.Barrier(2)
            results: list[Any] = [None, None]
            threads = [
                threading.Thread(target=_fast_forward_in_thread, args=(url, env, ends[i], barrier, results, i))
                for i in range(2)
            ]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            assert all(not isinstance(r, Exception) for r in results), results
            copied = sum(r.segments_copied for r in results)
            assert copied >= 6, results  # 3 writes x 2 partitions, each committed by one of the two (or both)
            if rounds == "two rounds":  # a lease held by the other round is INFLIGHT, never a second copy
                assert copied == 6, results
            assert_each_segment_once(env.catalog, ["dr"])
            assert triples(env.catalog, "dr") == model.snapshot(), n
            assert_replicas_equal_leader(env.catalog, ["dr"])
            assert lease_count(env.catalog) == 0
        with env.catalog.read() as s:
            dup = s.execute(
                select(m.Segment.placement_id, m.Segment.segment_id, func.count())
                .group_by(m.Segment.placement_id, m.Segment.segment_id)
                .having(func.count() > 1)
            ).all()
            assert dup == []
        assert_files_match_catalog(env)
        env.catalog.dispose()
    finally:
        urls.close()


# -- the command line -----------------------------------------------------------------------------------------


def test_cli_round_and_status(env: Env) -> None:
    model = Model()
    model.upsert(env, range(25), "a")
    code, out, err = cli(env, "status", TABLE)
    assert code == 0, err
    assert len([line for line in out.splitlines() if line.startswith(f"{TABLE} ")]) == 2  # one row per target
    assert " 2 " in next(line for line in out.splitlines() if line.split()[:2] == [TABLE, "dr"])  # pending segs

    code, out, err = cli(env, "round", TABLE, "--target", "edge")
    assert code == 0, err
    assert out.splitlines()[0].startswith("round ") and out.splitlines()[0].endswith(": ok")
    assert "  edge: ok (FAST_FORWARD 2; copied 2 segments" in out and "\n  dr:" not in out
    assert "spark applications: 0" in out
    assert triples(env.catalog, "edge") == model.snapshot() and triples(env.catalog, "dr") == []

    code, out, err = cli(env, "round", TABLE, "--json")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["status"] == "ok" and rep["targets"]["dr"]["segments_copied"] == 2 and rep["spark_apps"] == 0
    assert rep["targets"]["edge"]["segments_copied"] == 0
    assert_replicas_equal_leader(env.catalog)

    code, out, err = cli(env, "status", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["splits"] == []
    rows = {(r["table"], r["target"]): r for r in doc["replication"]}
    assert set(rows) == {(TABLE, "dr"), (TABLE, "edge"), ("orders", "dr")}
    for site in REPLICAS:
        r = rows[(TABLE, site)]
        assert r["pending_segments"] == 0 and r["safe_time_us"] == rep["safe_time_us"][site]
        assert r["last_status"] == "ok" and r["last_round"].endswith(" ok")
    assert rows[("orders", "dr")]["safe_time_us"] is None

    aside = take_down(env, "edge")
    model.upsert(env, range(25, 30), "b")
    code, out, err = cli(env, "round", TABLE)
    assert code == 1
    assert err.strip().splitlines() == [f"segrep: error: round of {TABLE}: target(s) edge failed (re-run to retry)"]
    assert "dr: ok" in out and "edge: failed" in out
    bring_up(env, "edge", aside)


ROUND_BAD_CASES = [
    (["round", "nope"], "unknown table 'nope'"),
    (["round", "../etc"], "invalid table name '../etc'"),
    (["round", TABLE, "--target", "mars"], "unknown site 'mars'"),
    (["round", TABLE, "--target", "primary"], "site 'primary' holds no replica of events"),
    (["round", TABLE, "--target", "a/b"], "invalid site name 'a/b'"),
    (["round", TABLE, "--until", "yesterday-ish"], "--until 'yesterday-ish' is not an ISO-8601 time"),
    (["round", TABLE, "--until", "2026-13-45"], "--until '2026-13-45' is not an ISO-8601 time"),
    (["status", "nope"], "unknown table 'nope'"),
]


@pytest.mark.parametrize(("args", "message"), ROUND_BAD_CASES, ids=[" ".join(c[0][1:]) for c in ROUND_BAD_CASES])
def test_cli_round_bad_input_is_one_line_and_writes_nothing(env: Env, args: list[str], message: str) -> None:
    write_batch(env.catalog, TABLE, batch(range(5), "a"))
    before = catalog_state(env, skip=())
    code, out, err = cli(env, *args)
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("segrep: error: ") and message in err, err
    assert "Traceback" not in out + err
    assert catalog_state(env, skip=()) == before
    assert not (env.root / "data" / "work").exists()


def test_outage_status_rows_name_the_failure(env: Env) -> None:
    """Without a zero retry delay the failed target is also reported as backing off."""
    write_batch(env.catalog, TABLE, batch(range(5), "a"))
    aside = take_down(env, "dr")
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert rep.failed == ["dr"]
    row = next(r for r in status_rows(env.catalog, TABLE) if r.target == "dr")
    assert row.note().startswith("backing off (unreachable") and row.last_status == "failed"
    bring_up(env, "dr", aside)
    held = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert held.targets["dr"].status == "backoff"
    retry = run_round(env.catalog, env.defs, TABLE, reoffer=True, submit=no_spark)
    assert retry.status == "ok"
    assert_replicas_equal_leader(env.catalog)


def test_a_target_held_back_by_its_back_off_fails_the_round_until_a_retry_copies(env: Env) -> None:
    """dr was down: the next round does not try it (back-off) while it lacks the segments, so the round does
    not pass (a run that went green while dr still lacked 5 segments misled its operator); the message says
    until when and how to retry now. A retry (a cleared task) is not held back: it copies what dr lacks, and
    the round passes."""
    write_batch(env.catalog, TABLE, batch(range(5), "a"))
    aside = take_down(env, "dr")
    steps = RoundSteps(env.catalog, env.defs, TABLE, submit=no_spark)
    failed = steps.run()
    assert failed.report.failed == ["dr"] and failed.failure() is not None
    bring_up(env, "dr", aside)

    held = steps.run()
    dr = next(t for t in held.targets if t.site == "dr")
    assert dr.status == "backoff" and dr.segments_copied == 0 and dr.pending_segments >= 1
    assert not held.report.has_problems  # not a failure of the site: the round chose not to try it
    failure = held.failure() or ""
    assert f"round of {TABLE}: dr was not tried and lacks {dr.pending_segments} segment(s)" in failure, failure
    assert "no attempt before 20" in failure and f"segrep round {TABLE} --target dr --reoffer" in failure, failure
    with pytest.raises(RoundProblems, match="clear the failed task"):
        held.raise_on_problems()
    edge = next(t for t in held.targets if t.site == "edge")
    assert edge.status == "ok" and edge.pending_segments == 0  # edge is not held back by dr's back-off
    with pytest.raises(TargetHeldBack, match="dr was not tried: backing off"):  # a task per target fails alone
        steps.copy(steps.plan(), "dr")

    planned = steps.plan()
    retried = steps.finish(planned, retry=True)  # what a cleared (or retried) task runs
    dr = next(t for t in retried.targets if t.site == "dr")
    assert dr.status == "ok" and dr.segments_copied >= 1 and dr.pending_segments == 0, str(retried)
    assert retried.failure() is None
    assert_replicas_equal_leader(env.catalog)
    with env.catalog.read() as s:
        assert s.scalar(select(func.count()).select_from(m.Backoff)) == 0  # success clears the back-off


def test_a_retried_target_reports_every_copy_of_its_round(env: Env) -> None:
    """An attempt that fails half-way registers what it copied; the retry (the same round, as Airflow retries
    the task) copies only the rest. The round's report, its asset events and byte metrics count both: the
    retry's copies alone once made a round that moved 2 segments report 1."""
    write_batch(env.catalog, TABLE, batch(range(30), "a"))  # one segment in each partition
    plan = plan_round(env.catalog, env.defs, TABLE)
    calls: list[int] = []

    def first_then_down(items: list[CopyItem]) -> list[Any]:
        calls.append(len(items))
        if len(calls) > 1:
            raise TargetUnreachable(OSError(errno.EHOSTUNREACH, "link down"))
        return [copy_one(i) for i in items]

    with pytest.raises(TargetUnreachable, match="link down"):
        fast_forward_target(env.catalog, env.defs, TABLE, "dr", plan.end_us, copier=first_then_down)
    assert len(segment_rows(env.catalog, "dr")) == 1  # the first partition's copy is registered
    # reoffer: past the back-off the failure started (a retry after its delay); the held segment is answered
    retry = fast_forward_target(env.catalog, env.defs, TABLE, "dr", plan.end_us, reoffer=True)
    assert retry.status == "ok" and retry.segments_copied == 1, retry  # this attempt's own copy
    assert retry.outcomes == {"SEGMENT_EXISTS": 1, "FAST_FORWARD": 1}, retry
    rep = commit_round(env.catalog, env.defs, TABLE, plan.end_us, merge_ran=False)
    dr = rep.targets["dr"]
    assert (dr.status, dr.segments_copied) == ("ok", 2), str(rep)
    with env.catalog.read() as s:
        held = s.scalars(
            select(m.Segment.byte_size)
            .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
            .join(m.Site, m.Site.site_id == m.Placement.site_id)
            .where(m.Site.name == "dr")
        ).all()
    assert dr.bytes_copied == sum(held) == dr.bytes_from["primary"] > retry.bytes_copied
    assert dr.outcomes == retry.outcomes  # the protocol's answers are the last attempt's
