"""What a leader move would cost, from the catalog alone (DESIGN section 11; TokuMX chooses the most advanced
replica): which site to promote, and exactly what it lacks of the current leader's rows.

The segment chain makes the loss exact: per partition, the segments on the leader's visible chain that the
new leader's chain does not reference (neither holds nor has folded into a major), with their rows, bytes and
row-version range. Nothing here touches a site's storage, so it answers while the leader's site is down.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from sqlalchemy import case, select
from sqlalchemy.orm import Session

from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.snapshot import RECEIVING_STATES, REPLICATING_STATES
from segrep.core.chain import Chain, SegmentRef, visible_segments
from segrep.core.errors import NotFoundError, RefusedError
from segrep.core.states import PlacementState


@dataclass(frozen=True)
class PartitionLoss:
    """The segments of one partition's leader chain the new leader lacks (what a failover gives up)."""

    partition_id: int
    segments: int
    rows: int
    bytes: int
    min_version: int | None
    max_version: int | None
    segment_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> PartitionLoss:
        return cls(**raw)


@dataclass(frozen=True)
class Candidate:
    """A site that could take the lead: how much of the leaders' visible rows it holds already."""

    site: str
    site_id: int
    rows_held: int
    rows_lacking: int
    eligible: bool
    why_not: str | None = None


@dataclass(frozen=True)
class Assessment:
    """One table's move from ``from_site`` to ``to_site``: why that site, and the loss per partition."""

    table: str
    from_site: str
    to_site: str
    reason: str
    candidates: list[Candidate]
    loss: list[PartitionLoss]  # partitions where the new leader lacks something
    moving: list[int]  # partitions whose leader moves

    @property
    def segments_lost(self) -> int:
        return sum(p.segments for p in self.loss)

    @property
    def rows_lost(self) -> int:
        return sum(p.rows for p in self.loss)

    @property
    def bytes_lost(self) -> int:
        return sum(p.bytes for p in self.loss)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def assess(s: Session, table: str, to: str | None = None, *, chosen_because: str | None = None) -> Assessment:
    """The move of ``table``'s leadership to ``to`` (default: the most advanced eligible replica, most rows
    held, ties by site id). RefusedError naming the reason if no site can lead, or ``to`` cannot.
    ``chosen_because``: why the caller chose ``to`` (for the report), when it was not asked for."""
    snap = _load(s, table)
    if not snap.partitions:
        raise RefusedError(f"table {table} has no partition with a leader to move")
    leader_sites = {part.leader.site_id for part in snap.partitions}
    candidates = _candidates(snap)
    if to is not None:
        chosen = next((c for c in candidates if c.site == to), None)
        if chosen is None:
            if to in {snap.sites[sid].name for sid in leader_sites}:
                raise RefusedError(f"table {table}: site {to} leads it already")
            raise NotFoundError(f"table {table} has no replica at site {to} (its replicas: {_names(candidates)})")
        if not chosen.eligible:
            raise RefusedError(f"table {table}: site {to} cannot lead: {chosen.why_not}")
        held, lacking = chosen.rows_held, chosen.rows_lacking
        why = chosen_because or f"{to} was asked for"
        reason = f"{why}; it holds {held:,} rows of the leader's and lacks {lacking:,}"
    else:
        eligible = [c for c in candidates if c.eligible]
        if not eligible:
            why = "; ".join(f"{c.site}: {c.why_not}" for c in candidates) or "no replica"
            raise RefusedError(f"table {table}: no replica can lead ({why})")
        chosen = max(eligible, key=lambda c: (c.rows_held, -c.site_id))
        others = ", ".join(f"{c.site} {c.rows_held:,}" for c in eligible if c is not chosen)
        reason = (
            f"{chosen.site} is the most advanced live replica: it holds {chosen.rows_held:,} rows of the "
            f"leader's" + (f" (others: {others}; ties go to the lower site id)" if others else "")
        )
    moving = [part for part in snap.partitions if part.leader.site_id != chosen.site_id]
    from_names = sorted({snap.sites[part.leader.site_id].name for part in moving}) or [chosen.site]
    loss = [_loss(part, _placement_at(part, chosen.site_id)) for part in moving]
    return Assessment(
        table,
        ", ".join(from_names),
        chosen.site,
        reason,
        candidates,
        [x for x in loss if x.segments],
        [part.partition.partition_id for part in moving],
    )


def _names(candidates: list[Candidate]) -> str:
    return ", ".join(c.site for c in candidates) or "none"


def _candidates(snap: _View) -> list[Candidate]:
    """Every site holding a replica of some partition, with what it holds and whether it may lead: it must
    hold a LIVE placement of every partition, none of them out of retention (needing a bootstrap)."""
    site_ids = sorted({pl.site_id for part in snap.partitions for pl in part.replicas})
    out = []
    for site_id in site_ids:
        held = lacking = 0
        problem = None
        for part in snap.partitions:
            if part.leader.site_id == site_id:
                continue  # it leads this partition already (per-partition leaders)
            pl = _placement_at(part, site_id)
            if pl is None:
                problem = f"it holds no replica of partition {part.partition.partition_id}"
                continue
            if pl.state != PlacementState.LIVE or pl.needs_bootstrap:
                state = "needs a bootstrap" if pl.needs_bootstrap else f"is {pl.state}"
                problem = problem or f"its replica of partition {part.partition.partition_id} {state}"
            has = part.referenced(pl)
            for ref in part.leader_visible:
                rows = part.segment(part.leader.placement_id, ref.segment_id).row_count
                if ref.segment_id in has:
                    held += rows
                else:
                    lacking += rows
        out.append(Candidate(snap.sites[site_id].name, site_id, held, lacking, problem is None, problem))
    return out


def _placement_at(part: _Part, site_id: int) -> m.Placement | None:
    return next((pl for pl in part.replicas if pl.site_id == site_id), None)


def _loss(part: _Part, target: m.Placement | None) -> PartitionLoss:
    has = part.referenced(target) if target is not None else set()
    lacking = [
        part.segment(part.leader.placement_id, ref.segment_id)
        for ref in part.leader_visible
        if ref.segment_id not in has
    ]
    return PartitionLoss(
        part.partition.partition_id,
        len(lacking),
        sum(seg.row_count for seg in lacking),
        sum(seg.byte_size for seg in lacking),
        min((seg.min_version for seg in lacking), default=None),
        max((seg.max_version for seg in lacking), default=None),
        [seg.segment_id for seg in lacking],
    )


# -- a lean read of the table: chains and the facts a loss needs, as tuples (no ORM segment, no ack) ----------


@dataclass(frozen=True, slots=True)
class _Seg:
    segment_id: str
    row_count: int
    byte_size: int
    min_version: int
    max_version: int


@dataclass
class _Part:
    partition: m.Partition
    leader: m.Placement
    replicas: list[m.Placement]
    chains: dict[int, Chain]
    facts: dict[tuple[int, str], _Seg]
    _referenced: dict[int, set[str]] = field(default_factory=dict)

    def chain(self, placement: m.Placement) -> Chain:
        return self.chains.get(placement.placement_id) or Chain.of((), placement.root_segment_id)

    def segment(self, placement_id: int, segment_id: str) -> _Seg:
        return self.facts[(placement_id, segment_id)]

    @cached_property
    def leader_visible(self) -> list[SegmentRef]:
        """The leader's visible segments (walked once: every candidate site and the loss ask for them)."""
        return visible_segments(self.chain(self.leader))

    def referenced(self, placement: m.Placement) -> set[str]:
        """Ids the placement's chain references: on its walk, or folded into a segment on it (one walk per
        placement, where ``core.chain.is_referenced`` walks again for every id asked)."""
        if placement.placement_id not in self._referenced:
            out: set[str] = set()
            for ref in self.chain(placement).walk():
                out.add(ref.segment_id)
                out.update(ref.included_segment_ids)
            self._referenced[placement.placement_id] = out
        return self._referenced[placement.placement_id]


@dataclass
class _View:
    sites: dict[int, m.Site]
    partitions: list[_Part]


def _load(s: Session, table: str) -> _View:
    """The table's partitions with a leader, their placements' chains and the leaders' segment facts, in three
    set-based queries: at 10,000 partitions the full snapshot (ORM segments and every ack) took seconds."""
    info = q.table_info(s, table)
    parts = list(
        s.scalars(
            select(m.Partition).where(
                m.Partition.table_id == info.table_id,
                m.Partition.state.in_([str(x) for x in REPLICATING_STATES]),
                m.Partition.leader_placement_id.is_not(None),
            )
        )
    )
    placements = q.active_placements(s, [p.partition_id for p in parts])
    leader_ids = {p.leader_placement_id for p in parts}
    segs: dict[int, list[SegmentRef]] = {}
    facts: dict[tuple[int, str], _Seg] = {}
    sg = m.Segment
    rows = s.execute(
        select(
            sg.placement_id,
            sg.segment_id,
            sg.base_segment_id,
            case((sg.is_major, sg.included_segment_ids), else_=None),  # only majors fold: no JSON to decode
            sg.is_major,
            sg.row_count,
            sg.byte_size,
            sg.min_version,
            sg.max_version,
        )
        .join(m.Placement, m.Placement.placement_id == sg.placement_id)
        .join(m.Partition, m.Partition.partition_id == sg.partition_id)
        .where(m.Partition.table_id == info.table_id, m.Placement.removed_us.is_(None))
        .order_by(sg.placement_id, sg.entry_id)
    )
    for pl_id, seg_id, base, included, major, n, size, lo, hi in rows:
        segs.setdefault(pl_id, []).append(SegmentRef(seg_id, base, tuple(included or ()), bool(major)))
        if pl_id in leader_ids:
            facts[(pl_id, seg_id)] = _Seg(seg_id, n, size, lo, hi)
    by_partition: dict[int, list[m.Placement]] = {}
    for pl in placements:
        by_partition.setdefault(pl.partition_id, []).append(pl)
    out = []
    for part in q.sort_partitions(info, parts):
        pls = by_partition.get(part.partition_id, [])
        leader = next((pl for pl in pls if pl.placement_id == part.leader_placement_id), None)
        if leader is None:
            continue
        replicas = [pl for pl in pls if pl is not leader and pl.state in RECEIVING_STATES]
        chains = {pl.placement_id: Chain.of(segs.get(pl.placement_id, ()), pl.root_segment_id) for pl in pls}
        out.append(_Part(part, leader, replicas, chains, facts))
    return _View(q.sites_by_id(s), out)
