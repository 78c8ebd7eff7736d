"""Planning a replication round: what each target is offered and what it will answer (DESIGN section 7).

The planner reads one consistent snapshot of a table (partitions, placements, segment lists, acks, leases)
and simulates EventQL 3.5 with the pure functions of :mod:`segrep.core.protocol`: for every (partition, replica)
the leader's offers in order with the receiver's predicted decision, and for every follower the segments the
leader lacks (pushed, then merged). The plan is advice for reports and for deciding whether Spark is needed;
every task re-decides inside its own transaction, so a stale plan can never commit anything wrong.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from sqlalchemy import Select, case, or_, select
from sqlalchemy.orm import Session

from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.core.chain import Chain, offer_order
from segrep.core.protocol import (
    MAX_REPL_INCOMING_SEGMENTS,
    Offer,
    Outcome,
    PartitionState,
    PlacementState,
    Reaction,
    ReceiverView,
    apply_fast_forward,
    receive_decision,
    sender_reaction,
)

REPLICATING_STATES = (PartitionState.LOADING, PartitionState.LIVE, PartitionState.SPLITTING)
RECEIVING_STATES = (PlacementState.JOINING, PlacementState.LIVE)


@dataclass
class PartitionSnapshot:
    """One partition with its active placements, their segment lists, and the acks they hold."""

    partition: m.Partition
    leader: m.Placement
    replicas: list[m.Placement]
    segments: dict[int, list[m.Segment]]
    acks: dict[tuple[int, str], set[int]]

    def chain(self, placement: m.Placement) -> Chain:
        return q.chain_of(placement, self.segments.get(placement.placement_id, []))

    def segment(self, placement_id: int, segment_id: str) -> m.Segment:
        return next(x for x in self.segments.get(placement_id, []) if x.segment_id == segment_id)

    def acked_by(self, holder: m.Placement, target: m.Placement) -> set[str]:
        """Ids of the holder's segments that ``target`` holds (acks are by placement id: EventQL 3.6)."""
        return {
            seg.segment_id
            for seg in self.segments.get(holder.placement_id, [])
            if target.placement_id in self.acks.get((holder.placement_id, seg.segment_id), ())
        }


@dataclass
class TableSnapshot:
    """The partitions a round must look at, and which sites replicate the table at all."""

    info: q.TableInfo
    sites: dict[int, m.Site]
    partitions: list[PartitionSnapshot]
    replica_site_ids: set[int] = field(default_factory=set)  # sites holding a replica of any partition
    joining_site_ids: set[int] = field(default_factory=set)  # ... of which some replica is still JOINING
    stalled_site_ids: set[int] = field(default_factory=set)  # ... or some replica needs a bootstrap

    def site_id(self, name: str) -> int:
        for site in self.sites.values():
            if site.name == name:
                return site.site_id
        raise KeyError(name)


def unsettled_partitions(table_id: int) -> Select[tuple[int]]:
    """Ids of the table's partitions where some placement has list entries past its settled watermark (a
    watermark set under an older leader epoch counts as 0). Answered from the (placement, entry) index."""
    pl, pa, sg = m.Placement, m.Partition, m.Segment
    watermark = case((pl.settled_epoch == pa.epoch, pl.settled_entry_id), else_=0)
    unsettled = select(sg.entry_id).where(sg.placement_id == pl.placement_id, sg.entry_id > watermark).exists()
    return (
        select(pl.partition_id)
        .join(pa, pa.partition_id == pl.partition_id)
        .where(pa.table_id == table_id, pl.removed_us.is_(None), unsettled)
        .distinct()
    )


def _unsettled_entries(
    s: Session, placements: list[m.Placement], epochs: dict[int, int]
) -> tuple[dict[int, list[m.Segment]], dict[tuple[int, str], set[int]]]:
    """Only the list entries past each placement's settled watermark, and the acks those entries hold.

    Everything at or below a watermark is acked by every replica (leader) or held by the leader (follower),
    so it can produce no offer, push or pending segment; leaving it out makes a round's reads follow new
    segments, not history. A chain walked over these entries stops where the settled part begins."""
    out: dict[int, list[m.Segment]] = defaultdict(list)
    acks: dict[tuple[int, str], set[int]] = defaultdict(set)
    marks = {
        pl.placement_id: pl.settled_entry_id if pl.settled_epoch == epochs.get(pl.partition_id) else 0
        for pl in placements
    }
    if not marks:
        return out, acks
    pl = m.Placement
    watermark = case((pl.settled_epoch == m.Partition.epoch, pl.settled_entry_id), else_=0)
    fresh = (
        select(m.Segment)
        .join(pl, pl.placement_id == m.Segment.placement_id)
        .join(m.Partition, m.Partition.partition_id == pl.partition_id)
        .where(m.Segment.placement_id.in_(list(marks)), m.Segment.entry_id > watermark)
        .order_by(m.Segment.entry_id)
    )
    for seg in s.scalars(fresh):
        out[seg.placement_id].append(seg)
    loaded = [(seg.placement_id, seg.segment_id) for segs in out.values() for seg in segs]
    for off in range(0, len(loaded), 5000):  # bounded IN lists
        chunk = loaded[off : off + 5000]
        rows = s.execute(
            select(m.Ack.holder_placement_id, m.Ack.segment_id, m.Ack.target_placement_id).where(
                m.Ack.holder_placement_id.in_({h for h, _ in chunk}), m.Ack.segment_id.in_({x for _, x in chunk})
            )
        )
        for holder, seg_id, target in rows:
            acks[(holder, seg_id)].add(target)
    return out, acks


def snapshot(
    s: Session,
    table: str,
    partition_ids: list[int] | None = None,
    *,
    active_only: bool = False,
    include_stalled: bool = False,
) -> TableSnapshot:
    """Read everything a round needs about ``table`` in a few set-based queries.

    ``active_only`` restricts it to partitions with unsettled entries (see :func:`unsettled_partitions`), and
    their lists to the unsettled entries (:func:`_unsettled_entries`): every other partition and entry has
    nothing to offer, push or merge, so a round's reads follow new segments. Decisions that need whole
    chains (each fast-forward batch, GC) read single partitions in full (``partition_ids``).
    Replicas marked ``needs_bootstrap`` (out of retention) get no offers and push nothing until they are
    re-bootstrapped; ``include_stalled`` keeps them (GC and status look at them).
    """
    info = q.table_info(s, table)
    query = select(m.Partition).where(
        m.Partition.table_id == info.table_id, m.Partition.state.in_([str(x) for x in REPLICATING_STATES])
    )
    if partition_ids is not None:
        query = query.where(m.Partition.partition_id.in_(partition_ids))
    elif active_only:
        query = query.where(m.Partition.partition_id.in_(unsettled_partitions(info.table_id)))
    parts = q.sort_partitions(info, list(s.scalars(query)))
    placements = q.active_placements(s, [p.partition_id for p in parts])
    by_partition: dict[int, list[m.Placement]] = defaultdict(list)
    for pl in placements:
        by_partition[pl.partition_id].append(pl)
    ids = [pl.placement_id for pl in placements]
    if active_only and partition_ids is None:
        segments, acks = _unsettled_entries(s, placements, {p.partition_id: p.epoch for p in parts})
    else:
        segments, acks = q.segments_of(s, ids), q.acks_of(s, ids)
    out = []
    for part in parts:
        pls = by_partition.get(part.partition_id, [])
        leader = next((pl for pl in pls if pl.placement_id == part.leader_placement_id), None)
        if leader is None:
            continue  # no leader (a partition being set up): nothing can be replicated yet
        replicas = [
            pl
            for pl in pls
            if pl is not leader and pl.state in RECEIVING_STATES and (include_stalled or not pl.needs_bootstrap)
        ]
        out.append(PartitionSnapshot(part, leader, replicas, segments, acks))
    replica_rows = s.execute(
        select(m.Placement.site_id, m.Placement.state, m.Placement.needs_bootstrap)
        .join(m.Partition, m.Partition.partition_id == m.Placement.partition_id)
        .where(
            m.Partition.table_id == info.table_id,
            m.Partition.state.in_([str(x) for x in REPLICATING_STATES]),
            m.Placement.removed_us.is_(None),
            m.Placement.state.in_([str(x) for x in RECEIVING_STATES]),
            or_(m.Partition.leader_placement_id.is_(None), m.Partition.leader_placement_id != m.Placement.placement_id),
        )
        .distinct()
    ).all()
    return TableSnapshot(
        info,
        q.sites_by_id(s),
        out,
        {site_id for site_id, _, _ in replica_rows},
        {site_id for site_id, state, _ in replica_rows if state != PlacementState.LIVE},
        {site_id for site_id, _, stalled in replica_rows if stalled},
    )


@dataclass(frozen=True)
class PlannedOffer:
    partition_id: int
    segment_id: str
    outcome: Outcome
    byte_size: int


@dataclass
class TargetPlan:
    """The predicted offers from leaders to one target site, and whether a replica is stuck (needs a major)."""

    site: str
    offers: list[PlannedOffer] = field(default_factory=list)
    needs_major: list[int] = field(default_factory=list)  # partitions whose replica here cannot fast-forward

    @property
    def outcomes(self) -> dict[str, int]:
        return dict(Counter(str(o.outcome) for o in self.offers))

    @property
    def fast_forward_bytes(self) -> int:
        return sum(o.byte_size for o in self.offers if o.outcome == Outcome.FAST_FORWARD)


@dataclass(frozen=True)
class PlannedPush:
    """A follower's segment that the leader lacks, and the leader's predicted answer."""

    partition_id: int
    follower_placement_id: int
    segment_id: str
    outcome: Outcome


def offers_to(
    part: PartitionSnapshot,
    replica: m.Placement,
    end_us: int,
    *,
    in_flight: frozenset[str] = frozenset(),
    max_incoming: int = MAX_REPL_INCOMING_SEGMENTS,
    reoffer: bool = False,
    restart: bool = True,
) -> tuple[list[tuple[m.Segment, Outcome]], bool]:
    """Simulate leader -> ``replica`` for one partition: the offers in order with their outcomes, and whether
    the replica is stuck (OUT_OF_ORDER again after the restart from the newest major: only a new major
    segment at the leader, which a follower always fast-forwards, can unstick it). With ``restart`` off the
    simulation ends at the first OUT_OF_ORDER, for the engine to drop the acks itself."""
    leader_chain = part.chain(part.leader)
    chain = part.chain(replica)
    acked: set[str] = set() if reoffer else part.acked_by(part.leader, replica)
    epoch, leader_id = part.partition.epoch, part.leader.placement_id
    state = PartitionState(part.partition.state)
    out: list[tuple[m.Segment, Outcome]] = []
    restarted = False
    pending = _due(part, leader_chain, acked, end_us)
    i = 0
    while i < len(pending):
        seg = pending[i]
        view = ReceiverView(replica.placement_id, chain, False, state, leader_id, epoch, in_flight, max_incoming)
        ref = q.to_ref(seg)
        outcome = receive_decision(view, Offer(ref, leader_id, epoch))
        out.append((seg, outcome))
        reaction = sender_reaction(outcome)
        if reaction == Reaction.ACK:
            if outcome == Outcome.FAST_FORWARD:
                chain = apply_fast_forward(chain, ref)
            i += 1
        elif reaction == Reaction.RESTART:
            if not restart:
                break
            if restarted:
                return out, True
            restarted = True
            pending = _due(part, leader_chain, set(), end_us)
            i = 0
        else:
            break
    return out, False


def _due(part: PartitionSnapshot, leader_chain: Chain, acked: set[str], end_us: int) -> list[m.Segment]:
    """The offer order, cut at the first segment committed at or after the interval end (a later segment
    must never be offered before an earlier one, so nothing after the cut is offered either)."""
    out = []
    for ref in offer_order(leader_chain, acked):
        seg = part.segment(part.leader.placement_id, ref.segment_id)
        if seg.committed_us >= end_us:
            break
        out.append(seg)
    return out


def pushes_from(part: PartitionSnapshot, follower: m.Placement, end_us: int) -> list[m.Segment]:
    """A follower's segments that the current leader placement neither holds nor has acked, oldest first
    (written while the follower led, or received from an older leader): EventQL 3.5 follower procedure."""
    leader_has = {x.segment_id for x in part.segments.get(part.leader.placement_id, [])}
    acked = part.acked_by(follower, part.leader)
    return [
        seg
        for seg in part.segments.get(follower.placement_id, [])
        if seg.segment_id not in leader_has and seg.segment_id not in acked and seg.committed_us < end_us
    ]


def leader_decision(part: PartitionSnapshot, follower: m.Placement, seg: m.Segment, in_flight: frozenset[str],
                    max_incoming: int) -> Outcome:  # fmt: skip
    """The leader's answer to a pushed segment. A leader that holds nothing yet would fast-forward; the engine
    merges instead (into an empty partition every row wins, so the result is the same rows)."""
    view = ReceiverView(
        part.leader.placement_id,
        part.chain(part.leader),
        True,
        PartitionState(part.partition.state),
        part.leader.placement_id,
        part.partition.epoch,
        in_flight,
        max_incoming,
    )
    outcome = receive_decision(view, Offer(q.to_ref(seg), follower.placement_id, part.partition.epoch))
    return Outcome.MERGE if outcome == Outcome.FAST_FORWARD else outcome


def lease_map(s: Session, placement_ids: list[int], now_us: int) -> dict[int, frozenset[str]]:
    """Unexpired in-flight segment ids per target placement."""
    out: dict[int, set[str]] = defaultdict(set)
    if placement_ids:
        rows = s.execute(
            select(m.Lease.target_placement_id, m.Lease.segment_id).where(
                m.Lease.target_placement_id.in_(placement_ids), m.Lease.expires_us > now_us
            )
        )
        for pid, seg in rows:
            out[pid].add(seg)
    return {pid: frozenset(v) for pid, v in out.items()}
