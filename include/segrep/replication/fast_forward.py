"""The fast-forward step of a round: offer every due segment to one target site, copy, verify, commit, ack.

Each step re-reads what it needs from the catalog and decides again inside its own transaction, so a step run
twice, or twice at once, commits each segment once per target:
- an offer is leased (the unique lease row is the INFLIGHT lock), copied and verified, then registered with a
  conditional root move; a lost race shows up as SEGMENT_EXISTS on the next offer and becomes an ack;
- the receiver's commit and the sender's ack are separate transactions (as two servers would do them); a
  crash in between is repaired by the next offer, which the receiver answers SEGMENT_EXISTS. When the
  partition goes on, the sender's ack shares the transaction of its next offer; the acks of every
  partition's last batch share the one that records the target's report;
- a copy the target declines (INVALID) stops its partition for the round: it is offered again next round,
  after the back-off.

A batch is made durable before it is committed: each file is fsynced as it is copied (the copies of every
partition share one pool of threads per target, ``storage.transport.CopyPool``), each target directory once
for the batch (``storage.atomic.batched_directory_syncs``), then the receiver registers the whole batch in one
transaction. Partitions go side by side; on SQLite their transactions take turns in this process rather than
in SQLite's busy handler.

A store that cannot be used (its root became a plain file, a permission error, a URI its file system cannot
open, a copier that gives up) fails that target only: the partition releases the round's leases it holds
there, the target's report names the reason, and the round goes on with the other targets. A copy that
fails verification is INVALID: the target declines it, and its report names the segment, the site and path
of the file and the verification error.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from segrep.catalog import Catalog
from segrep.catalog import leases as ls
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.link_lease import LinkLimits, LinkPacing, unlimited
from segrep.catalog.losses import losses_held
from segrep.catalog.segments import entry_of, insert_segments, move_root_to, segment_values
from segrep.catalog.site_identity import expected_identity
from segrep.catalog.snapshot import PartitionSnapshot, given_up_held, receiving_replicas, snapshot
from segrep.config.definitions import Definitions, Policy
from segrep.config.stores import options_for
from segrep.core import faults, hlc
from segrep.core.errors import ConflictError, SegrepError, SiteUnidentifiedError
from segrep.core.links import CopyPriority
from segrep.core.protocol import sender_reaction
from segrep.core.states import Outcome, PlacementState, Reaction
from segrep.replication.backoff import record_target
from segrep.replication.heartbeat import heartbeat
from segrep.replication.offers import forks_of, offers_to, pushes_from, whole_cuts
from segrep.replication.reports import LEASE_DECLINES, InvalidSegment, TargetReport, TargetStatus
from segrep.replication.round import TargetUnreachable, clamp_end, ensure_round, lease_ttl_us, round_key
from segrep.replication.waits import lease_wait
from segrep.storage import throttle
from segrep.storage.atomic import FileFacts
from segrep.storage.identity import marker_path
from segrep.storage.probe import STORE_ERRORS, describe
from segrep.storage.segment_meta import SegmentEntry
from segrep.storage.site import Expected, Site
from segrep.storage.store_errors import PathBlockedError, StoreRefusedError, classify_os
from segrep.storage.transport import COPY_ERRORS, Copier, CopyItem, CopyOutcome, CopyPool

PARTITIONS_AT_ONCE = 4


def fast_forward_target(
    catalog: Catalog,
    defs: Definitions,
    table: str,
    site: str,
    end_us: int | None = None,
    *,
    reoffer: bool = False,
    retry: bool = False,
    copier: Copier | None = None,
    big_copier: Copier | None = None,
    links: LinkLimits = unlimited,
    priority: CopyPriority | None = None,
) -> TargetReport:
    """Offer every due segment of every partition to the replicas at ``site``, in order.

    A target backing off after failures is not attempted (its report says until when), unless this attempt is
    a retry someone asked for (``retry``: a cleared or retried task; the acks still count) or ``reoffer``
    (which ignores the acks too).

    Copies run through ``copier`` (threads by default); a batch of at least the policy's
    ``spark_copy_threshold_bytes`` goes to ``big_copier`` (the Spark distributed copy) when one is given.
    The default copier paces its copies at the share of each link's cap (``links``: none by default) that a
    slot of class ``priority`` gets (``catalog.link_lease``); by default a round's, or a bootstrap's when
    every replica it feeds is still joining (a bootstrapped site's first copies); a given copier paces itself.
    Raises TargetUnreachable after recording the failure if the site cannot be written.
    """
    started = time.perf_counter()
    throttled_before = throttle.counts()
    end = clamp_end(end_us)
    policy = defs.policy(table)
    report = TargetReport(site)
    last_acks: list[tuple[int, str, int]] = []  # the sender's acks of each partition's last batch
    with catalog.write() as s:
        info = q.table_info(s, table)
        round_id = ensure_round(s, info.table_id, end, None).round_id
        site_row = q.site_by_name(s, site)
        backoff = s.get(m.Backoff, (info.table_id, site_row.site_id))
        replicas = receiving_replicas(s, info, site_row.site_id, active_only=not reoffer)
        pending = given_up_held(s, info.table_id, [r.placement_id for r in replicas])
        expect = Expected(expected_identity(s, site_row))
        held = losses_held(s, info.table_id, site_row.site_id)
    down = _unreadable(site_row, held[0].relpath) if held else None
    if down is not None:  # an old leader still away: nothing offered, acked or moved there (DESIGN 13)
        report.status = TargetStatus.DOWN
        report.error = (
            f"site {site} is down ({down}); it holds {len(held)} segment(s) a failover gave up that the leader "
            "has not taken in: nothing is offered there until it can be read"
        )
    elif backoff is not None and backoff.next_attempt_us > hlc.now_us() and not (reoffer or retry):
        report.status = TargetStatus.BACKOFF
        report.error = (
            f"backing off after {backoff.failures} failure(s) ({backoff.last_reason}); "
            f"no attempt before {hlc.iso(backoff.next_attempt_us)}"
        )
    elif (unidentified := _identity_problem(site_row, expect)) is not None:
        report.status, report.error, report.refused = unidentified
    else:
        key, ttl = round_key(table, end), lease_ttl_us()
        turns = threading.Lock() if catalog.dialect == "sqlite" else contextlib.nullcontext()
        what = _priority_of(replicas, priority or CopyPriority.ROUND)
        pacing = LinkPacing(catalog, what, links)
        own_pool = None  # the default copier: one pool for the target's partitions, closed when they are done
        if copier is None:
            copier = own_pool = CopyPool(pacer_for=pacing.pacer)
        big = None if big_copier is None else pacing.paced_batches(big_copier)
        context = _Context(catalog, table, info.table_id, site, end, key, ttl, policy, copier, big, turns)
        work = [_PartitionRun(context, replica.partition_id, replica.placement_id, reoffer) for replica in replicas]
        # Partitions are independent chains: copying several at once keeps the disk busy while one waits on
        # an fsync (each partition still goes strictly in order, and takes its own row lock to decide). The
        # heartbeat keeps the round's leases alive while this process copies, and only while it does.
        with (
            heartbeat(catalog, key, ttl),
            pacing,
            ThreadPoolExecutor(max_workers=PARTITIONS_AT_ONCE) as partitions,
            own_pool or contextlib.nullcontext(),
        ):
            for part_report in partitions.map(_PartitionRun.run, work):
                report.absorb(part_report)
        last_acks = [ack for run in work for ack in _sender_acks(run.unacked)]
        if pending and report.status.rank < TargetStatus.FAILED.rank:  # the rows a failover gave up are still there
            report.status = TargetStatus.FAILED
            report.error = (
                f"site {site} still holds {pending} segment(s) a failover gave up; they are set aside in its "
                "rollback area (and its chain rewound) at the first round that can read the site"
            )
    report.throttled = throttle.since(throttled_before)
    report.seconds = round(time.perf_counter() - started, 3)
    with catalog.write() as s:  # the sender's side of the last batches, and the target's report: one transaction
        ls.record_acks(s, last_acks, hlc.now_us())
        record_target(s, round_id, info.table_id, site_row.site_id, report, policy)
    if report.status in (TargetStatus.FAILED, TargetStatus.DOWN):
        raise TargetUnreachable(f"target {site}: {report.error}")
    return report


def _priority_of(replicas: list[m.Placement], otherwise: CopyPriority) -> CopyPriority:
    """A bootstrap's class when every replica fed is joining (its bulk first copies), else ``otherwise`` (a
    round's, or a catch-up's)."""
    joining = bool(replicas) and all(r.state == PlacementState.JOINING for r in replicas)
    return CopyPriority.BOOTSTRAP if joining else otherwise


def _identity_problem(row: m.Site, expect: Expected) -> tuple[TargetStatus, str, bool] | None:
    """Whether the target's root is the site the catalog expects (its identity marker), looked at before
    anything is copied: a root that vanished or is foreign is DOWN, and nothing is written, acked or moved
    there; a store that cannot be read at all is the FAILED it always was (``refused``: by its credentials
    or permissions, which no back-off mends)."""
    try:
        store = Site(row.name, row.uri, expect=expect)
    except SegrepError as exc:  # its store cannot be opened (a credentials reference that cannot be read)
        return TargetStatus.FAILED, str(exc), False
    except STORE_ERRORS as exc:
        return TargetStatus.FAILED, describe(exc), False
    try:
        store.ensure_identified(fresh=True)  # once per target and round
    except SiteUnidentifiedError as exc:
        return TargetStatus.DOWN, str(exc), False
    except STORE_ERRORS as exc:
        where = store.root if store.local else f"s3://{marker_path(store.root)}"
        failure = exc if isinstance(exc, PathBlockedError) else classify_os(exc, row.name, where, "read")
        return TargetStatus.FAILED, describe(failure), isinstance(failure, StoreRefusedError)
    return None


def _unreadable(row: m.Site, relpath: str) -> str | None:
    """Why a file the catalog says the site holds cannot be read there (the site is down), or None."""
    try:
        return None if Site(row.name, row.uri).exists(relpath) else f"its file {relpath} is not there"
    except COPY_ERRORS as exc:
        return describe(exc)


@dataclass(frozen=True)
class _Context:
    """What every partition of one target's fast-forward shares."""

    catalog: Catalog
    table: str
    table_id: int
    site: str  # the target site
    end: int
    key: str  # the round's key: it holds the leases
    ttl_us: int  # how long a lease lives without a heartbeat
    policy: Policy
    copier: Copier
    big_copier: Copier | None
    turns: contextlib.AbstractContextManager[Any] = field(default_factory=contextlib.nullcontext)

    @contextlib.contextmanager
    def write(self) -> Iterator[Session]:
        """A catalog write transaction. On SQLite the partitions take turns here: SQLite has one writer at a
        time, and a thread that waits for it in SQLite's busy handler sleeps in steps of up to 100 ms, long
        after the lock is free (the partitions' short transactions spent more time waiting than copying)."""
        with self.turns, self.catalog.write() as s:
            yield s


@dataclass(frozen=True)
class _Leased:
    """An offer decided FAST_FORWARD and leased: what to copy, and how to commit it."""

    partition_id: int
    leader_id: int
    sender_id: int  # the leader, or the replica's feeder in a cascade
    replica_id: int
    epoch: int
    segment: m.Segment
    entry: SegmentEntry
    expected_root: str | None
    item: CopyItem
    whole: bool  # the replica's chain after this segment lacks nothing a later offer brings back (whole_cuts)


class _Next(Enum):
    """What a partition's offer loop does after a decided batch (copied first, if it holds anything)."""

    CONTINUE = "continue"  # decide the next batch (an empty batch ends the loop: nothing more is due)
    STOP = "stop"  # done for this round (everything offered, or a decline)
    RESTART = "restart"  # OUT_OF_ORDER: the replica's acks were dropped; decide again from the newest major


@dataclass(frozen=True)
class _Decision:
    batch: list[_Leased]
    next: _Next


@dataclass
class _PartitionRun:
    """Leader -> one replica placement of one partition, strictly in order (EventQL replicate_partition_to)."""

    ctx: _Context
    partition_id: int
    replica_id: int
    reoffer: bool
    # Committed by the receiver, not yet acked by the sender: the sender acks them in the transaction of its
    # next offer, or, after the partition's last batch, with the other partitions' when the target is done
    # (fewer transactions on each partition's path, and at the target's end one for all of them)
    unacked: list[_Leased] = field(default_factory=list)

    def run(self) -> TargetReport:
        report = TargetReport(self.ctx.site)  # one partition's share, folded into the target's report
        try:
            self._offer_all(report)
        except TargetUnreachable as exc:
            report.status, report.error = TargetStatus.FAILED, str(exc)
        except STORE_ERRORS as exc:  # any store error of this target is its failure, never the round's
            report.status, report.error = TargetStatus.FAILED, describe(exc)
            report.refused = isinstance(exc, StoreRefusedError)
        if report.status == TargetStatus.FAILED:
            _release_replica(self.ctx, self.replica_id)
        return report

    def _offer_all(self, report: TargetReport) -> None:
        restarted, reoffer = False, self.reoffer
        while True:
            decision = self._decide(reoffer, restarted, report)
            reoffer = False  # only the first offer of the partition is a re-offer
            if decision.next is _Next.RESTART:
                restarted = True
                continue
            declined = bool(decision.batch) and self._copy_and_commit(decision.batch, report)
            if declined or decision.next is _Next.STOP or not decision.batch:
                return

    def _decide(self, reoffer: bool, restarted: bool, report: TargetReport) -> _Decision:
        """In one write transaction: ack the previous batch, re-read the partition, decide the next offers in
        order, ack what the replica already holds and lease what it will fast-forward."""
        ctx, pid, replica_id = self.ctx, self.partition_id, self.replica_id
        unacked, self.unacked = self.unacked, []
        with ctx.write() as s:
            q.locked_partition(s, pid)  # serialises deciders of this partition
            ls.record_acks(s, _sender_acks(unacked), hlc.now_us())
            snap = snapshot(s, ctx.table, [pid])
            part = next((p for p in snap.partitions if p.partition.partition_id == pid), None)
            replica = next((r for r in part.replicas if r.placement_id == replica_id), None) if part else None
            if part is None or replica is None:
                return _Decision([], _Next.STOP)  # the placement went away or lost its leader: nothing to offer
            now = hlc.now_us()
            ls.expire(s, replica_id, now)
            held = ls.in_flight(s, replica_id, now)
            others = frozenset(seg for seg, holder in held.items() if holder != ctx.key)
            max_in = ctx.policy.max_incoming_segments
            offers, _ = offers_to(
                part,
                replica,
                ctx.end,
                in_flight=others,
                max_incoming=max_in,
                reoffer=reoffer or restarted,
                restart=False,
            )
            self._merge_wait(s, part, replica, now, report)
            batch: list[_Leased] = []
            room = max(max_in - len(others), 0)
            cuts = whole_cuts(part.chain(replica), offers)
            root = replica.root_segment_id
            sender = part.sender_of(replica)
            holders = {part.leader.placement_id, sender.placement_id}  # the ack says: the replica holds it
            source_site, target_site = snap.sites[sender.site_id], snap.sites[replica.site_id]
            for i, (seg, outcome) in enumerate(offers):
                reaction = sender_reaction(outcome)
                if reaction == Reaction.RESTART:
                    if batch:  # commit what precedes it; the next batch meets it
                        return self._leased(s, _Decision(batch, _Next.CONTINUE), held, now, report)
                    report.count(outcome)
                    if restarted:
                        report.needs_major.append(pid)  # the planner schedules a major segment
                        return _Decision([], _Next.STOP)
                    ls.drop_acks(s, holders=holders, targets=replica_id)
                    q.reset_watermarks(s, pid)  # the dropped acks make settled entries pending again
                    return _Decision([], _Next.RESTART)
                if reaction == Reaction.STOP:
                    if outcome == Outcome.OVERLOADED and batch:  # our own batch filled the window: go on after it
                        return self._leased(s, _Decision(batch, _Next.CONTINUE), held, now, report)
                    decision = self._leased(s, _Decision(batch, _Next.STOP), held, now, report)
                    if len(decision.batch) == len(batch):  # else a lease held elsewhere stopped it earlier
                        if outcome == Outcome.UNMERGED:  # no back-off: the merge that clears it may be this round's
                            n = len(forks_of(part, replica)[1])
                            report.wait(
                                f"waits for the leader to merge {n} segment(s) it holds from when it led", outcome
                            )
                        elif (
                            outcome in LEASE_DECLINES
                            and (wait := lease_wait(s, ctx.table_id, [replica_id], ctx.key, now)) is not None
                        ):  # another round's receipts
                            report.wait(wait.reason(), outcome)
                        else:
                            report.decline(outcome)
                    return decision
                if outcome == Outcome.SEGMENT_EXISTS:
                    report.count(outcome)
                    ls.record_acks(s, [(h, seg.segment_id, replica_id) for h in sorted(holders)], hlc.now_us())
                    continue
                if len(batch) >= room and cuts[i]:  # the window is full: the batch ends where nothing is amiss
                    return self._leased(s, _Decision(batch, _Next.CONTINUE), held, now, report)
                item = CopyItem(
                    source_site.name,
                    source_site.uri,
                    target_site.name,
                    target_site.uri,
                    seg.relpath,
                    seg.byte_size,
                    seg.sha256,
                    options_for(source_site.name, source_site.uri),
                    options_for(target_site.name, target_site.uri),
                    seg.crc64nvme,
                )
                entry = entry_of(seg, ctx.table, part.partition)
                leased = _Leased(
                    pid,
                    part.leader.placement_id,
                    sender.placement_id,
                    replica_id,
                    part.partition.epoch,
                    seg,
                    entry,
                    root,
                    item,
                    cuts[i + 1],
                )
                batch.append(leased)
                root = seg.segment_id
            return self._leased(s, _Decision(batch, _Next.STOP), held, now, report)

    def _merge_wait(
        self, s: Session, part: PartitionSnapshot, replica: m.Placement, now: int, report: TargetReport
    ) -> None:
        """Segments this replica wrote (or got from an earlier leader) that the leader lacks wait for their merge
        there; when another round holds the leader's leases on them, this target waits for that round too (its
        offers are held back until the merge: ``offers_to``), and says so instead of "nothing to offer"."""
        pushed = {seg.segment_id for seg in pushes_from(part, replica, self.ctx.end)}
        if not pushed:
            return
        wait = lease_wait(s, self.ctx.table_id, [part.leader.placement_id], self.ctx.key, now, pushed)
        if wait is not None:
            report.wait(f"{wait.reason()} (the leader's merge of {wait.segments} segment(s) written here)")

    def _leased(
        self, s: Session, decision: _Decision, held: dict[str, str], now: int, report: TargetReport
    ) -> _Decision:
        """Lease a decided batch in one statement (a segment in ``held`` is leased already, by this round).
        If another holder has one of them (a concurrent execution got there first: INFLIGHT), the batch stops
        before it, at the last place the replica's chain is whole, and the leases past that are released."""
        ctx = self.ctx
        wanted = [b.segment.segment_id for b in decision.batch if b.segment.segment_id not in held]
        taken = ls.acquire_many(s, self.replica_id, wanted, ctx.key, now + ctx.ttl_us)
        first_lost = next(
            (n for n, b in enumerate(decision.batch) if b.segment.segment_id not in {*held, *taken}), None
        )
        if first_lost is None:
            return decision
        lost = decision.batch[first_lost].segment.segment_id
        wait = lease_wait(s, ctx.table_id, [self.replica_id], ctx.key, now, [lost])
        if wait is not None:
            report.wait(wait.reason(), Outcome.INFLIGHT)
        else:  # taken and let go again meanwhile: the next round offers it
            report.count(Outcome.INFLIGHT)
        whole = _whole_prefix(decision.batch[:first_lost])
        ls.release_many(s, self.replica_id, [b.segment.segment_id for b in decision.batch[len(whole) :]], ctx.key)
        return _Decision(whole, _Next.STOP)

    def _copy_and_commit(self, batch: list[_Leased], report: TargetReport) -> bool:
        """Copy a decided batch, commit it at the receiver, then ack it at the sender: with the next offer, or
        when the target is done (``unacked``); at once if the batch was cut short. A crash before the ack is
        repaired by the next offer either way (the receiver answers SEGMENT_EXISTS). Returns whether the
        target declined the batch (INVALID): the partition stops there for this round, as the protocol says,
        instead of offering the same segment again (once the window had held offers back, it re-copied it
        without end)."""
        ctx = self.ctx
        faults.point("before_copy")
        items = [b.item for b in batch]
        big = ctx.big_copier
        use_spark = big is not None and sum(i.byte_size for i in items) >= ctx.policy.spark_copy_threshold_bytes
        try:
            outcomes = big(items) if use_spark and big is not None else ctx.copier(items)
        except COPY_ERRORS as exc:  # the copier gave up (a Spark copy that failed, a store)
            _release_all(ctx, batch)
            raise TargetUnreachable(f"copy failed: {describe(exc)}") from None
        report.spark_apps += int(use_spark)
        faults.point("after_copy_before_commit")
        copied_ok: list[_Leased] = []
        failed: tuple[int, CopyOutcome] | None = None
        for n, (leased, copied) in enumerate(zip(batch, outcomes, strict=True)):
            if not copied.ok:
                failed = (n, copied)
                break
            copied_ok.append(leased)
        # Copied but cut short (a copy failed): only up to where the replica's chain is whole again is committed
        to_commit = _whole_prefix(copied_ok)
        commit = _receiver_commit(ctx, to_commit) if to_commit else _Commit([], superseded=False)
        committed = commit.batch
        if committed:
            faults.point("after_commit_before_ack")
            if failed is None and len(committed) == len(batch):
                self.unacked = committed
            else:
                with ctx.write() as s:  # the sender's side: one transaction for the batch
                    ls.record_acks(s, _sender_acks(committed), hlc.now_us())
        for leased in committed:
            report.count(Outcome.FAST_FORWARD)
            report.segments_copied += 1
            report.bytes_copied += leased.segment.byte_size
            source = leased.item.source
            report.bytes_from[source] = report.bytes_from.get(source, 0) + leased.segment.byte_size
        if len(committed) < len(to_commit):
            if commit.superseded:  # leadership moved on: stale offers, not a lease held elsewhere
                report.superseded += len(to_commit)
            else:
                report.count(Outcome.INFLIGHT)  # a concurrent execution of this round got there first
            _release_all(ctx, batch[len(committed) :])
            return False
        if failed is not None:
            n, copied = failed
            _release_all(ctx, batch[len(committed) :])
            if copied.invalid:
                report.decline(Outcome.INVALID)
                bad = batch[n]
                report.invalid.append(
                    InvalidSegment(
                        bad.segment.segment_id,
                        bad.partition_id,
                        bad.item.source,
                        f"{bad.item.source_uri.rstrip('/')}/{bad.item.relpath}",
                        copied.invalid,
                    )
                )
                return True
            if copied.refused:
                raise StoreRefusedError(copied.error or "the store refused the copy")
            raise TargetUnreachable(copied.error or "copy failed")
        return False


@dataclass(frozen=True)
class _Commit:
    """What the receiver committed of a copied batch (all of it, or nothing), and if nothing, whether because
    the partition's leader or epoch changed since the offer (else a concurrent execution of the round won)."""

    batch: list[_Leased]
    superseded: bool


# built once (catalog.sql says why): which of a batch's segments the receiver's list holds already
_LISTED = select(m.Segment.segment_id).where(
    m.Segment.placement_id == bindparam("placement"), m.Segment.segment_id.in_(bindparam("segments", expanding=True))
)


def _receiver_commit(ctx: _Context, batch: list[_Leased]) -> _Commit:
    """The receiver registers the copied segments in order, moving its root conditionally, notes that the
    sender holds each, and drops the leases: one transaction for the batch (all of one partition). Commits
    nothing if the placement is gone or leadership changed since the decision (the offer is stale:
    superseded), or if the chain moved under us (a concurrent execution of this round won; its next offer
    is answered SEGMENT_EXISTS)."""
    first = batch[0]
    try:
        with ctx.write() as s:
            part = q.locked_partition(s, first.partition_id)
            replica = q.placement(s, first.replica_id)
            if part is None or replica is None or replica.removed_us is not None:
                return _Commit([], superseded=True)
            if part.leader_placement_id != first.leader_id or part.epoch != first.epoch:
                return _Commit([], superseded=True)
            listed = {"placement": first.replica_id, "segments": [b.segment.segment_id for b in batch]}
            present = set(s.scalars(_LISTED, listed))
            now = hlc.now_us()
            start = replica.root_segment_id
            root = start
            rows = []
            for leased in batch:
                seg = leased.segment
                if seg.segment_id not in present:
                    if root != leased.expected_root:  # what register_segment's conditional root move refuses
                        raise ConflictError(
                            f"placement {replica.placement_id}: root moved while writing {seg.segment_id}"
                        )
                    facts = FileFacts(seg.byte_size, seg.sha256, seg.crc64nvme)
                    rows.append(segment_values(leased.entry, replica.placement_id, seg.relpath, facts, now))
                    root = seg.segment_id
                elif root == leased.expected_root:  # (a segment's expected root is the one before it)
                    # Listed here already but off the chain: a major this replica held before another leader's
                    # major became its root, now offered again by a leader whose chain lacks that one. The
                    # fast-forward links it again (skipping it left the root behind: every later segment of
                    # the batch then conflicted, round after round).
                    root = seg.segment_id
                # else a concurrent execution of this round registered it and moved the root on already
            insert_segments(s, rows)
            if root is not None and root != start:  # one conditional move for the batch, from the root read above
                move_root_to(s, replica.placement_id, root, expected_root=start)
            receiver_acks = {(b.replica_id, b.segment.segment_id, h) for b in batch for h in (b.leader_id, b.sender_id)}
            ls.record_acks(s, sorted(receiver_acks), now)
            ls.release_many(s, first.replica_id, [b.segment.segment_id for b in batch], ctx.key)
    except ConflictError:
        return _Commit([], superseded=False)
    return _Commit(batch, superseded=False)


def _whole_prefix(batch: list[_Leased]) -> list[_Leased]:
    """The longest prefix of a batch after which the replica's chain is whole (``offers.whole_cuts``): what
    may be committed of a batch cut short. A decided batch always ends where it is whole."""
    n = len(batch)
    while n and not batch[n - 1].whole:
        n -= 1
    return batch[:n]


def _sender_acks(batch: list[_Leased]) -> list[tuple[int, str, int]]:
    """(holder, segment, target) acks for a committed batch: the sender's, and in a cascade the leader's too
    (an ack says the target holds the segment: the leader's GC, checkpoints and safe time read its own)."""
    acks = {(h, b.segment.segment_id, b.replica_id) for b in batch for h in (b.leader_id, b.sender_id)}
    return sorted(acks)


def _release_replica(ctx: _Context, replica_id: int) -> None:
    """Drop every lease this round holds on a replica placement (its target failed: a retry leases anew)."""
    with ctx.write() as s:
        ls.drop_leases(s, targets=replica_id, holder=ctx.key)


def _release_all(ctx: _Context, batch: list[_Leased]) -> None:
    with ctx.write() as s:
        for replica_id in {b.replica_id for b in batch}:
            ids = [b.segment.segment_id for b in batch if b.replica_id == replica_id]
            ls.release_many(s, replica_id, ids, ctx.key)
