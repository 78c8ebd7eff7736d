"""A consistent read of one table's replication state: partitions, placements, segment lists and acks.

The planner, the fast-forward, safe time, compaction, GC and status all decide over this one structure, read
in one transaction (set-based: a fixed number of round trips whatever the number of partitions). Planning
reads only partitions with unsettled list entries, so its cost follows new segments, not the table's size.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Select, bindparam, case, func, or_, select
from sqlalchemy.orm import Session, aliased

from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.core.chain import Chain
from segrep.core.states import PartitionState, PlacementState

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
    # segments a failover with ``on_return: rollback`` gave up: never pushed to a leader again (the old
    # leader's return sets their rows aside; replication.rollback)
    set_aside: frozenset[str] = frozenset()
    # segments a failover with ``on_return: merge`` gave up: only the old leader holds them until they are
    # pushed and merged, so no safe time covers their rows before the merge output brings them (safetime.py)
    gave_up: frozenset[str] = frozenset()

    def chain(self, placement: m.Placement) -> Chain:
        """The placement's chain; a follower's as it will be once set-aside segments are rolled back."""
        chain = q.chain_of(placement, self.segments.get(placement.placement_id, []))
        if self.set_aside and placement.placement_id != self.leader.placement_id:
            return chain.without(self.set_aside)
        return chain

    def sender_of(self, replica: m.Placement) -> m.Placement:
        """Who offers ``replica`` its segments: its feeder's placement for a cascaded replica (DESIGN 12),
        else the leader. The leader also feeds it while its feeder has fallen back (down too long), or when the
        feeder's placement cannot feed (it leads this partition, is not receiving, or needs a bootstrap)."""
        if replica.feeder_site_id is None or replica.feeder_fallback_us is not None:
            return self.leader
        feeder = next(
            (pl for pl in self.replicas if pl.site_id == replica.feeder_site_id and not pl.needs_bootstrap), None
        )
        return self.leader if feeder is None else feeder

    def fed_by(self, sender: m.Placement) -> list[m.Placement]:
        """The replicas ``sender`` offers segments to."""
        return [r for r in self.replicas if self.sender_of(r).placement_id == sender.placement_id]

    def segment(self, placement_id: int, segment_id: str) -> m.Segment:
        return next(x for x in self.segments.get(placement_id, []) if x.segment_id == segment_id)

    def acked_by(self, holder: m.Placement, target: m.Placement) -> set[str]:
        """Ids of the holder's segments that ``target`` holds (acks are by placement id: EventQL 3.6)."""
        return {
            seg.segment_id
            for seg in self.segments.get(holder.placement_id, [])
            if target.placement_id in self.acks.get((holder.placement_id, seg.segment_id), ())
        }


@dataclass(frozen=True)
class ReplicaSites:
    """Which sites replicate the table at all (a table-wide fact: read only by a table-wide snapshot)."""

    replicas: frozenset[int]  # sites holding a replica of any partition
    joining: frozenset[int]  # ... of which some replica is still JOINING
    stalled: frozenset[int]  # ... or some replica needs a bootstrap


@dataclass
class TableSnapshot:
    """The partitions a round must look at, and (read table-wide) which sites replicate the table at all."""

    info: q.TableInfo
    sites: dict[int, m.Site]
    partitions: list[PartitionSnapshot]
    replica_sites: ReplicaSites | None = None  # None for a snapshot of chosen partitions

    @property
    def replica_site_ids(self) -> frozenset[int]:
        return self._replica_sites().replicas

    @property
    def joining_site_ids(self) -> frozenset[int]:
        return self._replica_sites().joining

    @property
    def stalled_site_ids(self) -> frozenset[int]:
        return self._replica_sites().stalled

    def _replica_sites(self) -> ReplicaSites:
        if self.replica_sites is None:
            raise RuntimeError("a snapshot of chosen partitions does not read which sites replicate the table")
        return self.replica_sites

    def rollback_pending(self, site_id: int) -> int:
        """How many segments a failover gave up (``on_return: rollback``) the site's placements still list:
        until they are rolled back its reads are not the table's (its safe time waits, its target fails)."""
        return sum(
            1
            for part in self.partitions
            for pl in part.replicas
            if pl.site_id == site_id
            for seg in part.segments.get(pl.placement_id, [])
            if seg.segment_id in part.set_aside
        )

    def unmerged_held(self, site_id: int) -> int:
        """How many segments a failover gave up (``on_return: merge``) the site's placements still list and the
        leader has not merged: until it has, that site serves rows the table may not keep (LWW)."""
        return sum(
            1
            for part in self.partitions
            for pl in part.replicas
            if pl.site_id == site_id
            for seg in part.segments.get(pl.placement_id, [])
            if seg.segment_id in part.gave_up
            and part.leader.placement_id not in part.acks.get((pl.placement_id, seg.segment_id), ())
        )

    def site_id(self, name: str) -> int:
        for site in self.sites.values():
            if site.name == name:
                return site.site_id
        raise KeyError(name)


# A placement's settled watermark; one set under an older leader epoch counts as 0
_WATERMARK = case((m.Placement.settled_epoch == m.Partition.epoch, m.Placement.settled_entry_id), else_=0)


def unsettled_partitions(table_id: int | ColumnElement[int]) -> Select[int]:
    """Ids of the table's partitions where some placement has list entries past its settled watermark (a
    watermark set under an older leader epoch counts as 0). Answered from the (placement, entry) index."""
    pl, pa, sg = m.Placement, m.Partition, m.Segment
    unsettled = select(sg.entry_id).where(sg.placement_id == pl.placement_id, sg.entry_id > _WATERMARK).exists()
    return (
        select(pl.partition_id)
        .join(pa, pa.partition_id == pl.partition_id)
        .where(pa.table_id == table_id, pl.removed_us.is_(None), unsettled)
        .distinct()
    )


# built once (catalog.sql says why): every offer of a round reads one partition
_PARTITIONS = select(m.Partition).where(
    m.Partition.table_id == bindparam("table_id"), m.Partition.state.in_([str(x) for x in REPLICATING_STATES])
)
_CHOSEN_PARTITIONS = _PARTITIONS.where(m.Partition.partition_id.in_(bindparam("ids", expanding=True)))
_ACTIVE_PARTITIONS = _PARTITIONS.where(m.Partition.partition_id.in_(unsettled_partitions(bindparam("table_id"))))


_FRESH_ENTRIES = (
    select(m.Segment)
    .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
    .join(m.Partition, m.Partition.partition_id == m.Placement.partition_id)
    .where(m.Segment.placement_id.in_(bindparam("ids", expanding=True)), m.Segment.entry_id > _WATERMARK)
    .order_by(m.Segment.entry_id)
)
_ACKS_OF_ENTRIES = select(m.Ack.holder_placement_id, m.Ack.segment_id, m.Ack.target_placement_id).where(
    m.Ack.holder_placement_id.in_(bindparam("holders", expanding=True)),
    m.Ack.segment_id.in_(bindparam("segments", expanding=True)),
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
    for seg in s.scalars(_FRESH_ENTRIES, {"ids": list(marks)}):
        out[seg.placement_id].append(seg)
    loaded = [(seg.placement_id, seg.segment_id) for segs in out.values() for seg in segs]
    for off in range(0, len(loaded), 5000):  # bounded IN lists
        chunk = loaded[off : off + 5000]
        holders, segments = sorted({h for h, _ in chunk}), sorted({x for _, x in chunk})
        for holder, seg_id, target in s.execute(_ACKS_OF_ENTRIES, {"holders": holders, "segments": segments}):
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
    if partition_ids is not None:
        query, params = _CHOSEN_PARTITIONS, {"table_id": info.table_id, "ids": partition_ids}
    else:
        query, params = (_ACTIVE_PARTITIONS if active_only else _PARTITIONS), {"table_id": info.table_id}
    parts = q.sort_partitions(info, list(s.scalars(query, params)))
    placements = q.active_placements(s, [p.partition_id for p in parts])
    by_partition: dict[int, list[m.Placement]] = defaultdict(list)
    for pl in placements:
        by_partition[pl.partition_id].append(pl)
    ids = [pl.placement_id for pl in placements]
    if active_only and partition_ids is None:
        segments, acks = _unsettled_entries(s, placements, {p.partition_id: p.epoch for p in parts})
    else:
        segments, acks = q.segments_of(s, ids), q.acks_of(s, ids)
    set_aside = frozenset(given_up_segments(s, info.table_id))
    gave_up = frozenset(given_up_segments(s, info.table_id, "merge"))
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
        out.append(PartitionSnapshot(part, leader, replicas, segments, acks, set_aside, gave_up))
    # which sites replicate the table: a table-wide query, left out of a read of chosen partitions (each
    # fast-forward offer reads its partition)
    sites = None if partition_ids is not None else replica_sites(s, info.table_id)
    return TableSnapshot(info, q.sites_by_id(s), out, sites)


def receiving_replicas(s: Session, info: q.TableInfo, site_id: int, *, active_only: bool = False) -> list[m.Placement]:
    """The placements at ``site_id`` that a fast-forward offers segments to, partitions in key order: the
    replicas a snapshot of the table would list for that site (a replicating partition with a leader; a
    receiving placement that is not the leader and needs no bootstrap), read in one query without their
    segment lists and acks (each partition's offers read those in full: the fast-forward's set-up needs
    only which placements to run). ``active_only`` as in :func:`snapshot`."""
    query = _ACTIVE_RECEIVING if active_only else _RECEIVING
    rows = s.execute(query, {"table_id": info.table_id, "site_id": site_id}).all()
    order = {p.partition_id: n for n, p in enumerate(q.sort_partitions(info, [p for _, p in rows]))}
    return [placement for placement, _ in sorted(rows, key=lambda row: order[row[1].partition_id])]


_LEADER = aliased(m.Placement)
_RECEIVING = (
    select(m.Placement, m.Partition)
    .join(m.Partition, m.Partition.partition_id == m.Placement.partition_id)
    .join(_LEADER, _LEADER.placement_id == m.Partition.leader_placement_id)
    .where(
        m.Partition.table_id == bindparam("table_id"),
        m.Partition.state.in_([str(x) for x in REPLICATING_STATES]),
        _LEADER.removed_us.is_(None),
        m.Placement.site_id == bindparam("site_id"),
        m.Placement.removed_us.is_(None),
        m.Placement.placement_id != m.Partition.leader_placement_id,
        m.Placement.state.in_([str(x) for x in RECEIVING_STATES]),
        m.Placement.needs_bootstrap.is_(False),
    )
    .order_by(m.Placement.placement_id)
)
_ACTIVE_RECEIVING = _RECEIVING.where(m.Partition.partition_id.in_(unsettled_partitions(bindparam("table_id"))))


def given_up_held(s: Session, table_id: int, placement_ids: list[int]) -> int:
    """How many list entries of these placements are segments a failover with ``on_return: rollback`` gave
    up (``TableSnapshot.rollback_pending`` for a site's placements, without reading their lists: counted in
    the catalog, a few given-up ids against however long the lists are)."""
    given_up = sorted(given_up_segments(s, table_id))
    if not given_up or not placement_ids:
        return 0
    chunks = (given_up[off : off + 5000] for off in range(0, len(given_up), 5000))  # bounded IN lists
    return sum(s.scalar(_HELD, {"placements": placement_ids, "segments": chunk}) or 0 for chunk in chunks)


_HELD = (
    select(func.count())
    .select_from(m.Segment)
    .where(
        m.Segment.placement_id.in_(bindparam("placements", expanding=True)),
        m.Segment.segment_id.in_(bindparam("segments", expanding=True)),
    )
)


_REPLICA_SITES = (
    select(m.Placement.site_id, m.Placement.state, m.Placement.needs_bootstrap)
    .join(m.Partition, m.Partition.partition_id == m.Placement.partition_id)
    .where(
        m.Partition.table_id == bindparam("table_id"),
        m.Partition.state.in_([str(x) for x in REPLICATING_STATES]),
        m.Placement.removed_us.is_(None),
        m.Placement.state.in_([str(x) for x in RECEIVING_STATES]),
        or_(m.Partition.leader_placement_id.is_(None), m.Partition.leader_placement_id != m.Placement.placement_id),
    )
    .distinct()
)


def replica_sites(s: Session, table_id: int) -> ReplicaSites:
    """The sites holding a receiving replica of some replicating partition of the table (one query)."""
    rows = s.execute(_REPLICA_SITES, {"table_id": table_id}).all()
    return ReplicaSites(
        frozenset(site_id for site_id, _, _ in rows),
        frozenset(site_id for site_id, state, _ in rows if state != PlacementState.LIVE),
        frozenset(site_id for site_id, _, stalled in rows if stalled),
    )


_LOSSES = select(m.Failover.failover_id, m.Failover.loss).where(
    m.Failover.table_id == bindparam("table_id"), m.Failover.on_return == bindparam("on_return")
)


def given_up_segments(s: Session, table_id: int, on_return: str = "rollback") -> dict[str, int]:
    """The segments the table's failovers with this ``on_return`` policy gave up, each with that failover's
    id."""
    found = s.execute(_LOSSES, {"table_id": table_id, "on_return": on_return}).all()
    return {sid: fid for fid, loss in found for x in loss or () for sid in x["segment_ids"]}
