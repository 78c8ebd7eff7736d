"""What a leader move would cost, from the catalog alone (DESIGN section 11; TokuMX chooses the most advanced
replica): which site to promote, and exactly what it lacks of the current leader's rows.

The segment chain makes the loss exact: per partition, the segments on the leader's visible chain that the
new leader's chain does not reference (neither holds nor has folded into a major), with their rows, bytes and
row-version range. Nothing here touches a site's storage, so it answers while the leader's site is down.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from functools import cached_property
from itertools import groupby
from operator import itemgetter
from typing import Any

import pyarrow as pa
from sqlalchemy import Text, case, cast, select
from sqlalchemy.orm import Session

from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.snapshot import RECEIVING_STATES, REPLICATING_STATES, given_up_segments
from segrep.core import hlc
from segrep.core.errors import NotFoundError, RefusedError
from segrep.core.states import PlacementState


@dataclass(frozen=True)
class PartitionLoss:
    """The segments of one partition's leader chain the new leader lacks (what a failover gives up); under a
    cut, also the forks other sites hold past it (:func:`_forks_past`)."""

    partition_id: int
    segments: int
    rows: int
    bytes: int
    min_version: int | None
    max_version: int | None
    segment_ids: list[str] = field(default_factory=list)
    # ``rows`` counts rows the new leader holds too: a lost major or merge output folds segments it references
    # (their rows stay in the fold unless superseded there), and a return sets aside only the rows the new
    # leader lacks, so at most ``rows``; exactly how many needs the lost files. False in records written before.
    rows_at_most: bool = False

    def summary(self) -> str:
        """``n segment(s), [at most] r rows, b bytes, versions lo .. hi``: the loss as a report prints it."""
        rows = f"at most {self.rows:,} rows" if self.rows_at_most else f"{self.rows:,} rows"
        lo, hi = self.min_version, self.max_version
        versions = "-" if lo is None or hi is None else f"versions {hlc.iso(lo)} .. {hlc.iso(hi)}"
        return f"{self.segments} segment(s), {rows}, {self.bytes:,} bytes, {versions}"

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

    def total_loss(self) -> PartitionLoss | None:
        """The loss over every partition as one (partition id 0; its version range spans them all), or None."""
        if not self.loss:
            return None
        return PartitionLoss(
            0,
            self.segments_lost,
            self.rows_lost,
            self.bytes_lost,
            min(x.min_version for x in self.loss if x.min_version is not None),
            max(x.max_version for x in self.loss if x.max_version is not None),
            rows_at_most=any(x.rows_at_most for x in self.loss),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def assess(
    s: Session,
    table: str,
    to: str | None = None,
    *,
    chosen_because: str | None = None,
    cut_us: int | None = None,
) -> Assessment:
    """The move of ``table``'s leadership to ``to`` (default: the most advanced eligible replica, most rows
    held, ties by site id). RefusedError naming the reason if no site can lead, or ``to`` cannot.
    ``chosen_because``: why the caller chose ``to`` (for the report), when it was not asked for.
    ``cut_us``: the move cuts the table at that instant (``--at safe-time``): see :func:`_forks_past`."""
    return assess_view(read_view(s, q.table_info(s, table)), to, chosen_because=chosen_because, cut_us=cut_us)


def assess_view(
    snap: TableView, to: str | None = None, *, chosen_because: str | None = None, cut_us: int | None = None
) -> Assessment:
    """:func:`assess` of a view read already (a promotion assesses what it read under its locks)."""
    table = snap.table
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
    loss = [_loss(part, part.at_site.get(chosen.site_id), snap.given_up, cut_us) for part in moving]
    return Assessment(
        table,
        ", ".join(from_names),
        chosen.site,
        reason,
        candidates,
        [x for x in loss if x.segments],
        [part.partition_id for part in moving],
    )


def _names(candidates: list[Candidate]) -> str:
    return ", ".join(c.site for c in candidates) or "none"


def _candidates(snap: TableView) -> list[Candidate]:
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
            pl = part.at_site.get(site_id)
            if pl is None:
                problem = f"it holds no replica of partition {part.partition_id}"
                continue
            if pl.state != PlacementState.LIVE or pl.needs_bootstrap:
                state = "needs a bootstrap" if pl.needs_bootstrap else f"is {pl.state}"
                problem = problem or f"its replica of partition {part.partition_id} {state}"
            kept = [snap.given_up[sid] for sid in part.lists.get(pl.placement_id, ()) if sid in snap.given_up]
            if kept:
                problem = problem or (
                    f"it still holds {len(kept)} segment(s) of partition {part.partition_id} that failover "
                    f"#{min(kept)} gave up (on_return: rollback), not yet set aside: the next round that can "
                    "read the site sets them aside"
                )
            has = part.referenced(pl)
            for seg in part.leader_visible:
                if seg[_ID] in has:
                    held += seg[_ROWS]
                else:
                    lacking += seg[_ROWS]
        out.append(Candidate(snap.sites[site_id].name, site_id, held, lacking, problem is None, problem))
    return out


def _loss(part: _Part, target: PlacementRow | None, given_up: dict[str, int], cut_us: int | None) -> PartitionLoss:
    has = part.referenced(target) if target is not None else set()
    entries = [seg for seg in part.leader_visible if seg[_ID] not in has]
    if cut_us is not None and target is not None:
        entries += _forks_past(part, target, has, given_up, cut_us)
    if not entries:  # most partitions: the sums and bounds of nothing
        return PartitionLoss(part.partition_id, 0, 0, 0, None, None, [])
    lacking = [_Seg(*(seg[i] for i in _FACTS)) for seg in entries]
    overlaps = any(seg[_FOLDED] is not None and not has.isdisjoint(part.folded[seg[_FOLDED]]) for seg in entries)
    return PartitionLoss(
        part.partition_id,
        len(lacking),
        sum(seg.row_count for seg in lacking),
        sum(seg.byte_size for seg in lacking),
        min((seg.min_version for seg in lacking), default=None),
        max((seg.max_version for seg in lacking), default=None),
        [seg.segment_id for seg in lacking],
        overlaps,
    )


def _forks_past(part: _Part, target: PlacementRow, has: set[str], given_up: dict[str, int], cut_us: int) -> list[Any]:
    """Under a cut, the segments other sites hold that the new leader neither lists nor references and that
    hold rows newer than the cut (not on the leader's visible chain: that is the loss above): forks a
    follower wrote while it led, or received from an older leader, that the rounds would push to the new
    leader and merge (``on_return: merge``), bringing back rows the cut set aside. They are given up with
    the move and set aside where they are, as the old leader's loss is. A fork wholly at or before the cut
    stays (merged, it cannot undo the cut); one a failover gave up already stays with that failover. A
    segment folded into a major is given up too, the old leader's included: setting the major aside rewinds
    that site's chain onto what the major folded, and a major built as of an earlier cut had left out exactly
    the rows past that cut (found by the merge state machine: two cuts at one instant brought them back)."""
    listed = part.lists.get(target.placement_id) or {}
    visible = {seg[_ID] for seg in part.leader_visible}
    out: dict[str, Any] = {}  # the entries as read
    for holder in (part.leader, *part.replicas):
        if holder is target:
            continue
        for sid, seg in (part.lists.get(holder.placement_id) or {}).items():
            if seg[_MAX_VERSION] <= cut_us or sid in has or sid in listed or sid in visible or sid in given_up:
                continue
            out.setdefault(sid, seg)
    return list(out.values())


# -- a lean read of the table: rows as tuples (no ORM partition, placement or segment; no ack) ----------------


@dataclass(frozen=True, slots=True)
class PartitionRow:
    """A partition in a replicating state with a leader placement: what a promotion moves."""

    partition_id: int
    leader_placement_id: int | None  # not None (the read asks for a leader); typed as the column
    epoch: int


@dataclass(frozen=True, slots=True)
class PlacementRow:
    """An active placement of such a partition: what an assessment and a promotion ask of it."""

    placement_id: int
    partition_id: int
    site_id: int
    state: str
    root_segment_id: str | None
    needs_bootstrap: bool


@dataclass(frozen=True, slots=True)
class _Seg:
    segment_id: str
    row_count: int
    byte_size: int
    min_version: int
    max_version: int


# a segment entry as read_view reads it (one row, kept as read: no object per entry), and the facts of a _Seg
_ID, _BASE, _FOLDED, _MAJOR, _ROWS, _BYTES, _MIN_VERSION, _MAX_VERSION = range(1, 9)
_FACTS = (_ID, _ROWS, _BYTES, _MIN_VERSION, _MAX_VERSION)


@dataclass
class _Part:
    partition_id: int
    leader: PlacementRow
    replicas: list[PlacementRow]
    at_site: dict[int, PlacementRow]  # each site's first replica (in placement id order)
    lists: dict[int, dict[str, Any]]  # each placement's segment entries (of the table) by segment id
    folded: dict[str, tuple[str, ...]]  # a major's included_segment_ids as read (JSON text): the ids
    _referenced: dict[int, set[str]] = field(default_factory=dict)

    def walk(self, placement: PlacementRow) -> Iterator[Any]:
        """The placement's entries from its root back through their bases, newest first: the walk of
        ``core.chain.Chain.walk`` over the rows as read (a Chain of SegmentRefs per placement cost more than
        the rest of the assessment)."""
        entries = self.lists.get(placement.placement_id) or {}
        seen: set[str] = set()
        seg = None if placement.root_segment_id is None else entries.get(placement.root_segment_id)
        while seg is not None and seg[_ID] not in seen:
            yield seg
            seen.add(seg[_ID])
            seg = entries.get(seg[_BASE])

    @cached_property
    def leader_visible(self) -> list[Any]:
        """The leader's visible entries, oldest first (``core.chain.visible_segments``: the walk up to and
        including its newest major), walked once: every candidate site and the loss ask for them."""
        out = []
        for seg in self.walk(self.leader):
            out.append(seg)
            if seg[_MAJOR]:
                break
        out.reverse()
        return out

    def referenced(self, placement: PlacementRow) -> set[str]:
        """Ids the placement's chain references: on its walk, or folded into a segment on it (one walk per
        placement, where ``core.chain.is_referenced`` walks again for every id asked)."""
        out = self._referenced.get(placement.placement_id)
        if out is None:
            out = set()
            for seg in self.walk(placement):
                out.add(seg[_ID])
                if seg[_FOLDED] is not None:
                    out.update(self.folded[seg[_FOLDED]])
            self._referenced[placement.placement_id] = out
        return out


@dataclass
class TableView:
    """What a leader move reads of a table, once (:func:`read_view`): assessed by :func:`assess_view`, and
    what a promotion moves."""

    table: str
    sites: dict[int, m.Site]
    partitions: list[_Part]  # those whose leader placement is active, in key order
    rows: list[PartitionRow]  # every partition in a replicating state with a leader, by partition id
    placements: list[PlacementRow]  # their active placements, by placement id
    given_up: dict[str, int] = field(default_factory=dict)  # segment id -> the rollback failover that gave it up


def read_view(s: Session, info: q.TableInfo, *, lock: bool = False) -> TableView:
    """The table's partitions with a leader, their placements' chains and the leaders' segment facts, as
    tuples in three set-based queries: at 10,000 partitions the full snapshot (ORM segments and every ack),
    then ORM partitions and placements (their JSON key columns, a 10,000-element IN list), took seconds.
    ``lock``: the partitions are read FOR UPDATE (in partition id order), and the rest under their locks.
    Plain Core rows (no ORM row processing), JSON columns read as text and decoded in one call each."""
    p, pl, sg = m.Partition, m.Placement, m.Segment
    conn = s.connection()
    which = (
        p.table_id == info.table_id,
        p.state.in_([str(x) for x in REPLICATING_STATES]),
        p.leader_placement_id.is_not(None),
    )
    query = select(p.partition_id, p.leader_placement_id, p.epoch, cast(p.begin_key, Text))
    query = query.where(*which).order_by(p.partition_id)
    found = conn.execute(query.with_for_update() if lock else query).all()
    rows = [PartitionRow(pid, leader, epoch) for pid, leader, epoch, _ in found]
    placements = [
        PlacementRow(*row)
        for row in conn.execute(
            select(pl.placement_id, pl.partition_id, pl.site_id, pl.state, pl.root_segment_id, pl.needs_bootstrap)
            .join(p, p.partition_id == pl.partition_id)
            .where(*which, pl.removed_us.is_(None))
            .order_by(pl.placement_id)
        ).all()  # iterating the result would fetch row by row
    ]
    entries = conn.execute(
        select(
            sg.placement_id,
            sg.segment_id,
            sg.base_segment_id,
            # majors fold what they include, and merge outputs name what they merged
            case((sg.included_segment_ids.is_not(None), cast(sg.included_segment_ids, Text)), else_=None),
            sg.is_major,
            sg.row_count,
            sg.byte_size,
            sg.min_version,
            sg.max_version,
        )
        .join(pl, pl.placement_id == sg.placement_id)
        .join(p, p.partition_id == sg.partition_id)
        .where(p.table_id == info.table_id, pl.removed_us.is_(None))
        .order_by(sg.placement_id, sg.entry_id)
    ).all()
    lists = {pl_id: {seg[_ID]: seg for seg in group} for pl_id, group in groupby(entries, itemgetter(0))}
    texts = list({seg[_FOLDED] for seg in entries if seg[_FOLDED] is not None})
    folded = {text: tuple(ids or ()) for text, ids in zip(texts, _json_values(texts), strict=True)}
    by_id = {x.placement_id: x for x in placements}
    by_partition: dict[int, list[PlacementRow]] = {}
    for x in placements:
        by_partition.setdefault(x.partition_id, []).append(x)
    begin_keys = _json_values([begin for _, _, _, begin in found])
    begins = _begin_keys(info, begin_keys)
    out = []
    for i in sorted(range(len(rows)), key=lambda i: (begin_keys[i] is not None, begins[i])):  # as sort_partitions
        part = rows[i]
        leader = by_id.get(part.leader_placement_id or -1)
        if leader is None or leader.partition_id != part.partition_id:
            continue  # its leader placement is not active
        pls = by_partition[part.partition_id]
        replicas = [x for x in pls if x is not leader and x.state in RECEIVING_STATES]
        at_site: dict[int, PlacementRow] = {}
        for x in replicas:
            at_site.setdefault(x.site_id, x)
        out.append(_Part(part.partition_id, leader, replicas, at_site, lists, folded))
    return TableView(info.name, q.sites_by_id(s), out, rows, placements, given_up_segments(s, info.table_id))


def _json_values(texts: list[str | None]) -> list[Any]:
    """JSON column values read as text (SQL NULL: None), decoded in one ``json.loads``, not one per row."""
    return list(json.loads("[" + ",".join("null" if t is None else t for t in texts) + "]"))


def _begin_keys(info: q.TableInfo, raw: list[Any]) -> list[Any]:
    """The begin keys decoded as ``TableInfo.decode_key`` does (0 for an unbounded begin, as
    ``queries.sort_partitions`` orders), in one Arrow cast where the keys allow it (one per key took 0.2 s at
    10,000 partitions); key by key otherwise."""
    values = [v for v in raw if v is not None]
    decoded: list[Any] | None = None
    if values and not pa.types.is_binary(info.key_type):
        with contextlib.suppress(pa.ArrowException, TypeError, ValueError, OverflowError):
            decoded = pa.array(values).cast(info.key_type).to_pylist()
    if decoded is None:
        decoded = [info.decode_key(v) for v in values]
    it = iter(decoded)
    return [0 if v is None else next(it) for v in raw]
