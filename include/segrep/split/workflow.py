"""Partition splits (EventQL 3.8, DESIGN section 7): split without stopping writes, resumable, never restarted.

The life of a split, each step a function a DAG task (or ``segrep split``) calls, each safe to run again:

1. :func:`start_split`: the parent enters SPLITTING; one child partition per key range is created (LOADING),
   with a placement at every site of the parent; each child's leader is at the parent leader's site. The
   children's leaders are the parent's key-range-restricted split targets.
2. :func:`plan_pass` / :func:`commit_pass` (phase ``copy``): the parent leader offers its chain to every child
   leader, in order, exactly as to a follower. A segment the child can fast-forward is rewritten for the
   child's range by the Spark job (``split`` items), keeping ``segment_id`` and ``base_segment_id``; one the
   child already references is SEGMENT_EXISTS; anything else (a new leader's chain after a leader change) is
   merged, last writer wins. Acks record progress per (segment, child) whatever placement held the segment,
   so a new parent leader resumes where the old one stopped and never rewrites an acked segment.
3. :func:`finalize` (SPLIT_FINALIZE): once every child acked the parent leader's segments up to the pass's
   cut, in one transaction the parent enters UNLOAD (writers retry into the children), the children become
   LIVE with the parent's clock (their new writes win over every parent row). Async splits do this in step 1.
4. phase ``unload``: every parent placement (leader or not) pushes what the children lack: segments written
   after the cut, forks of a replica that was away. The children answer as leaders: SEGMENT_EXISTS or MERGE.
5. :func:`finish` (UNLOAD_FINAL): once every parent placement's segments are acked by every child, and every
   replica of the children holds what its leader took from the parent (until then its site reads the rows
   from its parent placement; rounds carry the children there and then finish the split), the parent is
   retired in one transaction (its catalog rows first) and then its files go.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from segrep.catalog import Catalog
from segrep.catalog import leases as ls
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.splits import SplitView, candidates, children_of, lacking_counts, split_view
from segrep.catalog.sql import must_get
from segrep.config.definitions import Definitions
from segrep.core import faults, hlc, keys
from segrep.core.chain import is_referenced
from segrep.core.errors import NotFoundError, SegrepError, SplitIncompleteError
from segrep.core.protocol import apply_fast_forward
from segrep.core.states import PartitionState, PlacementState, SplitPhase, SplitState
from segrep.spark.items import file_ref, split_merge_item, split_rewrite_item
from segrep.spark.manifest import FileRef, Manifest, MergeItem
from segrep.spark.results import CommitSummary, commit_results
from segrep.storage.workdir import split_pass_paths

log = logging.getLogger(__name__)


# -- start ----------------------------------------------------------------------------------------------------


def split_key_list(raw: object) -> list[Any]:
    """``raw`` as a list of split keys; SegrepError if it is not a list (a string is not a list of its letters)."""
    if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
        raise SegrepError(f"split keys must be a list of keys, got {raw!r}")
    return list(raw)


def parse_split_keys(info: q.TableInfo, raw: Sequence[Any]) -> list[Any]:
    """Split keys as given (CLI strings or JSON values) converted strictly to the partition key's type
    (``keys.from_user``: no bool for an int, no NaN, no overflow, no fraction for an int key), sorted, distinct."""
    raw = split_key_list(raw)
    if not raw:
        raise SegrepError("a split needs at least one split key (--at KEY)")
    what = f"split key for partition key {info.partition_key}"
    out = [keys.from_user(value, info.key_type, what) for value in raw]
    if len(set(out)) != len(out):
        raise SegrepError(f"split keys must be distinct; got {list(raw)}")
    return sorted(out)


@dataclass(frozen=True)
class SplitRef:
    split_id: int
    table: str
    parent_partition_id: int
    state: str
    is_async: bool
    children: list[int]


def start_split(
    catalog: Catalog, table: str, partition_id: int, split_keys: list[Any], *, is_async: bool = False
) -> SplitRef:
    """Begin splitting ``partition_id`` at ``split_keys`` (or return the split already under way with the
    same keys: the step can be re-run). Async splits are finalized in the same transaction."""
    with catalog.write() as s:
        info = q.table_info(s, table)
        wanted = parse_split_keys(info, split_keys)
        parent = _lock_partition(s, info, partition_id)  # concurrent starts queue here; the second finds the first
        existing = _last_split(s, info, partition_id)  # a partition splits once: it is retired afterwards
        if existing is not None:
            if [info.decode_key(k) for k in existing.split_keys] != wanted:
                raise SegrepError(
                    f"partition {partition_id} of {table} already has split {existing.split_id} at "
                    f"{existing.split_keys} ({existing.state}); resume it with those keys or without keys"
                )
            return _ref(s, existing, table)
        if parent.state != PartitionState.LIVE:
            raise SegrepError(f"partition {partition_id} of {table} is {parent.state}: only a LIVE partition splits")
        lo, hi = info.decode_key(parent.begin_key), info.decode_key(parent.end_key)
        outside = [k for k in wanted if (lo is not None and k <= lo) or (hi is not None and k >= hi)]
        if outside:
            raise SegrepError(
                f"split keys {[keys.encode(k) for k in outside]} are not inside partition {partition_id}'s range "
                f"[{parent.begin_key if lo is not None else '-inf'}, {parent.end_key if hi is not None else '+inf'})"
            )
        placements = q.active_placements(s, [partition_id])
        leader = next((pl for pl in placements if pl.placement_id == parent.leader_placement_id), None)
        if leader is None:
            raise SegrepError(f"partition {partition_id} of {table} has no leader placement: cannot split")
        now = hlc.now_us()
        split = m.Split(
            table_id=info.table_id,
            parent_partition_id=partition_id,
            split_keys=[keys.encode(k) for k in wanted],
            is_async=is_async,
            state=SplitState.SPLITTING,
            created_us=now,
        )
        s.add(split)
        bounds = [parent.begin_key, *(keys.encode(k) for k in wanted), parent.end_key]
        for begin, end in itertools.pairwise(bounds):
            child = m.Partition(
                table_id=info.table_id,
                begin_key=begin,
                end_key=end,
                state=PartitionState.LOADING,
                epoch=1,
                last_version=0,
                parent_partition_id=partition_id,
                created_us=now,
            )
            s.add(child)
            s.flush()
            for pl in placements:
                if pl.state == PlacementState.REMOVED:
                    continue
                cpl = m.Placement(
                    partition_id=child.partition_id,
                    site_id=pl.site_id,
                    state=PlacementState.LIVE,
                    created_us=now,
                    feeder_site_id=pl.feeder_site_id,  # a cascaded replica stays cascaded in the children
                )
                s.add(cpl)
                s.flush()
                if pl.placement_id == leader.placement_id:
                    child.leader_placement_id = cpl.placement_id
        parent.state = PartitionState.SPLITTING
        s.flush()
        if is_async:
            _finalize_in(s, split, parent)
        return _ref(s, split, table)


def _last_split(s: Session, info: q.TableInfo, partition_id: int) -> m.Split | None:
    """The partition's split, if it has one (at most one: a split parent is retired, never LIVE again)."""
    return s.scalars(
        select(m.Split)
        .where(m.Split.table_id == info.table_id, m.Split.parent_partition_id == partition_id)
        .order_by(m.Split.split_id.desc())
        .limit(1)
    ).one_or_none()


def _lock_partition(s: Session, info: q.TableInfo, partition_id: int) -> m.Partition:
    part = s.get(m.Partition, partition_id, with_for_update=True)
    if part is None or part.table_id != info.table_id:
        known = [p.partition_id for p in q.partitions_of(s, info)]
        raise NotFoundError(f"table {info.name} has no partition {partition_id}; its partitions: {known}")
    return part


def _ref(s: Session, split: m.Split, table: str) -> SplitRef:
    kids = [c.partition_id for c in children_of(s, split.parent_partition_id)]
    return SplitRef(split.split_id, table, split.parent_partition_id, split.state, split.is_async, kids)


def find_split(catalog: Catalog, table: str, partition_id: int) -> SplitRef:
    """The split of ``partition_id``, whatever its state."""
    with catalog.read() as s:
        info = q.table_info(s, table)
        split = _last_split(s, info, partition_id)
        if split is None:
            raise NotFoundError(f"partition {partition_id} of {table} has no split; start one with split keys")
        return _ref(s, split, table)


# -- what the children lack -------------------------------------------------------------------------------------


@dataclass
class PassPlan:
    """What one pass decided: rewrites and merges for the Spark job, acks already recorded, and the cut."""

    split_id: int
    table: str
    phase: SplitPhase
    state: str
    manifest: str | None = None
    result: str | None = None
    cut_entry_id: int = 0  # copy: the parent leader's newest list entry when planned (finalize waits for it)
    rewrites: int = 0
    merges: int = 0
    exists: int = 0
    pending: dict[str, int] = field(default_factory=dict)  # child partition id -> segments it still lacks

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_pass(catalog: Catalog, defs: Definitions, split_id: int, phase: SplitPhase | str | None = None) -> PassPlan:
    """Decide, for every (source placement, child), each segment the child lacks: SEGMENT_EXISTS (acked
    now), a rewrite (fast-forward) or a merge; write the Spark manifest if there is anything to run.
    ``phase`` (copy or unload) plans only if the split is in that phase: a DAG's copy step does nothing for
    an async or already finalized split."""
    now = hlc.now_us()
    with catalog.write() as s:
        view = split_view(s, split_id)
        current = SplitPhase.COPY if view.split.state == SplitState.SPLITTING else SplitPhase.UNLOAD
        plan = PassPlan(split_id, view.info.name, current, view.split.state)
        if view.split.state == SplitState.DONE or (phase is not None and phase != current):
            return plan
        key = f"{view.info.name}-split{split_id}"
        items: list[MergeItem] = []
        # Per child, the segments a placement already pushes it in this pass. Unloading, every placement of the
        # parent pushes, and the replicas hold most of the leader's segments too (the same files): each is
        # read and merged once, and its ack (by any parent placement) answers for the others.
        pushed: dict[int, set[str]] = {child.partition_id: set() for child in view.children}
        for source in view.sources:
            if current == SplitPhase.COPY:
                plan.cut_entry_id = max((x.entry_id for x in view.segments.get(source.placement_id, [])), default=0)
            for child in view.children:
                items += _decide(s, view, source, child, key, plan, pushed[child.partition_id])
        if items:
            mpath, rpath = split_pass_paths(defs, view.info.name, split_id, current, now)
            Manifest(key, items).write(mpath)
            plan.manifest, plan.result = str(mpath), str(rpath)
    return plan


def _decide(
    s: Session, view: SplitView, source: m.Placement, child: m.Partition, key: str, plan: PassPlan, pushed: set[str]
) -> list[MergeItem]:
    """The receive procedure at a child leader for one source: EXISTS, fast-forward (while the child is
    LOADING and the segment continues its chain) or merge; after the first merge, everything merges. A segment
    another source already pushes this child in this pass (``pushed``, which this source's items join) is
    left to that push."""
    target = view.child_leaders[child.partition_id]
    sim = view.chain(target)
    loading = child.state == PartitionState.LOADING
    items: list[MergeItem] = []
    incoming: list[FileRef] = []
    for seg in candidates(view, source, target):
        ref = q.to_ref(seg)
        if is_referenced(sim, seg.segment_id):
            ls.record_ack(s, source.placement_id, seg.segment_id, target.placement_id, hlc.now_us())
            plan.exists += 1
        elif seg.segment_id in pushed:
            continue
        elif loading and not incoming and (seg.base_segment_id == sim.root or (sim.root is None and seg.is_major)):
            source_ref = file_ref(view.sites[source.site_id], source, seg)
            items.append(split_rewrite_item(view, child, target, seg, source_ref))
            sim = apply_fast_forward(sim, ref)
            plan.rewrites += 1
        else:
            incoming.append(file_ref(view.sites[source.site_id], source, seg))
    if incoming:
        items.append(split_merge_item(view, child, target, key, incoming, sim.root))
        plan.merges += 1
    pushed.update(f.segment_id for it in items for f in it.incoming)
    lacking = len(incoming) + sum(1 for it in items if it.kind == "split")
    if lacking:
        plan.pending[str(child.partition_id)] = plan.pending.get(str(child.partition_id), 0) + lacking
    return items


def commit_pass(catalog: Catalog, plan: PassPlan | dict[str, Any]) -> CommitSummary:
    """Record the Spark job's outputs: rewrites fast-forward the children, merges land on them, and the
    parent placements' segments are acked by the children. Running it twice records nothing twice."""
    p = plan if isinstance(plan, PassPlan) else PassPlan(**plan)
    if not p.manifest:
        return CommitSummary()
    return commit_results(catalog, Path(p.manifest), Path(p.result or ""))


# -- finalize and finish ----------------------------------------------------------------------------------------


def finalize(catalog: Catalog, split_id: int, cut_entry_id: int | None = None) -> SplitRef:
    """SPLIT_FINALIZE once every child holds the parent leader's segments up to ``cut_entry_id`` (None: all
    of them). Segments written after the cut reach the children through UNLOAD. Raises SegrepError naming
    what is missing if the copy is not complete; a split past this point is returned as it is."""
    with catalog.write() as s:
        split = must_get(s, m.Split, split_id, lock=True, what="split")
        parent = must_get(s, m.Partition, split.parent_partition_id, lock=True)
        table = must_get(s, m.Table, split.table_id).name
        if split.state != SplitState.SPLITTING:
            return _ref(s, split, table)
        lacking = lacking_counts(split_view(s, split_id), cut_entry_id)
        if lacking:
            what = ", ".join(f"partition {c}: {n}" for c, n in sorted(lacking.items()))
            raise SplitIncompleteError(
                f"split {split_id} of {table}: children still lack segments ({what}); run another pass"
            )
        faults.point("split_before_finalize")
        _finalize_in(s, split, parent)
        return _ref(s, split, table)


def _finalize_in(s: Session, split: m.Split, parent: m.Partition) -> None:
    """Writes move to the children in this transaction: the writer's conditional update on the parent's state
    fails from here on and its retry routes to the children, whose clocks start past every parent row."""
    s.execute(
        update(m.Partition)
        .where(m.Partition.partition_id == parent.partition_id, m.Partition.state == PartitionState.SPLITTING)
        .values(state=PartitionState.UNLOAD)
        .execution_options(synchronize_session=False)
    )
    last = s.scalar(select(m.Partition.last_version).where(m.Partition.partition_id == parent.partition_id)) or 0
    for child in children_of(s, parent.partition_id):
        child.state = PartitionState.LIVE
        child.last_version = max(child.last_version, last)
    split.state = SplitState.UNLOAD


# -- progress ------------------------------------------------------------------------------------------------
