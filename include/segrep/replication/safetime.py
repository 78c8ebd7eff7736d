"""Checkpoints and safe time, derived from acks (DESIGN section 2; xCluster's cdc_state and safe time).

Checkpoint (partition, target placement): the newest segment of the leader's offer order up to which the
target has acked everything, and that segment's newest row version.

Safe time (table, target site): every write committed at the leader at or before it is readable at the
target. For a round ending at ``end``, a partition vouches for ``end - 1``, or only for the instant before
the oldest row version among the leader's visible segments the target still lacks if that is earlier (a row
is stamped before it commits, so any write committed at or before that instant lies in an acked segment).
Segments committed after ``end`` count too: a major or a merge output committed later holds older rows.
So do the forks replicas hold that the leader has not merged yet (written while they led), for every replica
and for the leader's own site where it follows other partitions, except those a failover gave up
(``on_return: merge``) at a site the round found down: only that old leader holds them, and no safe time
claims their rows until they are merged (``segrep status`` names them: "unmerged at <site>").
While a split parent is in UNLOAD, its rows that the children still lack bound every site too.
The table's safe time is the minimum over partitions, and it only ever moves forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import bindparam, select, tuple_, update
from sqlalchemy.orm import Session

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.snapshot import PartitionSnapshot, snapshot
from segrep.catalog.splits import unload_safe_bound
from segrep.catalog.sql import ignoring_insert, insert_ignore
from segrep.core import hlc
from segrep.core.chain import is_referenced, newest_major, visible_segments
from segrep.core.states import PlacementState
from segrep.replication.offers import pushes_from
from segrep.replication.reports import PlanSummary
from segrep.replication.round import round_row


def partition_vouches(
    part: PartitionSnapshot, replica: m.Placement, end_us: int, down: frozenset[int] = frozenset()
) -> tuple[str | None, int, int]:
    """(checkpoint segment id, checkpoint max version, safe time this partition vouches for at the replica);
    ``down``: the sites found down this round (``leader_vouches``)."""
    acked = part.acked_by(part.leader, replica)
    checkpoint: m.Segment | None = None
    contiguous = True
    safe = end_us - 1
    for ref in visible_segments(part.chain(part.leader)):
        seg = part.segment(part.leader.placement_id, ref.segment_id)
        if seg.segment_id in acked:
            if contiguous:
                checkpoint = seg
            continue
        contiguous = False
        # Every segment it lacks counts, even one committed at or after ``end``: a major or merge output
        # committed after the interval still carries rows written (and committed elsewhere) before it.
        safe = min(safe, seg.min_version - 1)
    # A fork a replica wrote while it led is not merged (nor replicated) yet: its writes were committed at the
    # leader of the time, and the other replicas cannot read them (the replica that wrote it keeps it on its
    # chain: it is offered nothing that would take the fork off before the leader has merged it, offers.py).
    safe = min(safe, leader_vouches(part, down))
    if checkpoint is None:
        return None, 0, safe
    return checkpoint.segment_id, checkpoint.max_version, safe


def leader_vouches(part: PartitionSnapshot, down: frozenset[int] = frozenset()) -> int:
    """The safe time a partition vouches for at its leader's site: the instant before the oldest write the
    leader has not merged yet (forks its followers wrote while they led), else no bound. The forks a failover
    gave up (``on_return: merge``) held at a site found ``down`` this round do not count: only that site
    holds them, and their rows are outside every claim until the merge output brings them, which then bounds
    each site until it holds it (``partition_vouches``). Counted, an old leader down for hours froze every
    healthy replica's safe time with it. Once it is back they count again until merged (a round or so):
    a safe-time cut (``failover --at safe-time``) must not pass rows a site can read and merge."""
    safe = hlc.FOREVER_US
    for follower in part.replicas:
        away = follower.site_id in down
        for seg in pushes_from(part, follower, hlc.FOREVER_US):
            if not (away and seg.segment_id in part.gave_up):
                safe = min(safe, seg.min_version - 1)
    return safe


def leader_safe_time(catalog: Catalog, table: str, site: str) -> int | None:
    """The safe time of a site that leads every serving partition of ``table`` it holds, as rounds bound a
    leader (:func:`leader_vouches`: the instant before the oldest write a follower holds that the leader has
    not merged; a split parent's rows its children lack), else the newest version it leads; None for a site
    that follows some partition (its safe time is the one rounds record) or holds none. What the published
    snapshots claim. Only partitions with unsettled entries can hold an unmerged fork (``active_only``)."""
    with catalog.read() as s:
        info = q.table_info(s, table)
        site_id = q.site_by_name(s, site).site_id
        parts = q.serving_partitions(s, info)
        leaders = {p.leader_placement_id for p in parts}
        placements = q.active_placements(s, [p.partition_id for p in parts])
        mine = [pl for pl in placements if pl.site_id == site_id]
        if not mine or any(pl.placement_id not in leaders for pl in mine):
            return None
        led = {pl.partition_id for pl in mine}
        # only a partition with a follower can hold a fork (leader_vouches reads the followers' lists): a site
        # that alone holds what it leads reads no segment list here
        followed = {pl.partition_id for pl in placements if pl.partition_id in led and pl.site_id != site_id}
        snap = snapshot(s, table, active_only=True).partitions if followed else ()
        unloading = unload_safe_bound(s, info.table_id)
    safe = max(p.last_version for p in parts if p.partition_id in led)
    for part in snap:
        if part.partition.partition_id in followed:
            safe = min(safe, leader_vouches(part))
    return safe if unloading is None else min(safe, unloading)


@dataclass(frozen=True)
class SafeTimes:
    """Each target site's safe time after a commit, and the sites whose safe time that commit moved forward
    (a site's first safe time counts): what the round's Asset events announce."""

    times: dict[str, int]
    advanced: list[str]


def update_checkpoints_and_safe_time(
    catalog: Catalog, table: str, end_us: int, *, hold: frozenset[int] = frozenset()
) -> dict[str, int]:
    """:func:`advance_safe_times`' safe times."""
    return advance_safe_times(catalog, table, end_us, hold=hold).times


def advance_safe_times(catalog: Catalog, table: str, end_us: int, *, hold: frozenset[int] = frozenset()) -> SafeTimes:
    """Write the checkpoints of the partitions with unsettled entries, move their settled watermarks, and
    advance each target site's safe time; return the safe times. A settled partition has nothing pending
    anywhere, so it vouches for ``end - 1`` everywhere without being read. The sites in ``hold`` (found
    DOWN/UNIDENTIFIED by this round) keep the safe time they had. The sites the round's plan found down
    (``PlanSummary.down``) bound no site by the forks a failover gave up that they hold."""
    with catalog.write() as s:
        snap = snapshot(s, table, active_only=True)
        stored = round_row(s, snap.info.table_id, end_us).report or {}
        found_down = PlanSummary.from_dict(stored["plan"]).down if "plan" in stored else []
        down = frozenset(site.site_id for site in snap.sites.values() if site.name in found_down)
        now = hlc.now_us()
        candidate = dict.fromkeys(snap.replica_site_ids, end_us - 1)
        joined = False
        checkpoints: list[_Checkpoint] = []
        marks: list[dict[str, int]] = []
        for part in snap.partitions:
            for replica in part.replicas:
                seg_id, version, safe = partition_vouches(part, replica, end_us, down)
                checkpoints.append(_Checkpoint(part.partition.partition_id, replica.placement_id, seg_id, version))
                candidate[replica.site_id] = min(candidate.get(replica.site_id, safe), safe)
                joined |= _join_finalize(s, part, replica)
            if part.leader.site_id in candidate:  # a site that leads this partition and follows others
                candidate[part.leader.site_id] = min(candidate[part.leader.site_id], leader_vouches(part, down))
            marks += _settled_marks(part)
        _upsert_checkpoints(s, checkpoints, now)
        if marks:  # one UPDATE by primary key for every placement whose watermark moved
            s.execute(update(m.Placement), marks)
        joining = _joining_sites(s, snap.info.table_id) if joined else snap.joining_site_ids
        unloading = unload_safe_bound(s, snap.info.table_id)
        out: dict[str, int] = {}
        moved: list[str] = []
        for site_id, safe in candidate.items():
            if unloading is not None:
                safe = min(safe, unloading)
            if (
                site_id in hold
                or site_id in joining
                or site_id in snap.stalled_site_ids
                or snap.rollback_pending(site_id)
                or snap.unmerged_held(site_id)
            ):
                continue  # a site found down is unknown; a joining replica is not readable yet; one that needs a
                # bootstrap is stuck; an old leader still listing what its failover gave up serves rows the table
                # no longer has (or, not merged yet, rows that may lose to newer ones): its safe time waits
            name = snap.sites[site_id].name
            out[name], advanced = _advance(s, snap.info.table_id, site_id, safe, now)
            if advanced:
                moved.append(name)
    return SafeTimes(out, sorted(moved))


def _join_finalize(s: Session, part: PartitionSnapshot, replica: m.Placement) -> bool:
    """JOIN_FINALIZE: a JOINING replica that holds the leader's newest segment (its root) becomes LIVE."""
    if replica.state != PlacementState.JOINING:
        return False
    root = part.leader.root_segment_id
    if root is not None and replica.placement_id not in part.acks.get((part.leader.placement_id, root), ()):
        return False
    s.execute(
        update(m.Placement)
        .where(m.Placement.placement_id == replica.placement_id)
        .values(state=str(PlacementState.LIVE))
        .execution_options(synchronize_session=False)
    )
    replica.state = PlacementState.LIVE
    return True


def _joining_sites(s: Session, table_id: int) -> set[int]:
    rows = s.scalars(
        select(m.Placement.site_id)
        .join(m.Partition, m.Partition.partition_id == m.Placement.partition_id)
        .where(
            m.Partition.table_id == table_id,
            m.Placement.removed_us.is_(None),
            m.Placement.state == str(PlacementState.JOINING),
        )
    )
    return set(rows)


def settled_prefix(part: PartitionSnapshot, placement: m.Placement) -> int:
    """The entry id up to which this placement's list needs no more replication work, or 0.

    Leader: a visible segment every replica acked, or one behind (or folded into) a major every replica
    acked. Follower: a segment the leader holds or acked. A leader's fork is never settled. The snapshot holds
    the entries past the current watermark, so the new one continues from it.
    """
    old = placement.settled_entry_id if placement.settled_epoch == part.partition.epoch else 0
    segs = [x for x in part.segments.get(placement.placement_id, []) if x.entry_id > old]
    is_leader = placement.placement_id == part.leader.placement_id
    # a leader's entries wait for every replica; a feeder's (a cascade) also for the replicas it feeds
    offered = part.replicas if is_leader else part.fed_by(placement)
    offered_by_all = _offered_by_all(part, placement, [r.placement_id for r in offered])
    if is_leader:

        def settled(seg: m.Segment) -> bool:
            return offered_by_all(seg) is True
    else:
        leader_has = {x.segment_id for x in part.segments.get(part.leader.placement_id, [])}

        def settled(seg: m.Segment) -> bool:
            acked = part.leader.placement_id in part.acks.get((placement.placement_id, seg.segment_id), ())
            return (seg.segment_id in leader_has or acked) and offered_by_all(seg) is not False

    mark = old
    for seg in segs:
        if not settled(seg):
            break
        mark = seg.entry_id
    return mark


def _offered_by_all(
    part: PartitionSnapshot, sender: m.Placement, targets: list[int]
) -> Callable[[m.Segment], bool | None]:
    """Whether every placement in ``targets`` has what ``sender`` offers of a segment: the segment itself if
    visible, or a major covering it if it is behind one; None for a segment never offered (a fork)."""
    chain = part.chain(sender)
    visible = {r.segment_id for r in visible_segments(chain)}
    major = newest_major(chain)

    def by_all(segment_id: str) -> bool:
        return all(t in part.acks.get((sender.placement_id, segment_id), ()) for t in targets)

    def check(seg: m.Segment) -> bool | None:
        if seg.segment_id in visible:
            return by_all(seg.segment_id)
        if is_referenced(chain, seg.segment_id):
            return major is not None and by_all(major.segment_id)
        return None

    return check


def _settled_marks(part: PartitionSnapshot) -> list[dict[str, int]]:
    """The placements of the partition whose settled watermark moves, each with its new watermark: rows of
    one UPDATE by primary key."""
    epoch = part.partition.epoch
    out = []
    for placement in (part.leader, *part.replicas):
        mark = settled_prefix(part, placement)
        if (placement.settled_entry_id, placement.settled_epoch) != (mark, epoch):
            out.append({"placement_id": placement.placement_id, "settled_entry_id": mark, "settled_epoch": epoch})
    return out


@dataclass(frozen=True)
class _Checkpoint:
    partition_id: int
    target_id: int
    segment_id: str | None
    max_version: int


def _upsert_checkpoints(s: Session, wanted: list[_Checkpoint], now: int) -> None:
    """Write each checkpoint: the missing rows inserted in one statement, then every row read back under a lock
    (one query) and changed where it differs. The INSERT's own answer is not used: PostgreSQL drivers may
    report no row count for an INSERT (SQLAlchemy gives -1)."""
    if not wanted:
        return
    rows = [
        {"partition_id": c.partition_id, "target_placement_id": c.target_id, "segment_id": c.segment_id}
        | {"max_version": c.max_version, "updated_us": now}
        for c in wanted
    ]
    s.execute(ignoring_insert(s, m.Checkpoint), rows)
    keys = sorted({(c.partition_id, c.target_id) for c in wanted})
    held = {(row.partition_id, row.target_placement_id): row for row in s.scalars(_CHECKPOINTS_LOCKED, {"keys": keys})}
    for c in wanted:
        row = held[(c.partition_id, c.target_id)]  # inserted above or already there, and now locked
        if c.segment_id is None and row.segment_id is not None:
            continue  # only unsettled entries were read: none acked yet says nothing about the settled ones
        if (row.segment_id, row.max_version) != (c.segment_id, c.max_version):
            row.segment_id, row.max_version, row.updated_us = c.segment_id, c.max_version, now


# built once (catalog.sql says why): every round commit runs these
_CHECKPOINTS_LOCKED = (
    select(m.Checkpoint)
    .where(tuple_(m.Checkpoint.partition_id, m.Checkpoint.target_placement_id).in_(bindparam("keys", expanding=True)))
    .with_for_update()
    .execution_options(populate_existing=True)
)
_SAFE_TIME_LOCKED = (
    select(m.SafeTime)
    .where(m.SafeTime.table_id == bindparam("table_id"), m.SafeTime.site_id == bindparam("site_id"))
    .with_for_update()
    .execution_options(populate_existing=True)
)


def _advance(s: Session, table_id: int, site_id: int, safe: int, now: int) -> tuple[int, bool]:
    """Raise the stored safe time to ``safe`` if that is later (never lower it); return the stored value and
    whether this call set it (a first safe time, or a later one)."""
    values = {"table_id": table_id, "site_id": site_id, "safe_time_us": safe, "updated_us": now}
    inserted = insert_ignore(s, m.SafeTime, values)
    row = s.scalars(_SAFE_TIME_LOCKED, {"table_id": table_id, "site_id": site_id}).one()
    if safe > row.safe_time_us:
        row.safe_time_us, row.updated_us = safe, now
        return row.safe_time_us, True
    return row.safe_time_us, inserted
