"""Executing a replication round: plan -> fast-forward per target -> merges (Spark) -> commit -> report.

Each step is a function a DAG task (or ``segrep round``) calls; all of them read what they need from the
catalog and decide again inside their own transaction, so a step run twice, or twice at once, commits each
segment once per target:
- an offer is leased (the unique lease row is the INFLIGHT lock), copied and verified, then registered with a
  conditional root move; a lost race shows up as SEGMENT_EXISTS on the next offer and becomes an ack;
- the receiver's commit and the sender's ack are separate transactions (as two servers would do them); a
  crash in between is repaired by the next offer, which the receiver answers SEGMENT_EXISTS;
- merge outputs have deterministic ids, and registering one that is already there is a no-op.
A round for the interval ending at ``end_us`` offers only segments committed before ``end_us``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import delete, select, update

from segrep.catalog import Catalog
from segrep.catalog import leases as ls
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.segments import entry_of, register_segment
from segrep.catalog.snapshot import TableSnapshot, snapshot
from segrep.catalog.sql import insert_ignore, record_ack
from segrep.config.definitions import Definitions, Policy
from segrep.core import faults, hlc
from segrep.core.errors import ConflictError, CorruptSegmentError, NotFoundError, SegrepError
from segrep.core.names import check_name
from segrep.core.protocol import sender_reaction
from segrep.core.states import Outcome, Reaction
from segrep.replication.offers import leader_decision, offers_to, pushes_from
from segrep.replication.safetime import update_checkpoints_and_safe_time
from segrep.spark.items import file_ref, round_item
from segrep.spark.manifest import FileRef, Manifest, MergeItem
from segrep.spark.results import commit_merge_results
from segrep.storage.atomic import FileFacts
from segrep.storage.segment_meta import SegmentEntry
from segrep.storage.site import Site
from segrep.storage.transfer import copy_verified
from segrep.storage.workdir import manifest_path

log = logging.getLogger(__name__)
LEASE_TTL_US = 30 * 60 * 1_000_000
MERGE_LEASE_TTL_US = 6 * 3600 * 1_000_000
BACKOFF_CAP_S = 3600
PARTITIONS_AT_ONCE = 4
STOP_OUTCOMES = (Outcome.OVERLOADED, Outcome.INVALID, Outcome.INFLIGHT)


class TargetUnreachable(SegrepError):
    """A target site could not be written (down, full, permission): its task fails and Airflow retries."""


# -- identity and files ---------------------------------------------------------------------------------------


def round_key(table: str, end_us: int) -> str:
    return f"{table}-{end_us}"


def clamp_end(end_us: int | None, now_us: int | None = None) -> int:
    """The interval end, never in the future (a segment committed later must not be claimed by this round)."""
    now = hlc.now_us() if now_us is None else now_us
    return now if end_us is None else min(end_us, now)


def _ensure_round(s: Any, table_id: int, end_us: int, start_us: int | None) -> m.Round:
    insert_ignore(
        s,
        m.Round,
        {"table_id": table_id, "interval_start_us": start_us, "interval_end_us": end_us, "status": "running",
         "started_us": hlc.now_us(), "report": {}},
    )  # fmt: skip
    return s.scalars(select(m.Round).where(m.Round.table_id == table_id, m.Round.interval_end_us == end_us)).one()


# -- plan -----------------------------------------------------------------------------------------------------


@dataclass
class PlanResult:
    round_id: int
    table: str
    end_us: int
    targets: list[str]
    manifest: str | None
    summary: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_round(
    catalog: Catalog,
    defs: Definitions,
    table: str,
    end_us: int | None = None,
    *,
    start_us: int | None = None,
    target: str | None = None,
    reoffer: bool = False,
) -> PlanResult:
    """Create (or find) the round, predict every offer, lease and write the merge manifest."""
    end = clamp_end(end_us)
    policy = defs.policy(table)
    key = round_key(table, end)
    with catalog.write() as s:
        snap = snapshot(s, table, active_only=not reoffer)
        rnd = _ensure_round(s, snap.info.table_id, end, start_us)
        targets = _target_sites(snap, target)
        now = hlc.now_us()
        summary: dict[str, Any] = {"targets": {}, "merges": [], "majors": []}
        stuck: set[int] = set()
        for site_name in targets:
            site_id = snap.site_id(site_name)
            outcomes: Counter[str] = Counter()
            ff_bytes = 0
            for part in snap.partitions:
                for replica in (r for r in part.replicas if r.site_id == site_id):
                    offers, needs_major = offers_to(part, replica, end, max_incoming=policy.max_incoming_segments,
                                                    reoffer=reoffer)  # fmt: skip
                    outcomes.update(str(o) for _seg, o in offers)
                    ff_bytes += sum(seg.byte_size for seg, o in offers if o == Outcome.FAST_FORWARD)
                    # Any OUT_OF_ORDER makes the partition a candidate: on the settled-only lists the replica's
                    # chain can look shorter than it is, so the restart may seem to succeed (a major it would
                    # fast-forward) although on its whole chain it is stuck. The full re-read below decides.
                    if needs_major or any(o == Outcome.OUT_OF_ORDER for _seg, o in offers):
                        stuck.add(part.partition.partition_id)
            summary["targets"][site_name] = {"outcomes": dict(outcomes), "fast_forward_bytes": ff_bytes}
        # Merge and major items need whole chains (a major folds the whole visible chain; a merge compares
        # against it): re-read the candidate partitions in full and decide again on that.
        candidates = stuck | {
            part.partition.partition_id
            for part in snap.partitions
            if any(pushes_from(part, follower, end) for follower in part.replicas)
        }
        items: list[MergeItem] = []
        if candidates:
            full = snapshot(s, table, sorted(candidates))
            site_ids = {full.site_id(name) for name in targets}
            stuck = {
                part.partition.partition_id
                for part in full.partitions
                for replica in part.replicas
                if replica.site_id in site_ids
                and offers_to(part, replica, end, max_incoming=policy.max_incoming_segments, reoffer=reoffer)[1]
            }
            items = _plan_merges(s, full, key, end, now, policy, summary)
            merged = {it.partition_id for it in items}
            for part in full.partitions:
                pid = part.partition.partition_id
                if pid in stuck and pid not in merged:  # merges first; the major follows next round
                    items.append(round_item(full, part, key, "major", []))
                    summary["majors"].append(pid)
        rnd.report = {**(rnd.report or {}), "plan": summary}
    manifest = None
    if items:
        path = manifest_path(defs, table, end)
        Manifest(key, items).write(path)
        manifest = str(path)
    return PlanResult(rnd.round_id, table, end, targets, manifest, summary)


def _target_sites(snap: TableSnapshot, target: str | None) -> list[str]:
    names = sorted(snap.sites[site_id].name for site_id in snap.replica_site_ids)
    if target is not None:
        check_name("site", target)  # the same message for a malformed name as every other command
        if target not in {site.name for site in snap.sites.values()}:
            raise NotFoundError(
                f"unknown site {target!r}; known: {', '.join(sorted(s.name for s in snap.sites.values()))}"
            )
        if target not in names:
            raise NotFoundError(
                f"site {target!r} holds no replica of {snap.info.name}; replica sites: {', '.join(names) or 'none'}"
            )
        return [target]
    return names


def _plan_merges(
    s: Any, snap: TableSnapshot, key: str, end: int, now: int, policy: Policy, summary: dict[str, Any]
) -> list[MergeItem]:
    """Follower -> leader: push what the leader lacks; the leader acks what it holds and leases the rest."""
    items = []
    leader_ids = [part.leader.placement_id for part in snap.partitions]
    ls.expire(s, leader_ids, now)
    leases = ls.in_flight_many(s, leader_ids, now)
    for part in snap.partitions:
        leader = part.leader
        held = leases.get(leader.placement_id, {})
        others = frozenset(seg for seg, holder in held.items() if holder != key)
        incoming: list[FileRef] = []
        for follower in part.replicas:
            for seg in pushes_from(part, follower, end):
                outcome = leader_decision(part, follower, seg, others, policy.max_incoming_segments)
                summary.setdefault("pushes", Counter())[str(outcome)] += 1
                if outcome == Outcome.SEGMENT_EXISTS:
                    record_ack(s, follower.placement_id, seg.segment_id, leader.placement_id, hlc.now_us())
                elif outcome == Outcome.MERGE and (
                    seg.segment_id in held
                    or ls.acquire(s, leader.placement_id, seg.segment_id, key, now + MERGE_LEASE_TTL_US)
                ):
                    incoming.append(file_ref(snap.sites[follower.site_id], follower, seg))
        if incoming:
            items.append(round_item(snap, part, key, "merge", incoming))
            summary["merges"].append(part.partition.partition_id)
    if "pushes" in summary:
        summary["pushes"] = dict(summary["pushes"])
    return items


# -- fast-forward ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CopyItem:
    source: str
    source_uri: str
    target: str
    target_uri: str
    relpath: str
    byte_size: int
    sha256: str


@dataclass(frozen=True)
class CopyOutcome:
    relpath: str
    ok: bool
    invalid: str | None = None  # the verification failure (INVALID)
    error: str | None = None  # the target or source could not be reached


Copier = Callable[[list[CopyItem]], list[CopyOutcome]]


def copy_one(item: CopyItem) -> CopyOutcome:
    try:
        copy_verified(Site(item.source, item.source_uri), Site(item.target, item.target_uri), item.relpath,
                      item.byte_size, item.sha256)  # fmt: skip
    except CorruptSegmentError as exc:
        return CopyOutcome(item.relpath, False, invalid=str(exc))
    except OSError as exc:
        return CopyOutcome(item.relpath, False, error=f"{type(exc).__name__}: {exc}")
    return CopyOutcome(item.relpath, True)


def local_copier(items: list[CopyItem]) -> list[CopyOutcome]:
    """Copy in threads (hashing and file I/O release the GIL)."""
    if len(items) <= 1:
        return [copy_one(i) for i in items]
    with ThreadPoolExecutor(max_workers=min(4, len(items))) as pool:
        return list(pool.map(copy_one, items))


@dataclass
class TargetReport:
    site: str
    status: str = "ok"  # ok | declined | backoff | failed
    outcomes: dict[str, int] = field(default_factory=dict)
    segments_copied: int = 0
    bytes_copied: int = 0
    needs_major: list[int] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None
    spark_apps: int = 0
    decline_reason: str | None = None  # the first decline; the target's back-off records it once

    def absorb(self, other: TargetReport) -> None:
        """Fold one partition's report into the target's: sums, and the worst status with its reason."""
        for k, v in other.outcomes.items():
            self.outcomes[k] = self.outcomes.get(k, 0) + v
        self.segments_copied += other.segments_copied
        self.bytes_copied += other.bytes_copied
        self.spark_apps += other.spark_apps
        self.needs_major += other.needs_major
        rank = {"ok": 0, "declined": 1, "failed": 2}
        if rank.get(other.status, 0) > rank.get(self.status, 0):
            self.status, self.error = other.status, other.error or self.error
        self.decline_reason = self.decline_reason or other.decline_reason

    def count(self, outcome: Outcome) -> None:
        self.outcomes[str(outcome)] = self.outcomes.get(str(outcome), 0) + 1


def fast_forward_target(
    catalog: Catalog,
    defs: Definitions,
    table: str,
    site: str,
    end_us: int | None = None,
    *,
    reoffer: bool = False,
    copier: Copier | None = None,
    big_copier: Copier | None = None,
) -> TargetReport:
    """Offer every due segment of every partition to the replicas at ``site``, in order.

    Copies run through ``copier`` (threads by default); a batch of at least the policy's
    ``spark_copy_threshold_bytes`` goes to ``big_copier`` (the Spark distributed copy) when one is given.
    Raises TargetUnreachable after recording the failure if the site cannot be written.
    """
    started = time.perf_counter()
    end = clamp_end(end_us)
    policy = defs.policy(table)
    key = round_key(table, end)
    report = TargetReport(site)
    with catalog.write() as s:
        snap = snapshot(s, table, active_only=not reoffer)
        rnd = _ensure_round(s, snap.info.table_id, end, None)
        site_row = q.site_by_name(s, site)
        backoff = s.get(m.Backoff, (snap.info.table_id, site_row.site_id))
    if backoff is not None and backoff.next_attempt_us > hlc.now_us() and not reoffer:
        report.status = "backoff"
        report.error = f"backing off after {backoff.failures} failure(s) ({backoff.last_reason}); next attempt later"
    else:
        work = [
            (part.partition.partition_id, replica.placement_id)
            for part in snap.partitions
            for replica in part.replicas
            if replica.site_id == site_row.site_id
        ]

        def one(item: tuple[int, int]) -> TargetReport:
            mine = TargetReport(site)
            try:
                _replicate_partition(catalog, snap, item[0], item[1], end, key, policy, reoffer,
                                     copier or local_copier, big_copier, mine)  # fmt: skip
            except TargetUnreachable as exc:
                mine.status, mine.error = "failed", str(exc)
            return mine

        # Partitions are independent chains: copying several at once keeps the disk busy while one waits on
        # an fsync (each partition still goes strictly in order, and takes its own row lock to decide).
        with ThreadPoolExecutor(max_workers=PARTITIONS_AT_ONCE) as pool:
            for part_report in pool.map(one, work):
                report.absorb(part_report)
    report.seconds = round(time.perf_counter() - started, 3)
    _record_target(catalog, rnd.round_id, snap.info.table_id, site_row.site_id, report, policy)
    if report.status == "failed":
        raise TargetUnreachable(f"target {site}: {report.error}")
    return report


def _replicate_partition(
    catalog: Catalog,
    snap: TableSnapshot,
    partition_id: int,
    replica_id: int,
    end: int,
    key: str,
    policy: Policy,
    reoffer: bool,
    copier: Copier,
    big_copier: Copier | None,
    report: TargetReport,
) -> None:
    restarted = False
    first = True
    while True:
        batch, stop, restart = _decide_batch(catalog, snap.info.name, partition_id, replica_id, end, key, policy,
                                             reoffer and first, restarted, report)  # fmt: skip
        first = False
        if restart:
            restarted = True
            continue
        if batch:
            _copy_and_commit(catalog, batch, key, policy, copier, big_copier, report)
        if stop or not batch:
            return


@dataclass(frozen=True)
class _Leased:
    partition_id: int
    leader_id: int
    replica_id: int
    epoch: int
    segment: m.Segment
    entry: SegmentEntry
    expected_root: str | None
    item: CopyItem


def _decide_batch(
    catalog: Catalog,
    table: str,
    partition_id: int,
    replica_id: int,
    end: int,
    key: str,
    policy: Policy,
    reoffer: bool,
    restarted: bool,
    report: TargetReport,
) -> tuple[list[_Leased], bool, bool]:
    """In one write transaction: re-read the partition, decide the next offers in order, ack what the
    replica already holds and lease what it will fast-forward. Returns (batch, stop, restart)."""
    with catalog.write() as s:
        s.get(m.Partition, partition_id, with_for_update=True)  # serialises deciders of this partition
        snap = snapshot(s, table, [partition_id])
        part = next((p for p in snap.partitions if p.partition.partition_id == partition_id), None)
        replica = next((r for r in part.replicas if r.placement_id == replica_id), None) if part else None
        if part is None or replica is None:
            return [], True, False  # the placement went away or lost its leader: nothing to offer
        now = hlc.now_us()
        ls.expire(s, replica_id, now)
        held = ls.in_flight(s, replica_id, now)
        others = frozenset(seg for seg, holder in held.items() if holder != key)
        offers, _ = offers_to(part, replica, end, in_flight=others, max_incoming=policy.max_incoming_segments,
                              reoffer=reoffer or restarted, restart=False)  # fmt: skip
        batch: list[_Leased] = []
        room = max(policy.max_incoming_segments - len(others), 0)
        root = replica.root_segment_id
        leader_site, target_site = snap.sites[part.leader.site_id], snap.sites[replica.site_id]
        for seg, outcome in offers:
            reaction = sender_reaction(outcome)
            if reaction == Reaction.RESTART:
                if batch:
                    return batch, False, False  # commit what precedes it; the next batch meets it first
                report.count(outcome)
                if restarted:
                    report.needs_major.append(partition_id)  # the planner schedules a major segment
                    return [], True, False
                s.execute(
                    delete(m.Ack)
                    .where(
                        m.Ack.holder_placement_id == part.leader.placement_id, m.Ack.target_placement_id == replica_id
                    )
                    .execution_options(synchronize_session=False)
                )
                q.reset_watermarks(s, partition_id)  # the dropped acks make settled entries pending again
                return [], False, True
            if reaction == Reaction.STOP:
                if outcome == Outcome.OVERLOADED and batch:
                    return batch, False, False  # our own batch filled the window: continue after it
                report.count(outcome)
                report.status = "declined"
                report.decline_reason = report.decline_reason or str(outcome)
                return batch, True, False
            if outcome == Outcome.SEGMENT_EXISTS:
                report.count(outcome)
                record_ack(s, part.leader.placement_id, seg.segment_id, replica_id, hlc.now_us())
                continue
            if len(batch) >= room:
                return batch, False, False
            if seg.segment_id not in held and not ls.acquire(s, replica_id, seg.segment_id, key, now + LEASE_TTL_US):
                report.count(Outcome.INFLIGHT)
                return batch, True, False
            entry = entry_of(seg, table, part.partition)
            item = CopyItem(leader_site.name, leader_site.uri, target_site.name, target_site.uri, seg.relpath,
                            seg.byte_size, seg.sha256)  # fmt: skip
            batch.append(_Leased(partition_id, part.leader.placement_id, replica_id, part.partition.epoch, seg,
                                 entry, root, item))  # fmt: skip
            root = seg.segment_id
        return batch, True, False


def _copy_and_commit(
    catalog: Catalog,
    batch: list[_Leased],
    key: str,
    policy: Policy,
    copier: Copier,
    big_copier: Copier | None,
    report: TargetReport,
) -> None:
    faults.point("before_copy")
    items = [b.item for b in batch]
    use_spark = big_copier is not None and sum(i.byte_size for i in items) >= policy.spark_copy_threshold_bytes
    outcomes = (big_copier if use_spark else copier)(items)  # type: ignore[misc]
    report.spark_apps += int(use_spark)
    faults.point("after_copy_before_commit")
    copied_ok: list[_Leased] = []
    failed: tuple[int, CopyOutcome] | None = None
    for n, (leased, copied) in enumerate(zip(batch, outcomes, strict=True)):
        if not copied.ok:
            failed = (n, copied)
            break
        copied_ok.append(leased)
    committed = _receiver_commit(catalog, copied_ok, key) if copied_ok else []
    if committed:
        faults.point("after_commit_before_ack")
        with catalog.write() as s:  # the sender's side: one transaction for the batch
            for leased in committed:
                record_ack(s, leased.leader_id, leased.segment.segment_id, leased.replica_id, hlc.now_us())
    for leased in committed:
        report.count(Outcome.FAST_FORWARD)
        report.segments_copied += 1
        report.bytes_copied += leased.segment.byte_size
    if len(committed) < len(copied_ok):
        report.count(Outcome.INFLIGHT)  # a concurrent execution of this round got there first
        _release_all(catalog, batch[len(committed) :], key)
        return
    if failed is not None:
        n, copied = failed
        _release_all(catalog, batch[n:], key)
        if copied.invalid:
            report.count(Outcome.INVALID)
            report.status = "declined"
            report.decline_reason = report.decline_reason or str(Outcome.INVALID)
            return
        raise TargetUnreachable(copied.error or "copy failed")


def _receiver_commit(catalog: Catalog, batch: list[_Leased], key: str) -> list[_Leased]:
    """The receiver registers the copied segments in order, moving its root conditionally, notes that the
    sender holds each, and drops the leases: one transaction for the batch (all of one partition). Returns
    what it committed: nothing if leadership changed since the decision (the offer is stale) or the chain
    moved under us (a concurrent execution of this round won; its next offer is answered SEGMENT_EXISTS)."""
    first = batch[0]
    try:
        with catalog.write() as s:
            part = s.get(m.Partition, first.partition_id, with_for_update=True)
            replica = s.get(m.Placement, first.replica_id)
            if part is None or replica is None or replica.removed_us is not None:
                return []
            if part.leader_placement_id != first.leader_id or part.epoch != first.epoch:
                return []
            present = set(
                s.scalars(
                    select(m.Segment.segment_id).where(
                        m.Segment.placement_id == first.replica_id,
                        m.Segment.segment_id.in_([b.segment.segment_id for b in batch]),
                    )
                )
            )
            now = hlc.now_us()
            for leased in batch:
                seg = leased.segment
                if seg.segment_id not in present:
                    register_segment(s, replica, leased.entry, seg.relpath, FileFacts(seg.byte_size, seg.sha256),
                                     now, expected_root=leased.expected_root)  # fmt: skip
                record_ack(s, leased.replica_id, seg.segment_id, leased.leader_id, hlc.now_us())
                ls.release(s, leased.replica_id, seg.segment_id, key)
    except ConflictError:
        return []
    return batch


def _release_all(catalog: Catalog, batch: list[_Leased], key: str) -> None:
    with catalog.write() as s:
        for b in batch:
            ls.release(s, b.replica_id, b.segment.segment_id, key)


def _bump_backoff(s: Any, table_id: int, site_id: int, reason: str, policy: Policy) -> None:
    """Exponential back-off per (table, target): retry_delay_s * 2^(failures-1), capped at an hour."""
    now = hlc.now_us()
    insert_ignore(s, m.Backoff, {"table_id": table_id, "site_id": site_id, "failures": 0, "next_attempt_us": 0,
                                     "last_reason": None, "updated_us": now})  # fmt: skip
    row = s.get(m.Backoff, (table_id, site_id), with_for_update=True)
    row.failures += 1
    delay_s = min(policy.retry_delay_s * 2 ** (row.failures - 1), BACKOFF_CAP_S)
    row.next_attempt_us = now + int(delay_s * 1_000_000)
    row.last_reason = reason
    row.updated_us = now


def _record_target(
    catalog: Catalog, round_id: int, table_id: int, site_id: int, report: TargetReport, policy: Policy
) -> None:
    with catalog.write() as s:
        now = hlc.now_us()
        if report.status == "failed":
            _bump_backoff(s, table_id, site_id, f"unreachable: {report.error}", policy)
        elif report.status == "declined":  # one attempt, one failure, however many partitions declined
            _bump_backoff(s, table_id, site_id, report.decline_reason or "declined", policy)
        elif report.status == "ok":
            s.execute(delete(m.Backoff).where(m.Backoff.table_id == table_id, m.Backoff.site_id == site_id))
        insert_ignore(s, m.RoundTarget, {"round_id": round_id, "site_id": site_id, "status": report.status,
                                             "report": asdict(report), "updated_us": now})  # fmt: skip
        s.execute(
            update(m.RoundTarget)
            .where(m.RoundTarget.round_id == round_id, m.RoundTarget.site_id == site_id)
            .values(status=report.status, report=asdict(report), updated_us=now)
        )


# -- commit and report ----------------------------------------------------------------------------------------


def commit_round(
    catalog: Catalog, defs: Definitions, table: str, end_us: int, *, merge_ran: bool = True
) -> dict[str, Any]:
    """Record merge results, then checkpoints and safe time, then the round's report. Idempotent."""
    merges = commit_merge_results(catalog, defs, table, end_us) if merge_ran else {"items": 0}
    faults.point("before_checkpoint")
    safe_times = update_checkpoints_and_safe_time(catalog, table, end_us)
    with catalog.write() as s:
        # A finished round has nothing in flight. Leases it still holds were taken by an attempt that crashed
        # and whose retry no longer needed them (the leader changed meanwhile): without this they would
        # linger until they expire. A task of this round run again later simply takes its leases anew.
        s.execute(delete(m.Lease).where(m.Lease.holder == round_key(table, end_us)))
        info = q.table_info(s, table)
        rnd = s.scalars(
            select(m.Round).where(m.Round.table_id == info.table_id, m.Round.interval_end_us == end_us)
        ).one()
        sites = q.sites_by_id(s)
        targets = {sites[t.site_id].name: {"status": t.status, **t.report} for t in
                   s.scalars(select(m.RoundTarget).where(m.RoundTarget.round_id == rnd.round_id))}  # fmt: skip
        planned = sorted((rnd.report or {}).get("plan", {}).get("targets", {}))
        if "plan" in (rnd.report or {}):  # a retried round reports on its last plan's targets only: a site
            targets = {t: r for t, r in targets.items() if t in planned}  # that led meanwhile is not one
        missing = [t for t in planned if t not in targets]
        for name in missing:
            targets[name] = {"status": "failed", "error": "its fast-forward task did not report (failed or not run)"}
        failed = sorted(t for t, r in targets.items() if r["status"] == "failed")
        status = "failed" if failed else ("partial" if any(r["status"] != "ok" for r in targets.values()) else "ok")
        spark_apps = int(merges.get("spark_apps", 0)) + sum(int(r.get("spark_apps", 0)) for r in targets.values())
        report = {**(rnd.report or {}), "targets": targets, "merges": merges, "safe_time_us": safe_times,
                  "spark_apps": spark_apps}  # fmt: skip
        rnd.report, rnd.status, rnd.finished_us = report, status, hlc.now_us()
    return {"round_id": rnd.round_id, "table": table, "end_us": end_us, "status": status, "failed": failed, **report}
