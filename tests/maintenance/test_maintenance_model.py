"""Model-based test of compaction, GC, retention and bootstrap interleaved with writes and rounds (DESIGN 9).

A hypothesis state machine on a two-partition table replicated primary -> dr, edge interleaves: writes
(upserts and deletes of a few of ten keys); rounds; compactions (forced or by threshold, some planned "later"
so that every tombstone is past the grace and dropped); GC runs (now, or hours later so that a lagging
replica falls out of retention; some killed between the catalog delete and the file delete); replicas going
offline (the site directory replaced by a file) and coming back; bootstraps of replicas marked as needing one.
Rounds merge in process (small merges: ``spark.merge_runner``); every third compaction runs the Spark job
(:func:`segrep.spark.jobs.run_manifest` in the session's SparkSession), the others fold in process (the same
outputs: tests/spark/test_in_process_merge.py), which keeps the test within a minute.

After every step: each committed file exists with its sha256 (invariant 1); the leaders resolve to exactly the
replay of the writes (2: nothing lost to GC or compaction); no GC took a segment that a LIVE or JOINING replica
not marked ``needs_bootstrap`` still needs: the leader's visible chain and that replica's own are whole (each
starts at a major), and every segment in the replica's offer order is in the leader's list with its file (7);
acks are prefixes of the offer order (5); safe time never decreases and every write at or before it is
readable at its site (4; a re-bootstrap drops it until the site is LIVE again); every row a reachable replica
resolves was written at some point.
At the end: everything back online, marked replicas bootstrapped, rounds until idle; every replica equals the
leaders and is LIVE; a GC past every grace leaves each site holding exactly the files of its catalog.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.catalog.snapshot import snapshot
from segrep.core import hlc
from segrep.core.chain import offer_order, visible_segments
from segrep.core.errors import RefusedError
from segrep.data.reader import read_table
from segrep.data.writer import write_batch
from segrep.maintenance.bootstrap import bootstrap
from segrep.maintenance.compaction import compact, plan_compaction
from segrep.maintenance.gc import collect
from segrep.replication.orchestrator import run_round
from segrep.spark.merge_runner import MergeLimits, run_merge_manifest
from segrep.spark.results import commit_results
from segrep.storage.identity import MARKER_NAME
from segrep.storage.site import Site
from tests.support.checks import assert_acks_are_prefixes, assert_safe_time_honest, safe_times
from tests.support.env import KV_YAML as ROUND_MODEL_YAML
from tests.support.env import make_env
from tests.support.rounds import bring_up, take_down
from tests.support.spark import merge_engine, spark_submit_in

pytestmark = pytest.mark.spark

TABLE = "kv"
SITES = ("primary", "dr", "edge")
REPLICAS = ("dr", "edge")
KEYS = range(10)
HOUR_US = 3600 * 1_000_000
# the rounds model's table and sites, with thresholds that make compaction and retention happen in a few steps
MODEL_YAML = ROUND_MODEL_YAML.replace(
    "policy: {retry_delay_s: 0}",
    "policy: {retry_delay_s: 0, compact_min_segments: 3, tombstone_grace_s: 1h, max_retention_s: 1h}",
)


class MaintenanceMachine(RuleBasedStateMachine):
    spark: ClassVar[Any] = None
    stats: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="segrep-maint-"))
        self.env = make_env(self.tmp, f"sqlite:///{self.tmp}/catalog.db", MODEL_YAML)
        self.submit = spark_submit_in(self.spark)  # the merge job when a merge runs on Spark
        self.expected: dict[int, str | None] = {}  # key -> value, None once deleted
        self.written: set[tuple[int, str]] = set()
        self.down: dict[str, Path] = {}  # site -> where its directory is while it is down
        self.counter = 0
        self.safe: dict[str, int] = {}
        self.log: list[str] = []

    # -- rules -------------------------------------------------------------------------------------------------

    @initialize(keys=st.lists(st.sampled_from(KEYS), min_size=6, max_size=10, unique=True))
    def some_data(self, keys: list[int]) -> None:
        """Every example starts with a few segments per partition (a major and minors, with tombstones) at
        the leader, and part of them on both replicas."""
        self.write(keys, False)
        self.replication_round()
        self.write(keys[: len(keys) // 2], False)
        self.write(keys[-3:], True)

    @rule(
        batches=st.lists(
            st.tuples(st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True), st.booleans()),
            min_size=1,
            max_size=3,
        )
    )
    def writes(self, batches: list[tuple[list[int], bool]]) -> None:
        for keys, deleting in batches:
            self.write(keys, deleting)

    def write(self, keys: list[int], deleting: bool) -> None:
        self.counter += 1
        values = [f"w{self.counter}k{k}" for k in keys]
        rows = pa.table({"k": pa.array(keys, pa.int64()), "v": values})
        write_batch(self.env.catalog, TABLE, rows.select(["k"]) if deleting else rows, delete=deleting)
        for k, v in zip(keys, values, strict=True):
            self.expected[k] = None if deleting else v
            if not deleting:
                self.written.add((k, v))
        self.log.append(f"write {keys} delete={deleting}")

    @rule()
    def replication_round(self) -> None:
        report = run_round(self.env.catalog, self.env.defs, TABLE, submit=self.submit)
        text = str(report).replace("\n", "\n  ")
        self.log.append(f"round (down: {sorted(self.down)})\n  {text}")
        assert set(report.failed) <= set(self.down), str(report)
        self.stats["rounds"] += 1
        self.stats["segments copied"] += sum(t.segments_copied for t in report.targets.values())

    @rule(force=st.sampled_from([True, True, False]), later=st.booleans())
    def compaction(self, force: bool, later: bool) -> None:
        self.stats["compactions"] += 1
        # the Spark job every third time, else in process (the same outputs: tests/spark/test_in_process_merge.py)
        engine = "spark" if self.stats["compactions"] % 3 == 0 else "in_process"
        if later:  # planned as if hours had passed: every tombstone is past the grace and is dropped
            later_us = hlc.now_us() + 2 * HOUR_US
            plan = plan_compaction(self.env.catalog, self.env.defs, TABLE, force=True, now_us=later_us)
            committed = 0
            if plan.manifest and plan.result:
                limits = MergeLimits.of(self.env.defs.policy(TABLE))
                run_merge_manifest(
                    plan.manifest, plan.result, submit=self.submit, limits=limits, name="compact", force=engine
                )
                committed = commit_results(self.env.catalog, Path(plan.manifest), Path(plan.result)).committed
            self.log.append(f"compaction later: {len(plan.candidates)} candidate(s), {committed} committed")
        else:
            with merge_engine(engine):
                report = compact(self.env.catalog, self.env.defs, TABLE, force=force, submit=self.submit)
            committed = report.committed
            self.stats["compaction candidates"] += len(report.candidates)
            self.stats["majors dropped"] += len(report.dropped)
            self.log.append(f"compaction force={force}: {report}")
        self.stats["majors committed"] += committed

    @rule(later=st.sampled_from([0, 0, 2 * HOUR_US]), crash=st.booleans())
    def gc(self, later: int, crash: bool) -> None:
        self.stats["gc runs"] += 1
        real_delete = Site.delete

        def dying_delete(site: Site, relpath: str) -> None:
            raise RuntimeError("GC killed between its catalog commit and the file delete")

        if crash:
            Site.delete = dying_delete  # type: ignore[method-assign]
        try:
            report = collect(self.env.catalog, self.env.defs, TABLE, now_us=hlc.now_us() + later)
        except RuntimeError as exc:
            assert crash and "killed" in str(exc)
            self.stats["gc crashed"] += 1
            self.log.append(f"gc later={later}: crashed")
            return
        finally:
            Site.delete = real_delete  # type: ignore[method-assign]
        self.log.append(
            f"gc later={later}: {len(report.deletions)} deletion(s), needs_bootstrap "
            f"{report.needs_bootstrap}, held {report.held}"
        )
        self.stats["gc deletions"] += len(report.deletions)
        self.stats["marked needs_bootstrap"] += len(report.needs_bootstrap)

    @rule(force=st.sampled_from([True, True, False]), later=st.sampled_from([0, 0, 2 * HOUR_US]), crash=st.booleans())
    def maintenance(self, force: bool, later: int, crash: bool) -> None:
        """What the maintenance DAG does: compaction, then GC."""
        self.compaction(force, bool(later))
        self.gc(later, crash)

    @rule(site=st.sampled_from(REPLICAS))
    def toggle_site(self, site: str) -> None:
        """A replica goes offline (its directory replaced by a file) or comes back."""
        if site in self.down:
            self.come_back(site)
        else:
            self.down[site] = take_down(self.env, site)
            self.log.append(f"{site} down")
            self.stats["outages"] += 1

    def come_back(self, site: str) -> None:
        bring_up(self.env, site, self.down.pop(site))
        self.log.append(f"{site} up")

    @precondition(lambda self: any(self.marked(site) for site in REPLICAS if site not in self.down))
    @rule(data=st.data())
    def rebootstrap(self, data: st.DataObject) -> None:
        site = data.draw(st.sampled_from([s for s in REPLICAS if s not in self.down and self.marked(s)]))
        self.bootstrap(site)

    def bootstrap(self, site: str) -> None:
        try:
            report = bootstrap(self.env.catalog, self.env.defs, TABLE, site)
        except RefusedError as exc:  # files of a placement that never got a segment: keep them aside
            assert "already holds" in str(exc), exc
            report = bootstrap(self.env.catalog, self.env.defs, TABLE, site, "replace")
            self.stats["bootstraps with replace"] += 1
        self.log.append("\n".join(report.lines()))
        self.stats["bootstraps"] += 1

    # -- helpers -----------------------------------------------------------------------------------------------

    def marked(self, site: str) -> bool:
        with self.env.catalog.read() as s:
            return bool(
                s.scalar(
                    select(m.Placement.placement_id)
                    .join(m.Site, m.Site.site_id == m.Placement.site_id)
                    .where(m.Site.name == site, m.Placement.removed_us.is_(None), m.Placement.needs_bootstrap)
                    .limit(1)
                )
            )

    def site_root(self, site: str) -> Path:
        return self.down.get(site) or self.env.site_dir(site)

    def dump(self) -> str:
        with self.env.catalog.read() as s:
            pls = s.execute(
                select(
                    m.Placement.placement_id,
                    m.Placement.partition_id,
                    m.Placement.site_id,
                    m.Placement.state,
                    m.Placement.needs_bootstrap,
                    m.Placement.removed_us,
                )
            ).all()
            segs = s.execute(select(m.Segment.placement_id, m.Segment.relpath)).all()
        files = {
            site: sorted(
                str(p.relative_to(self.site_root(site))) for p in self.site_root(site).rglob("*") if p.is_file()
            )
            for site in SITES
        }
        return f"placements {pls}\nsegments {segs}\nfiles {files}"

    def fail(self, message: str) -> str:
        return "\n".join([message, *self.log, self.dump()])

    # -- invariants ----------------------------------------------------------------------------------------------

    @invariant()
    def committed_files_are_intact(self) -> None:
        with self.env.catalog.read() as s:
            rows = s.execute(
                select(m.Site.name, m.Segment.relpath, m.Segment.sha256)
                .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
                .join(m.Site, m.Site.site_id == m.Placement.site_id)
            ).all()
        for site, relpath, sha in rows:
            path = self.site_root(site) / relpath
            assert path.is_file(), self.fail(f"{site}:{relpath} is listed but missing")
            assert hashlib.sha256(path.read_bytes()).hexdigest() == sha, self.fail(f"{site}:{relpath} changed")

    @invariant()
    def leaders_hold_every_write(self) -> None:
        got = read_table(self.env.catalog, TABLE).sort_by("k")
        want = sorted((k, v) for k, v in self.expected.items() if v is not None)
        assert list(zip(got["k"].to_pylist(), got["v"].to_pylist(), strict=True)) == want, self.fail("leader rows")

    @invariant()
    def nothing_a_replica_needs_was_collected(self) -> None:
        with self.env.catalog.read() as s:
            snap = snapshot(s, TABLE, include_stalled=True)
            for part in snap.partitions:
                pid = part.partition.partition_id
                leader_chain = part.chain(part.leader)
                visible = visible_segments(leader_chain)
                assert not visible or visible[0].is_major, self.fail(f"partition {pid}: the leader's chain is cut")
                leader_ids = {x.segment_id for x in part.segments.get(part.leader.placement_id, [])}
                for replica in part.replicas:
                    if replica.needs_bootstrap:
                        continue  # out of retention: it will be re-bootstrapped from the newest major
                    for ref in offer_order(leader_chain, part.acked_by(part.leader, replica)):
                        assert ref.segment_id in leader_ids
                        seg = part.segment(part.leader.placement_id, ref.segment_id)
                        assert (self.site_root("primary") / seg.relpath).is_file(), self.fail(f"{seg.relpath} gone")
                    own = visible_segments(part.chain(replica))
                    assert not own or own[0].is_major, self.fail(
                        f"partition {pid}: the chain of replica {replica.placement_id} at "
                        f"{snap.sites[replica.site_id].name} is cut: {own}"
                    )

    @invariant()
    def acks_follow_offer_order(self) -> None:
        assert_acks_are_prefixes(self.env.catalog, TABLE)

    @invariant()
    def safe_time_is_honest_and_never_decreases(self) -> None:
        now = safe_times(self.env.catalog, TABLE)
        for site, us in now.items():  # (a re-bootstrap drops a site's safe time until it is LIVE again)
            assert us >= self.safe.get(site, us), self.fail(f"safe time of {site} went back")
            if site not in self.down:
                assert_safe_time_honest(self.env.catalog, TABLE, site, us)
        self.safe = now

    @invariant()
    def replicas_hold_only_written_rows(self) -> None:
        for site in REPLICAS:
            if site in self.down:
                continue
            got = read_table(self.env.catalog, TABLE, site)
            rows = set(zip(got["k"].to_pylist(), got["v"].to_pylist(), strict=True))
            assert rows <= self.written, self.fail(f"{site} resolves rows nobody wrote: {rows - self.written}")

    # -- quiescence ----------------------------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            self.quiesce()
        finally:
            for site, aside in list(self.down.items()):
                bring_up(self.env, site, aside)
            self.env.catalog.dispose()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def quiesce(self) -> None:
        for site in list(self.down):
            self.come_back(site)
        for site in REPLICAS:
            if self.marked(site):
                self.bootstrap(site)
        reports = []
        for _ in range(8):
            report = run_round(self.env.catalog, self.env.defs, TABLE, submit=self.submit)
            reports.append(report)
            busy = any(t.outcomes or t.status != "ok" for t in report.targets.values())
            if not busy and not report.merges.items:
                break
        else:
            pytest.fail(self.fail("no idle round:\n" + "\n".join(str(r) for r in reports[-3:])))
        leader = read_table(self.env.catalog, TABLE).sort_by("k")
        for site in REPLICAS:
            got = read_table(self.env.catalog, TABLE, site).sort_by("k")
            assert got.equals(leader), self.fail(f"{site}: {got.to_pylist()} != {leader.to_pylist()}")
        with self.env.catalog.read() as s:
            states = s.execute(
                select(m.Placement.state, m.Placement.needs_bootstrap).where(m.Placement.removed_us.is_(None))
            ).all()
        assert set(states) == {("LIVE", False)}, self.fail(str(states))
        far = hlc.now_us() + 30 * 86400 * 1_000_000  # past every grace: orphans of crashed GC runs go too
        collect(self.env.catalog, self.env.defs, TABLE, now_us=far)
        self.committed_files_are_intact()
        for site in SITES:
            root = self.env.site_dir(site)
            on_disk = (
                {
                    str(p.relative_to(root))
                    for p in root.rglob("*")
                    if p.is_file() and p.relative_to(root).parts[0] != ".replaced" and p.name != MARKER_NAME
                }
                if root.is_dir()
                else set()
            )
            with self.env.catalog.read() as s:
                listed = set(
                    s.scalars(
                        select(m.Segment.relpath)
                        .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
                        .join(m.Site, m.Site.site_id == m.Placement.site_id)
                        .where(m.Site.name == site)
                    )
                )
            assert on_disk == listed, self.fail(f"{site}: extra {on_disk - listed}, missing {listed - on_disk}")
        with self.env.catalog.read() as s:
            snap = snapshot(s, TABLE)
            for part in snap.partitions:
                for pl in (part.leader, *part.replicas):
                    listed_ids = {x.segment_id for x in part.segments.get(pl.placement_id, [])}
                    needed = {r.segment_id for r in visible_segments(part.chain(pl))}
                    assert listed_ids == needed, self.fail(f"placement {pl.placement_id}: {listed_ids} != {needed}")
        self.leaders_hold_every_write()
        self.stats["examples"] += 1


def test_maintenance_state_machine(spark: Any) -> None:
    MaintenanceMachine.spark = spark
    run_state_machine_as_test(
        MaintenanceMachine,
        settings=settings(
            max_examples=int(os.environ.get("SEGREP_MODEL_EXAMPLES", "8")),
            stateful_step_count=int(os.environ.get("SEGREP_MODEL_STEPS", "12")),
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
    print(dict(sorted(MaintenanceMachine.stats.items())))
