"""Model-based test of the rounds engine with real files, a real catalog (SQLite) and Spark merges in-process.

A hypothesis state machine interleaves, on a two-partition table replicated primary -> dr, edge:
- writes (upserts and deletes of a few of ten keys) at the current leader of each partition;
- rounds, each with at most one fault: a crash at a named fault point (``SEGREP_FAULTS``), a copier that
  corrupts bytes in transit to one site, one site made unreachable (its directory replaced by a file), or
  one site lost once it has received one copy (the rest of its batch fails: two segments are in flight per
  receiver, so a catch-up takes several batches).
  A crashed round is retried with the same interval end next time, as Airflow retries a failed task;
- leader changes (epoch + 1, done directly in the catalog), which leave forks for the next rounds to merge;
- a split of the first partition (sync or async, at key 2 or 3) started at some step and advanced one pass
  (plan, Spark job, commit, SPLIT_FINALIZE or UNLOAD_FINAL when due) at others, with writes, rounds, faults
  and leader changes (of the parent or of a child) in between.

Merges run ``segrep.spark.jobs.run_manifest`` in the session's SparkSession (no spark-submit start-up).

After every step (DESIGN section 9): committed files match their sha256 (1), the stored safe time of every
site never decreases (4) and every write the leaders hold at or before it is readable at that site (4), and
the acks of each replica over the leader's visible chain form a prefix of the offer order (5: nothing was
taken before its predecessor). At the end, with faults off, the split is finished and rounds run until idle;
then the leaders hold exactly the last-writer-wins replay of every write ever made (2) and every replica
equals them (3).
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.core import hlc
from segrep.core.errors import NotFoundError, RefusedError, SegrepError
from segrep.core.states import SplitState
from segrep.data import writer
from segrep.data.reader import read_table
from segrep.data.writer import WriteResult, write_batch
from segrep.failover.assess import PartitionLoss
from segrep.failover.promote import Cut, FailoverReport, failover
from segrep.failover.switchover import switchover
from segrep.replication.orchestrator import run_round
from segrep.replication.reports import RoundReport
from segrep.replication.rollback import list_rollbacks
from segrep.replication.unload import finish_unloaded
from segrep.split.workflow import start_split
from segrep.storage.transport import Copier, CopyItem, CopyOutcome, copy_one, local_copier
from tests.support.checks import (
    assert_acks_are_prefixes,
    assert_each_segment_once,
    assert_files_match_catalog,
    chain_before_cut,
    leaders,
    lease_count,
    partitions,
)
from tests.support.env import KV_YAML, make_env
from tests.support.machines import check_safe_times, faulted_round, run_machine, run_split_pass
from tests.support.rounds import bring_up, corrupting_copier, set_leader, take_down
from tests.support.spark import spark_submit_in

pytestmark = pytest.mark.spark

TABLE = "kv"
# Two segments in flight per receiver: a catch-up of a few segments already takes several batches
MODEL_YAML = KV_YAML.replace(
    "policy: {retry_delay_s: 0}", "policy: {retry_delay_s: 0, on_return: merge, max_incoming_segments: 2}"
)
SITES = ("primary", "dr", "edge")
SITE_IDS = {"primary": 1, "dr": 2, "edge": 3}
KEYS = range(10)
SPLIT = 5
POINTS = ("before_copy", "after_copy_before_commit", "after_commit_before_ack", "in_merge_job", "before_checkpoint")
FAULTS = ("none", "none", *POINTS, "corrupt", "down", "lost")


@dataclass(frozen=True)
class Written:
    """One key of one write batch, as the writer reported it: what a rollback file must reproduce exactly."""

    key: int
    version: int
    origin: int
    deleted: bool
    value: str | None
    partition_id: int
    segment_id: str

    @property
    def row(self) -> tuple[int, int, int, bool, str | None]:
        return (self.key, self.version, self.origin, self.deleted, self.value)


def replay(writes: list[Written]) -> dict[int, tuple[int, int, bool, str]]:
    """Last writer wins over ``writes``: key -> (version, origin, deleted, value)."""
    out: dict[int, tuple[int, int, bool, str]] = {}
    for w in writes:
        old = out.get(w.key)
        if old is None or (w.version, w.origin) > old[:2]:
            out[w.key] = (w.version, w.origin, w.deleted, w.value or "")
    return out


def corrupting_to(site: str) -> Any:
    def copy(items: list[CopyItem]) -> list[CopyOutcome]:
        return [corrupting_copier([i])[0] if i.target == site else copy_one(i) for i in items]

    return copy


def lost_to(site: str) -> Copier:
    """A copier (for one round) that loses ``site`` once it has made one copy there: the rest of that batch and
    every later one to it fail as an unreachable target does (the other sites' copies are made)."""
    made = 0

    def copy(items: list[CopyItem]) -> list[CopyOutcome]:
        nonlocal made
        out = []
        for item in items:
            if item.target == site and made:
                out.append(CopyOutcome(item.relpath, False, error=f"{site} lost"))
                continue
            made += item.target == site
            out.extend(local_copier([item]))
        return out

    return copy


class RoundsMachine(RuleBasedStateMachine):
    spark: ClassVar[Any] = None
    stats: ClassVar[Counter[str]] = Counter()
    DEFINITIONS: ClassVar[str] = MODEL_YAML
    FAILBACK: ClassVar[bool] = False  # the failover machine below: no direct leader changes, no split

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="segrep-model-"))
        self.env = make_env(self.tmp, f"sqlite:///{self.tmp}/catalog.db", self.DEFINITIONS)
        self.pids = partitions(self.env.catalog, TABLE)
        assert len(self.pids) == 2
        self.split_id: int | None = None
        self.expected: dict[int, tuple[int, int, bool, str]] = {}  # key -> winning (version, origin, deleted, v)
        self.writes: list[Written] = []  # every write ever made, in order
        self.away: dict[str, Path] = {}  # sites down across steps (the failover machine's outages)
        self.safe: dict[str, int] = {}
        # keys with a write a failover gave up (``on_return: merge``): no safe time covers it until merged, and
        # the merge output reaches each site in a later round; checked again at quiescence (``kept``)
        self.unmerged: set[int] = set()
        self.pending_end: int | None = None  # a crashed round's interval, retried next
        self.counter = 0
        self.submit = spark_submit_in(self.spark)
        self.log: list[str] = []

    def pid_of(self, key: int) -> int:
        """The partition that takes writes of ``key`` now (a split's children after SPLIT_FINALIZE)."""
        with self.env.catalog.read() as s:
            parts = q.serving_partitions(s, q.table_info(s, TABLE))
        return next(p.partition_id for p in reversed(parts) if p.begin_key is None or p.begin_key <= key)

    def leader_site(self, pid: int) -> str:
        with self.env.catalog.read() as s:
            part = s.get(m.Partition, pid)
            return s.scalars(
                select(m.Site.name)
                .join(m.Placement, m.Placement.site_id == m.Site.site_id)
                .where(m.Placement.placement_id == part.leader_placement_id)
            ).one()

    def live_pids(self) -> list[int]:
        """Partitions that have a leader to change: not a split parent past SPLIT_FINALIZE."""
        with self.env.catalog.read() as s:
            return sorted(
                s.scalars(
                    select(m.Partition.partition_id).where(m.Partition.state.in_(["LIVE", "SPLITTING", "LOADING"]))
                )
            )

    # -- rules ---------------------------------------------------------------------------------------------

    def writable(self) -> bool:
        """Writes go to the leaders: none while a leader's site is down."""
        return not self.away or not {self.leader_site(pid) for pid in self.live_pids()} & set(self.away)

    @precondition(lambda self: self.writable())
    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True), deleting=st.booleans())
    def write(self, keys: list[int], deleting: bool) -> None:
        self.counter += 1
        rows = pa.table({"k": pa.array(keys, pa.int64()), "v": [f"w{self.counter}k{k}" for k in keys]})
        result = write_batch(self.env.catalog, TABLE, rows.select(["k"]) if deleting else rows, delete=deleting)
        self.record(keys, deleting, result)

    def record(self, keys: list[int], deleting: bool, result: WriteResult) -> None:
        version = {seg.partition_id: (seg.version, SITE_IDS[seg.site], seg.segment_id) for seg in result.segments}
        for k in keys:
            pid = self.pid_of(k)
            v, origin, segment_id = version[pid]
            assert SITE_IDS[self.leader_site(pid)] == origin  # written at the partition's leader
            value = None if deleting else f"w{self.counter}k{k}"
            self.writes.append(Written(k, v, origin, deleting, value, pid, segment_id))
            old = self.expected.get(k)
            if old is None or (v, origin) > old[:2]:
                self.expected[k] = (v, origin, deleting, f"w{self.counter}k{k}")
        self.log.append(f"write {keys} delete={deleting}")

    @rule(fault=st.sampled_from(FAULTS), site=st.sampled_from(SITES))
    def replication_round(self, fault: str, site: str) -> None:
        end = self.pending_end or hlc.now_us()
        self.log.append(f"round end={end} fault={fault} site={site} retry={self.pending_end is not None}")
        copier = corrupting_to(site) if fault == "corrupt" else lost_to(site) if fault == "lost" else local_copier
        report = faulted_round(
            self.env,
            TABLE,
            end,
            fault,
            site,
            points=POINTS,
            stats=self.stats,
            submit=self.submit,
            copier=copier,
            away=self.away,
            failure="Spark job merge failed|merge job .* failed in process",  # on Spark, or in process when small
        )
        if report is None:
            self.pending_end = end
            return
        self.pending_end = None
        self.log.append("  " + str(report).replace("\n", "\n  "))
        self.count(report)
        for done in finish_unloaded(self.env.catalog, self.env.defs, TABLE):  # as the DAG's commit task does
            self.stats[f"split {done.state} after a round"] += 1
        if fault == "none" and not self.away:
            assert report.status in ("ok", "partial"), str(report)
        if report.failed:
            assert fault in ("down", "lost") or self.away, str(report)

    @precondition(lambda self: not self.FAILBACK)
    @rule(
        site=st.sampled_from(SITES),
        which=st.sampled_from(("first", "second", "both")),
        then_write=st.lists(st.sampled_from(KEYS), max_size=3, unique=True),
    )
    def leader_change(self, site: str, which: str, then_write: list[int]) -> None:
        """A new leader (epoch + 1), often writing at once: what the old leader had not replicated, and what
        the new one writes before the next round, are the forks the rounds must merge."""
        live = self.live_pids()
        pids = {"first": live[:1], "second": live[1:2], "both": live}[which]
        set_leader(self.env.catalog, site, TABLE, pids)
        self.log.append(f"leader of {pids} -> {site}")
        if then_write:
            self.write(then_write, False)

    @precondition(lambda self: not self.FAILBACK)
    @rule(site=st.sampled_from(SITES), then_write=st.lists(st.sampled_from(KEYS), max_size=3, unique=True))
    def failover_to(self, site: str, then_write: list[int]) -> None:
        """`segrep failover` (at latest, `on_return: merge`): every partition's leader moves with an epoch
        bump in one transaction; what the old leader alone held comes back as a fork the rounds merge, so the
        replay of every write stays the answer. A refusal (the site leads already, or cannot lead) changes
        nothing."""
        before = self.leaders()
        try:
            report = failover(self.env.catalog, self.env.defs, [TABLE], to=site)
        except (RefusedError, NotFoundError) as exc:
            assert self.leaders() == before, exc
            self.stats["failover refused"] += 1
            return
        (move,) = report.moves
        after = self.leaders()
        assert {after[pid][0] for pid in move.assessment.moving} == {site}
        assert all(after[pid][1] == before[pid][1] + 1 for pid in move.assessment.moving)
        self.gave_up(move.assessment.loss)
        self.stats["failover"] += 1
        self.log.append(f"failover -> {site}: loss {move.assessment.segments_lost} segment(s)")
        if then_write:
            self.write(then_write, False)

    @precondition(lambda self: not self.away)
    @rule(site=st.sampled_from(SITES))
    def switchover_to(self, site: str) -> None:
        """`segrep switchover`: writes pause, rounds drain `site`, the leaders move with nothing lacking, or on
        a refusal or time-out nothing changes and writes resume."""
        before = self.leaders()
        try:
            report, _drained = switchover(
                self.env.catalog, self.env.defs, [TABLE], site, timeout_s=20, submit=self.submit
            )
        except (RefusedError, NotFoundError, SegrepError) as exc:
            assert self.leaders() == before, exc
            self.stats["switchover refused or timed out"] += 1
        else:
            assert all(m_.assessment.loss == [] for m_ in report.moves)  # RPO 0
            self.stats["switchover"] += 1
            self.log.append(f"switchover -> {site}")
        with self.env.catalog.read() as s:
            assert set(s.scalars(select(m.Partition.paused_us))) == {None}  # writes resumed either way

    def leaders(self) -> dict[int, tuple[str, int]]:
        return leaders(self.env.catalog, TABLE)

    @precondition(lambda self: self.split_id is None and not self.FAILBACK)
    @rule(at=st.sampled_from([2, 3]), is_async=st.booleans())
    def split_start(self, at: int, is_async: bool) -> None:
        """Split the first partition (keys 0-4) while everything else goes on (EventQL 3.8)."""
        ref = start_split(self.env.catalog, TABLE, self.pids[0], [at], is_async=is_async)
        self.split_id = ref.split_id
        self.stats[f"split {'async' if is_async else 'sync'}"] += 1
        self.log.append(f"split {self.pids[0]} at {at} async={is_async} -> {ref.children}")

    @precondition(lambda self: self.split_id is not None)
    @rule()
    def split_pass(self) -> None:
        """One pass of the split: plan, the Spark job, commit, then SPLIT_FINALIZE or UNLOAD_FINAL if due."""
        assert self.split_id is not None
        plan = run_split_pass(self.env, self.split_id, self.submit, self.stats)
        if plan is None:
            return
        self.log.append(f"split pass {plan.phase}: {plan.rewrites} rewrites, {plan.merges} merges")

    def count(self, report: RoundReport) -> None:
        merges = report.merges
        self.stats["rounds"] += 1
        self.stats["merges committed"] += merges.committed
        self.stats["merge rows kept"] += merges.rows_merged
        for target in report.targets.values():
            for outcome, n in (target.outcomes or {}).items():
                self.stats[outcome] += n
            self.stats[f"target {target.status}"] += 1

    # -- invariants ------------------------------------------------------------------------------------------

    @invariant()
    def committed_files_never_change(self) -> None:
        assert_files_match_catalog(self.env, self.away)

    @invariant()
    def safe_time_never_decreases_and_is_honest(self) -> None:
        """Invariant 4. What "readable" can mean with forks: a merge keeps only the winners, so a fork's write
        that a later write superseded is nowhere (not even at the leader) as of its time. The check is
        therefore: every key whose last write of all (the model's replay) is at or before a site's safe
        time resolves at that site to exactly that write (tombstones included)."""
        self.safe = check_safe_times(self.env.catalog, TABLE, self.checked(), self.safe, self.log, self.away)

    def checked(self) -> dict[int, tuple[int, int, bool, str]]:
        """The keys the safe-time invariant checks after each step, with their last write: all of them here,
        but those a failover gave up (``unmerged``)."""
        return {k: w for k, w in self.expected.items() if k not in self.unmerged}

    def gave_up(self, loss: Sequence[PartitionLoss]) -> None:
        """The keys a failover's loss may hold (every write of those partitions from its oldest version on):
        outside every safe time until merged (DESIGN 11)."""
        for part in loss:
            assert part.min_version is not None
            self.unmerged |= {
                w.key for w in self.writes if w.partition_id == part.partition_id and w.version >= part.min_version
            }

    @invariant()
    def acks_follow_offer_order(self) -> None:
        assert_acks_are_prefixes(self.env.catalog, TABLE)

    # -- quiescence --------------------------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            self.quiesce()
        finally:
            self.env.catalog.dispose()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def kept(self) -> dict[int, tuple[int, int, bool, str]]:
        """What the leaders must hold at the end: here the replay of every write (nothing is set aside)."""
        return self.expected

    def quiesce(self) -> None:
        for site, aside in list(self.away.items()):
            bring_up(self.env, site, aside)
            del self.away[site]
        if self.split_id is not None:
            for _ in range(4):  # a pass can meet a root that moved (a leader change): the next one re-plans
                self.split_pass()
        reports = []
        for _ in range(10):
            retry, self.pending_end = self.pending_end, None
            report = run_round(self.env.catalog, self.env.defs, TABLE, retry, submit=self.submit)
            finish_unloaded(self.env.catalog, self.env.defs, TABLE)  # once the replicas hold the children
            reports.append(report)
            self.count(report)
            self.log.append("  quiesce " + str(report).replace("\n", "\n  "))
            busy = any(t.outcomes or t.status != "ok" for t in report.targets.values())
            if not busy and not report.merges.items and retry is None:  # idle up to now
                break
        else:
            pytest.fail("no idle round:\n" + "\n".join(self.log + [str(r) for r in reports[-3:]]))
        if self.split_id is not None:
            with self.env.catalog.read() as s:
                assert s.get(m.Split, self.split_id).state == SplitState.DONE, "\n".join(self.log)
        kept = self.kept()
        self.safe = check_safe_times(self.env.catalog, TABLE, kept, self.safe, self.log)  # every key, now
        self.acks_follow_offer_order()
        want = sorted((k, v) for k, (_ver, _o, deleted, v) in kept.items() if not deleted)
        leader = read_table(self.env.catalog, TABLE).sort_by("k")
        assert list(zip(leader["k"].to_pylist(), leader["v"].to_pylist(), strict=True)) == want, "\n".join(self.log)
        for site in SITES:
            got = read_table(self.env.catalog, TABLE, site).sort_by("k")
            assert got.equals(leader), (site, got.to_pylist(), leader.to_pylist(), "\n".join(self.log))
        assert_each_segment_once(self.env.catalog, SITES)
        assert lease_count(self.env.catalog) == 0
        with self.env.catalog.read() as s:  # every current target's last attempt succeeded
            leaders = {self.leader_site(pid) for pid in self.live_pids()}
            targets = {SITE_IDS[site] for site in SITES for leader in leaders if site != leader}
            backoffs = s.scalars(select(m.Backoff.site_id)).all()
            assert not targets & set(backoffs), backoffs


def test_rounds_state_machine(spark: Any) -> None:
    RoundsMachine.spark = spark
    run_machine(RoundsMachine, "SEGREP_MODEL_EXAMPLES", 12)


def test_a_replica_links_again_a_major_it_lists_off_its_chain(spark: Any) -> None:
    """Found by the state machine (one 30-example run in six): primary, a follower, fast-forwarded a major of
    dr (leader after a failover) while edge was down; the failover to edge made primary follow a chain that
    lacks dr's major and restarts from edge's newest major, which primary still listed from before, off its
    chain. The fast-forward skipped it as already held, left the root on dr's major, and every later segment
    of the batch conflicted: INFLIGHT round after round, and the rounds never went idle. The steps as the
    machine shrank them; the teardown quiesces and checks every invariant."""
    RoundsMachine.spark = spark
    state = RoundsMachine()
    steps: list[Callable[[], None]] = [
        lambda: state.switchover_to(site="primary"),
        lambda: state.switchover_to(site="primary"),
        lambda: state.write(deleting=False, keys=[1, 9, 6]),
        lambda: state.leader_change(site="dr", then_write=[], which="second"),
        lambda: state.switchover_to(site="edge"),
        lambda: state.write(deleting=True, keys=[5, 2, 0]),
        lambda: state.failover_to(site="edge", then_write=[1, 9, 6]),
        lambda: state.failover_to(site="dr", then_write=[1, 7, 5]),
        lambda: state.replication_round(fault="down", site="edge"),
        lambda: state.failover_to(site="edge", then_write=[5, 4]),
    ]
    run_steps(state, steps)


def run_steps(state: RoundsMachine, steps: list[Callable[[], None]]) -> None:
    """A shrunk failing example, replayed: the machine's invariants after every step, then its teardown."""
    for step in steps:
        step()
        state.committed_files_never_change()
        state.safe_time_never_decreases_and_is_honest()
        state.acks_follow_offer_order()
    state.teardown()


class FailbackMachine(RoundsMachine):
    """The rounds machine with the disaster-recovery loop (DESIGN section 11) instead of direct leader changes
    and splits: sites go down and come back across steps; failovers at latest or at the safe time, while the
    old leader is up or down, and during a round of the old epoch; zombie writers of the old epoch; planned
    switchovers; the old leader's return under the table's ``on_return`` policy.

    What the oracle knows: every write as the writer reported it (key, version, origin, tombstone, value).
    After each step, keys a failover may have given up (a loss under ``rollback``, rows newer than a cut) are
    left out of the safe-time check until the end. At the end: every row of every rollback file is one of
    those writes, exactly; an old leader's file holds rows of its partition's loss (in the loss's version
    range), a cut's file rows newer than the cut; with ``merge`` and no cut nothing is set aside; and the
    leaders, and every replica, hold exactly the replay of the writes that were neither set aside nor given up
    by a cut (``give_up``: what the new leader's chain no longer held as of the cut), every key checked against
    every site's safe time."""

    FAILBACK = True
    ON_RETURN: ClassVar[str] = "rollback"
    DEFINITIONS = MODEL_YAML.replace("on_return: merge", "on_return: rollback")
    stats: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.uncertain: set[int] = set()  # keys whose last write a failover may have set aside
        self.losses: dict[int, list[PartitionLoss]] = {}  # failover id -> what it gave up
        self.cuts: dict[int, int] = {}  # failover id -> its cut (at safe-time)
        self.given_up: dict[tuple[int, int, int, bool, str | None], int] = {}  # write -> the cut's failover id

    def checked(self) -> dict[int, tuple[int, int, bool, str]]:
        return {k: w for k, w in self.expected.items() if k not in self.uncertain and k not in self.unmerged}

    @precondition(lambda self: not self.away)
    @rule(site=st.sampled_from(SITES))
    def site_down(self, site: str) -> None:
        """An outage that lasts across steps (a region lost), not one round's fault."""
        self.away[site] = take_down(self.env, site)
        self.log.append(f"{site} down")

    @precondition(lambda self: bool(self.away))
    @rule()
    def site_back(self) -> None:
        for site, aside in list(self.away.items()):
            bring_up(self.env, site, aside)
            del self.away[site]
            self.log.append(f"{site} back")

    @rule(
        site=st.sampled_from(SITES),
        at=st.sampled_from([Cut.LATEST, Cut.LATEST, Cut.SAFE_TIME]),
        during_round=st.booleans(),
        then_write=st.lists(st.sampled_from(KEYS), max_size=3, unique=True),
    )
    def fail_over(self, site: str, at: Cut, during_round: bool, then_write: list[int]) -> None:
        """`segrep failover --to SITE --at AT`; with ``during_round`` it lands while a round of the old epoch
        is copying, so that round's commits are refused (fencing) and its copies become orphans."""
        before = self.leaders()
        moved: list[FailoverReport] = []
        tried: list[bool] = []

        def move() -> None:
            tried.append(True)
            try:
                moved.append(failover(self.env.catalog, self.env.defs, [TABLE], to=site, cut=at, submit=self.submit))
            except (RefusedError, NotFoundError) as exc:
                assert self.leaders() == before, exc
                self.stats["failover refused"] += 1
                self.log.append(f"failover -> {site} refused: {exc}")

        if during_round:
            self.round_with(move)
        if not tried:  # no round, or one that had nothing to copy
            move()
        if not moved:
            return
        self.after_move(moved[0], before, site)
        if then_write and self.writable():
            self.write(then_write, False)

    def round_with(self, act: Callable[[], None]) -> None:
        """A round whose first copy batch runs ``act`` first (then copies, as planned under the old epoch)."""
        done: list[bool] = []

        def copier(items: list[CopyItem]) -> list[CopyOutcome]:
            if not done:
                done.append(True)
                act()
            return local_copier(items)

        end = self.pending_end or hlc.now_us()
        try:
            report = run_round(self.env.catalog, self.env.defs, TABLE, end, submit=self.submit, copier=copier)
        except SegrepError as exc:  # a merge could not read the files of a site that is down
            assert self.away and "Spark job merge failed" in str(exc), exc
            self.stats["round failed, site down"] += 1
            self.pending_end = end  # retried with the same end (its leases), as Airflow retries the task
            return
        self.pending_end = None
        self.count(report)
        self.stats["round with a failover inside" if done else "round without copies"] += 1
        self.log.append("  round with a failover: " + str(report).replace("\n", "\n  "))

    def after_move(self, report: FailoverReport, before: dict[int, tuple[str, int]], site: str) -> None:
        (move,) = report.moves
        after = self.leaders()
        assert {after[pid][0] for pid in move.assessment.moving} == {site}
        assert all(after[pid][1] == before[pid][1] + 1 for pid in move.assessment.moving)
        assert move.failover_id is not None
        self.losses[move.failover_id] = move.assessment.loss
        if self.ON_RETURN == "rollback" or report.cut_us is not None:  # given up: may never be seen again
            for loss in move.assessment.loss:
                assert loss.min_version is not None
                self.uncertain |= {
                    w.key for w in self.writes if w.partition_id == loss.partition_id and w.version >= loss.min_version
                }
        else:  # merged back on the old leader's return: until then outside every safe time
            self.gave_up(move.assessment.loss)
        if report.cut_us is not None:
            self.cuts[move.failover_id] = report.cut_us
            self.uncertain |= {w.key for w in self.writes if w.version > report.cut_us}
            self.give_up(move.failover_id, report.cut_us, site)
        old_leader_down = {before[pid][0] for pid in move.assessment.moving} & set(self.away)
        self.stats[f"failover at {report.cut}, old leader {'down' if old_leader_down else 'up'}"] += 1
        self.log.append(
            f"failover -> {site} at {report.cut} (cut {report.cut_us}): loss {move.assessment.segments_lost} "
            f"segment(s) {move.assessment.rows_lost} row(s)"
        )

    def give_up(self, failover_id: int, cut_us: int, site: str) -> None:
        """The writes a cut gives up, from what its new leader's chain held (DESIGN section 11: the visible rows
        become those with version <= T). Of the writes that chain had taken in (its segments, or segments
        folded into its merges and majors): each newer than T (set aside, or superseded there by a newer row
        that is), and each at or before T of a key whose rows there are all newer than T: an LWW merge or a
        major kept only the newer row, so the row as of T is no longer anywhere on the chain, and the key has
        no row after the cut (its newest row is in the cut's rollback file: ``kept`` checks it)."""
        cut_pids = {
            f.partition_id
            for f in list_rollbacks(self.env.catalog, TABLE)
            if f.failover_id == failover_id and f.relpath.endswith("-cut.parquet")
        }
        referenced, versions = chain_before_cut(self.env, TABLE, site, cut_pids)
        for w in self.writes:
            if w.segment_id not in referenced:
                continue  # never reached the new leader: a loss, which the old leader's return settles
            held = versions.get((w.key,), [])
            if w.version > cut_us or (
                any(v > cut_us for v in held) and not any(w.version <= v <= cut_us for v in held)
            ):
                self.given_up.setdefault(w.row, failover_id)

    @precondition(lambda self: self.writable())
    @rule(site=st.sampled_from(SITES), keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True))
    def zombie_write(self, site: str, keys: list[int]) -> None:
        """A writer that read the leaders before a failover and commits after it: the conditional commit fails
        at the old epoch, and it writes again at the new leader (nothing of the zombie is committed)."""
        with self.env.catalog.read() as s:
            stale = writer.write_targets(self.env.catalog, q.table_info(s, TABLE))
        before = self.leaders()
        try:
            report = failover(self.env.catalog, self.env.defs, [TABLE], to=site, submit=self.submit)
        except (RefusedError, NotFoundError):
            self.stats["failover refused"] += 1
            return
        self.after_move(report, before, site)
        if not self.writable():
            return
        fresh = writer.write_targets
        calls: list[int] = []

        def zombie_then_fresh(catalog: Any, info: Any, site: str | None = None) -> Any:
            calls.append(1)
            return stale if len(calls) == 1 else fresh(catalog, info, site)

        self.counter += 1
        rows = pa.table({"k": pa.array(keys, pa.int64()), "v": [f"w{self.counter}k{k}" for k in keys]})
        with mock.patch.object(writer, "write_targets", zombie_then_fresh):
            result = write_batch(self.env.catalog, TABLE, rows)
        assert result.attempts >= 2 and {seg.site for seg in result.segments} == {site}, result
        self.stats["zombie writer refused, then written at the new leader"] += 1
        self.record(keys, False, result)

    def kept(self) -> dict[int, tuple[int, int, bool, str]]:
        made = {w.row: w for w in self.writes}
        aside: set[tuple[int, int, int, bool, str | None]] = set()
        cut_keys: set[tuple[int, int]] = set()  # (failover id, key) of every row a cut set aside
        for f in list_rollbacks(self.env.catalog, TABLE):
            t = pq.read_table(self.env.site_dir(f.site) / f.relpath)
            rows = set(zip(*(t[c].to_pylist() for c in ("k", "_version", "_origin", "_deleted", "v")), strict=True))
            assert rows <= set(made), (f, rows - set(made), "\n".join(self.log))  # exactly as written
            if f.failover_id in self.cuts and f.relpath.endswith("-cut.parquet"):
                assert all(r[1] > self.cuts[f.failover_id] for r in rows), (f, self.cuts)
                self.stats["rows set aside by a cut"] += len(rows)
                cut_keys |= {(f.failover_id, r[0]) for r in rows}
            else:  # an old leader's return: rows of what its failover gave up in that partition (set aside
                # under `rollback`, and after a cut whatever the policy: merged back, they would undo the cut)
                assert self.ON_RETURN == "rollback" or f.failover_id in self.cuts, f
                loss = {x.partition_id: x for x in self.losses[f.failover_id]}[f.partition_id]
                assert all(loss.min_version <= r[1] <= loss.max_version for r in rows), (f, loss)
                assert len(rows) <= loss.rows
                self.stats["rows set aside by a return"] += len(rows)
            aside |= rows
        if self.ON_RETURN == "merge" and not self.cuts:
            assert not aside
        for row, failover_id in self.given_up.items():  # a key a cut left with no row: its newest row is aside
            if row[1] <= self.cuts[failover_id]:
                assert (failover_id, row[0]) in cut_keys, (row, failover_id, "\n".join(self.log))
                self.stats["rows a cut gave up (merged away before it)"] += 1
        return replay([w for w in self.writes if w.row not in aside and w.row not in self.given_up])


class MergeBackMachine(FailbackMachine):
    """The same loop with ``on_return: merge``: what a failover gave up comes back and is merged (EventQL)."""

    ON_RETURN = "merge"
    DEFINITIONS = MODEL_YAML
    stats: ClassVar[Counter[str]] = Counter()


def test_a_replica_keeps_its_unmerged_rows_until_the_leader_has_merged_them(spark: Any) -> None:
    """Found by the state machine (a 30-example run): dr deleted keys 0-3 while it led, edge got them by a
    switchover, primary never did; after a failover to primary and a write there (a first major), dr and
    edge fast-forwarded that major in the next round, before the round's merge of their segment, and served
    neither the deletes nor anything else of it below a safe time that covered them. A replica is now
    offered nothing that takes such a segment off its chain until the leader has merged it. The steps as
    the machine shrank them; every invariant after each, then the teardown."""
    RoundsMachine.spark = spark
    state = RoundsMachine()
    steps: list[Callable[[], None]] = [
        lambda: state.failover_to(site="dr", then_write=[]),
        lambda: state.write(deleting=True, keys=[0, 1, 2, 3]),
        lambda: state.switchover_to(site="edge"),
        lambda: state.split_start(at=2, is_async=False),
        lambda: state.switchover_to(site="edge"),
        lambda: state.replication_round(fault="down", site="edge"),
        lambda: state.failover_to(site="primary", then_write=[6, 9, 2]),
        lambda: state.replication_round(fault="none", site="primary"),
    ]
    run_steps(state, steps)


class NarrowWindowMachine(RoundsMachine):
    """The rounds machine with one segment in flight per receiver: a catch-up of several segments is several
    batches, each committed on its own."""

    DEFINITIONS: ClassVar[str] = MODEL_YAML.replace("max_incoming_segments: 2", "max_incoming_segments: 1")


def test_a_replica_never_commits_half_of_a_catch_up_that_takes_its_rows_off_its_chain(spark: Any) -> None:
    """dr held key 1 (from primary) below its safe time; edge, which lacked it, was promoted and wrote (a
    major), and the next round merged dr's segment into edge (the merge output names it). With one segment in
    flight, dr's catch-up (the major, then the merge output) was two batches; dr was lost after the first and
    committed the major alone, which takes key 1's segment off its chain: dr served no key 1 below a safe time
    that covered it, until a later round. A batch now ends only where the replica's chain lacks nothing a later
    offer brings back, and of a batch cut short only up to such a place is committed (here: nothing)."""
    NarrowWindowMachine.spark = spark
    state = NarrowWindowMachine()
    steps: list[Callable[[], None]] = [
        lambda: state.write(deleting=False, keys=[1]),
        lambda: state.replication_round(fault="down", site="edge"),
        lambda: state.failover_to(site="edge", then_write=[2]),
        lambda: state.replication_round(fault="none", site="primary"),
        lambda: lose_dr_after_one_copy(state),
    ]
    run_steps(state, steps)


def lose_dr_after_one_copy(state: RoundsMachine) -> None:
    report = run_round(state.env.catalog, state.env.defs, TABLE, target="dr", submit=state.submit, copier=lost_to("dr"))
    state.log.append(str(report))
    state.safe_time_never_decreases_and_is_honest()  # what went wrong: key 1 missing below dr's safe time
    dr = report.targets["dr"]
    assert dr.status == "failed" and dr.error == "dr lost" and dr.segments_copied == 0, str(report)


def test_failover_failback_state_machine_rollback(spark: Any) -> None:
    FailbackMachine.spark = spark
    run_machine(FailbackMachine, "SEGREP_MODEL_EXAMPLES", 8)


def test_failover_failback_state_machine_merge(spark: Any) -> None:
    MergeBackMachine.spark = spark
    run_machine(MergeBackMachine, "SEGREP_MODEL_EXAMPLES", 8)


def test_after_a_failover_a_replica_keeps_the_old_epochs_rows_until_they_are_merged(spark: Any) -> None:
    """Found by the failover machine (``on_return: merge``), the same bug as
    ``test_a_replica_keeps_its_unmerged_rows_until_the_leader_has_merged_them``: after a failover to edge
    while primary was down, primary came back and, in a round whose merge crashed, fast-forwarded edge's
    chain over a segment of its own that edge had not merged: its safe time covered key 9, which it no
    longer served."""
    MergeBackMachine.spark = spark
    state = MergeBackMachine()
    steps: list[Callable[[], None]] = [
        lambda: state.switchover_to(site="edge"),
        lambda: state.write(deleting=False, keys=[7, 2, 8]),
        lambda: state.zombie_write(keys=[9, 6], site="primary"),
        lambda: state.zombie_write(keys=[3], site="dr"),
        lambda: state.switchover_to(site="primary"),
        lambda: state.switchover_to(site="primary"),
        lambda: state.site_down(site="primary"),
        lambda: state.fail_over(at=Cut.LATEST, during_round=False, site="edge", then_write=[3]),
        lambda: state.site_back(),
        lambda: state.replication_round(fault="in_merge_job", site="dr"),
    ]
    run_steps(state, steps)


def test_a_follower_does_not_push_rows_its_cut_major_set_aside(spark: Any) -> None:
    """A sequence the merge machine found (shrunk), replayed as is. edge writes [2]; dr, down, is promoted
    (`on_return: merge`: edge's [2] is to be pushed to the next leader); edge takes the lead back at its safe
    time, older than [2], so the cut sets [2] aside behind a major built as of the cut; then primary leads.
    edge used to push its [2] segment (in its list, folded into the cut major) to primary, which merged it:
    a row the cut had set aside was served again. Now the follower pushes the major, not what it folded."""
    MergeBackMachine.spark = spark
    machine = MergeBackMachine()
    machine.site_down("dr")
    machine.replication_round("none", "primary")
    machine.fail_over("edge", Cut.LATEST, False, [2])
    machine.replication_round("before_copy", "primary")
    machine.fail_over("dr", Cut.LATEST, False, [5, 8, 0])
    machine.replication_round("none", "primary")
    machine.replication_round("none", "edge")
    machine.fail_over("primary", Cut.SAFE_TIME, False, [5, 9, 1])
    machine.fail_over("edge", Cut.SAFE_TIME, False, [9])
    machine.fail_over("primary", Cut.LATEST, True, [3, 7, 9])
    machine.teardown()  # quiesces and checks: the leaders and every replica hold the replay of the kept writes
    assert machine.stats["rows set aside by a cut"] >= 1


def test_a_cut_during_a_round_keeps_every_row_the_cut_keeps_at_every_site(spark: Any) -> None:
    """A sequence the merge machine found (an 8-example run, 2026-11-25), replayed as is: after four failovers,
    edge is promoted at its safe time T, which lies between the first and the second write of keys 0 and 1.
    edge's chain held the second writes only (a merge kept the winners), so the cut leaves keys 0 and 1 with no
    row and sets their second writes aside. The model expected the first writes back, which no chain held any
    more; it now expects what DESIGN section 11 says (the visible rows with version <= T) and checks that
    every key so given up has its newest row in the cut's rollback file."""
    MergeBackMachine.spark = spark
    state = MergeBackMachine()
    steps: list[Callable[[], None]] = [
        lambda: state.write(deleting=False, keys=[0, 1]),
        lambda: state.write(deleting=False, keys=[0, 1, 2, 3]),
        lambda: state.fail_over(at=Cut.LATEST, during_round=False, site="dr", then_write=[8, 3, 6]),
        lambda: state.fail_over(at=Cut.LATEST, during_round=False, site="primary", then_write=[8, 7, 5]),
        lambda: state.fail_over(at=Cut.LATEST, during_round=True, site="edge", then_write=[9, 2, 4]),
        lambda: state.fail_over(at=Cut.LATEST, during_round=True, site="dr", then_write=[5, 3]),
        lambda: state.write(deleting=True, keys=[1]),
        lambda: state.fail_over(at=Cut.LATEST, during_round=True, site="dr", then_write=[4]),
        lambda: state.write(deleting=False, keys=[1, 5]),
        lambda: state.fail_over(at=Cut.SAFE_TIME, during_round=True, site="edge", then_write=[]),
    ]
    run_steps(state, steps)


def test_a_cut_sets_aside_the_forks_other_sites_hold_past_it(spark: Any) -> None:
    """Found by the merge machine (a 60-example run, 2026-11-27): dr, leader after a failover, merged
    primary's write of key 3 into a segment of its own; primary led again before that segment reached it, and
    edge was then promoted at its safe time, which lies before that write. The failover gave up primary's
    chain past the cut, but not dr's segment: the next round pushed it to edge and merged it (on_return:
    merge), and key 3 came back at every site, undoing the cut. A cut now gives up, with the old leader's
    loss, every fork another site holds past the cut; it is set aside there when the site is next read."""
    MergeBackMachine.spark = spark
    state = MergeBackMachine()
    steps: list[Callable[[], None]] = [
        lambda: state.replication_round(fault="none", site="primary"),
        lambda: state.site_down(site="dr"),
        lambda: state.fail_over(at=Cut.LATEST, during_round=True, site="dr", then_write=[5, 4, 8]),
        lambda: state.fail_over(at=Cut.LATEST, during_round=True, site="primary", then_write=[3]),
        lambda: state.zombie_write(keys=[5], site="dr"),
        lambda: state.site_back(),
        lambda: state.replication_round(fault="down", site="dr"),
        lambda: state.replication_round(fault="corrupt", site="primary"),
        lambda: state.zombie_write(keys=[3], site="primary"),
        lambda: state.fail_over(at=Cut.SAFE_TIME, during_round=True, site="edge", then_write=[9, 4, 1]),
    ]
    run_steps(state, steps)
    losses = {fid: sum(x.segments for x in loss) for fid, loss in state.losses.items()}
    assert losses[max(state.cuts)] == 3, losses  # primary's two writes past the cut, and dr's fork


def test_two_cuts_at_one_instant_do_not_bring_back_what_the_first_set_aside(spark: Any) -> None:
    """Found by the merge machine (a 250-example run, 2026-11-27): edge wrote keys 0, 1, 9, primary led and
    merged them, edge was promoted at its safe time (before those writes: its cut major folds them and leaves
    them out), then dr at the same instant. Setting edge's chain aside on its return rewound it onto the
    segments the cut major had folded, which no failover had given up: pushed to dr and merged, the first
    cut's rows came back at every site. A cut now also gives up what a major it gives up had folded."""
    MergeBackMachine.spark = spark
    state = MergeBackMachine()
    steps: list[Callable[[], None]] = [
        lambda: state.fail_over(at=Cut.LATEST, during_round=True, site="edge", then_write=[0, 9, 1]),
        lambda: state.fail_over(at=Cut.LATEST, during_round=False, site="edge", then_write=[]),
        lambda: state.fail_over(at=Cut.LATEST, during_round=True, site="primary", then_write=[]),
        lambda: state.fail_over(at=Cut.SAFE_TIME, during_round=True, site="primary", then_write=[1, 0, 9]),
        lambda: state.fail_over(at=Cut.SAFE_TIME, during_round=False, site="edge", then_write=[1, 3, 9]),
        lambda: state.fail_over(at=Cut.SAFE_TIME, during_round=False, site="dr", then_write=[8, 7, 5]),
        lambda: state.fail_over(at=Cut.SAFE_TIME, during_round=False, site="edge", then_write=[0, 7, 4]),
        lambda: state.fail_over(at=Cut.LATEST, during_round=True, site="dr", then_write=[5]),
        lambda: state.fail_over(at=Cut.SAFE_TIME, during_round=True, site="dr", then_write=[]),
        lambda: state.fail_over(at=Cut.SAFE_TIME, during_round=True, site="dr", then_write=[2]),
    ]
    run_steps(state, steps)
