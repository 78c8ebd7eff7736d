"""One split as the catalog holds it: parent, children, their placements, lists and acks, and what the
children still lack. The split workflow decides over this view; safe time and the reader bound themselves by
it while a parent is in UNLOAD, so it sits below both.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.sql import must_get
from segrep.core.chain import Chain, is_reference_weak, is_referenced, offer_order, visible_segments
from segrep.core.states import PlacementState, SplitState


def children_of(s: Session, parent_id: int) -> list[m.Partition]:
    return list(
        s.scalars(
            select(m.Partition).where(m.Partition.parent_partition_id == parent_id).order_by(m.Partition.partition_id)
        )
    )


@dataclass
class SplitView:
    """One split as the catalog holds it now: parent, children, their placements, lists and the acks."""

    info: q.TableInfo
    split: m.Split
    parent: m.Partition
    children: list[m.Partition]
    sources: list[m.Placement]  # parent placements that push (copy: the leader; unload: every active one)
    child_leaders: dict[int, m.Placement]
    segments: dict[int, list[m.Segment]]
    acked: dict[int, set[str]]  # child leader placement id -> segment ids acked by any parent placement
    sites: dict[int, m.Site]

    def chain(self, placement: m.Placement) -> Chain:
        return q.chain_of(placement, self.segments.get(placement.placement_id, []))

    def by_id(self, placement: m.Placement) -> dict[str, m.Segment]:
        return {x.segment_id: x for x in self.segments.get(placement.placement_id, [])}


def split_view(s: Session, split_id: int) -> SplitView:
    split = must_get(s, m.Split, split_id, what="split")
    info = q.table_info(s, must_get(s, m.Table, split.table_id).name)
    parent = must_get(s, m.Partition, split.parent_partition_id)
    children = children_of(s, parent.partition_id)
    parent_pls = q.active_placements(s, [parent.partition_id])
    if split.state == SplitState.SPLITTING:
        sources = [pl for pl in parent_pls if pl.placement_id == parent.leader_placement_id]
    else:  # UNLOAD: every replica is equal; one out of retention holds nothing that may still be merged
        sources = [pl for pl in parent_pls if not pl.needs_bootstrap]
    child_pls = {pl.placement_id: pl for pl in q.active_placements(s, [c.partition_id for c in children])}
    # a finished split's child may have split in turn (retired, no placements): it takes no part any more
    leaders = {c.partition_id: child_pls[c.leader_placement_id] for c in children if c.leader_placement_id in child_pls}
    children = [c for c in children if c.partition_id in leaders]
    ids = [pl.placement_id for pl in (*parent_pls, *leaders.values())]
    acked: dict[int, set[str]] = defaultdict(set)
    if parent_pls:
        rows = s.execute(
            select(m.Ack.target_placement_id, m.Ack.segment_id).where(
                m.Ack.holder_placement_id.in_([pl.placement_id for pl in parent_pls]),
                m.Ack.target_placement_id.in_([pl.placement_id for pl in leaders.values()]),
            )
        )
        for target, seg in rows:
            acked[target].add(seg)
    return SplitView(info, split, parent, children, sources, leaders, q.segments_of(s, ids), acked, q.sites_by_id(s))


def candidates(view: SplitView, source: m.Placement, child_leader: m.Placement) -> list[m.Segment]:
    """The source's segments this child has not acked, in offer order: its visible chain (newest major to
    root) and, when unloading, its forks too (segments on no walk: written while it led, never merged)."""
    chain = view.chain(source)
    segs = view.by_id(source)
    acked = view.acked.get(child_leader.placement_id, set())
    out = [segs[ref.segment_id] for ref in offer_order(chain, acked)]
    if view.split.state == SplitState.UNLOAD:
        on_walk = {x.segment_id for x in out}
        out += [
            seg
            for seg in view.segments.get(source.placement_id, [])
            if seg.segment_id not in acked
            and seg.segment_id not in on_walk
            and not (is_referenced(chain, seg.segment_id) and is_reference_weak(chain, seg.segment_id))
        ]
    return out


def lacking_segments(view: SplitView, cut_entry_id: int | None) -> dict[int, list[m.Segment]]:
    """Per child: the sources' segments (up to the cut, if given) it neither references nor acked."""
    out: dict[int, list[m.Segment]] = {}
    for child in view.children:
        target = view.child_leaders[child.partition_id]
        chain = view.chain(target)
        segs = [
            seg
            for source in view.sources
            for seg in candidates(view, source, target)
            if (cut_entry_id is None or seg.entry_id <= cut_entry_id) and not is_referenced(chain, seg.segment_id)
        ]
        if segs:
            out[child.partition_id] = segs
    return out


def lacking_counts(view: SplitView, cut_entry_id: int | None) -> dict[int, int]:
    return {child: len(segs) for child, segs in lacking_segments(view, cut_entry_id).items()}


# built once (catalog.sql says why): every round commit asks
_UNLOADING = select(m.Split.split_id).where(
    m.Split.table_id == bindparam("table_id"), m.Split.state == str(SplitState.UNLOAD)
)


def unload_safe_bound(s: Session, table_id: int) -> int | None:
    """The instant before the oldest row that the children of a parent in UNLOAD still lack, or None.

    Such rows are readable where the parent's placement holds them (the reader adds it), but no replication
    of the children vouches for them yet: no site's safe time may pass them until they are merged."""
    bound: int | None = None
    for split_id in s.scalars(_UNLOADING, {"table_id": table_id}).all():
        for segs in lacking_segments(split_view(s, split_id), None).values():
            low = min(seg.min_version for seg in segs) - 1
            bound = low if bound is None else min(bound, low)
    return bound


def replicas_behind(s: Session, view: SplitView) -> dict[str, int]:
    """Per child replica ("<child>@<site>"): the child leader's visible segments that may hold parent rows
    (oldest version at or below the parent's newest) which that replica does not reference yet.

    Until every readable replica of the children references them, its site reads those rows from its parent
    placement: retiring the parent earlier would serve that site a table with rows missing (and let its safe
    time vouch for them). A replica that needs a bootstrap or is still joining is not readable, so it waits
    for nothing here."""
    parent_ids = {pl.placement_id for pl in q.active_placements(s, [view.parent.partition_id])}
    newest = max(
        [view.parent.last_version, *(seg.max_version for pid in parent_ids for seg in view.segments.get(pid, []))]
    )
    leaders = {pl.placement_id for pl in view.child_leaders.values()}
    followers = [
        pl
        for pl in q.active_placements(s, [c.partition_id for c in view.children])
        if pl.placement_id not in leaders and pl.state == PlacementState.LIVE and not pl.needs_bootstrap
    ]
    lists = q.segments_of(s, [pl.placement_id for pl in followers])
    out: dict[str, int] = {}
    for follower in followers:
        leader = view.child_leaders[follower.partition_id]
        held = view.by_id(leader)
        visible = visible_segments(view.chain(leader))
        needed = [ref.segment_id for ref in visible if held[ref.segment_id].min_version <= newest]
        chain = q.chain_of(follower, lists.get(follower.placement_id, []))
        missing = sum(1 for seg_id in needed if not is_referenced(chain, seg_id))
        if missing:
            out[f"{follower.partition_id}@{view.sites[follower.site_id].name}"] = missing
    return out
