"""Building Spark work items: one place for every item that writes into a partition at its leader.

Rounds (fork merges and major segments), compaction (majors) and splits (rewrites and merges into children)
all build their items here, over the same file references, so an item means the same thing to the job
whichever workflow planned it; so does verify, whose digest items read a placement as the reader would.
Every site an item names carries the store options the loaded definitions give it (``config.stores.options_for``):
the job opens the site with them, whatever store it is on.
"""

from __future__ import annotations

from typing import Any

from segrep.catalog import models as m
from segrep.catalog.queries import TableInfo
from segrep.catalog.snapshot import PartitionSnapshot, TableSnapshot
from segrep.catalog.splits import SplitView
from segrep.config.stores import options_for
from segrep.core.chain import visible_segments
from segrep.data.reader import PlacementFiles
from segrep.spark.digest_manifest import DigestItem
from segrep.spark.manifest import FileRef, MergeItem, output_segment_id


def file_ref(site: m.Site, placement: m.Placement, seg: m.Segment) -> FileRef:
    """A segment file as a job reads it: where it is, and the size and sha256 it must have."""
    return FileRef(
        site.name,
        site.uri,
        seg.relpath,
        seg.segment_id,
        seg.byte_size,
        seg.sha256,
        placement.placement_id,
        options_for(site.name, site.uri),
    )


def leader_item(
    info: TableInfo,
    partition: m.Partition,
    leader: m.Placement,
    site: m.Site,
    *,
    item_id: str,
    kind: str,
    base: str | None,
    visible: list[FileRef],
    incoming: list[FileRef],
    output_segment_id: str,
    **extra: Any,
) -> MergeItem:
    """An item that writes into ``partition`` at its leader placement (rounds, compaction and splits): its
    inputs read, and its output written, at the table's target version (``TableInfo.versions``, read with
    the table's row)."""
    versions = info.versions
    return MergeItem(
        item_id=item_id,
        kind=kind,
        table=info.name,
        partition_id=partition.partition_id,
        columns=[(c.name, c.type) for c in versions.target.columns],
        primary_key=list(info.primary_key),
        schema_fingerprint=info.row.schema_fingerprint,
        leader_site=site.name,
        leader_uri=site.uri,
        leader_options=options_for(site.name, site.uri),
        leader_placement_id=leader.placement_id,
        leader_site_id=site.site_id,
        epoch=partition.epoch,
        base_segment_id=base,
        partition_begin=partition.begin_key,
        partition_end=partition.end_key,
        visible=visible,
        incoming=incoming,
        output_segment_id=output_segment_id,
        first_schema=versions.first.to_json(),
        target_schema=versions.target.to_json(),
        **extra,
    )


def visible_refs(snap: TableSnapshot, part: PartitionSnapshot) -> list[FileRef]:
    """The leader's visible chain (newest major to root) as file references."""
    site = snap.sites[part.leader.site_id]
    return [
        file_ref(site, part.leader, part.segment(part.leader.placement_id, ref.segment_id))
        for ref in visible_segments(part.chain(part.leader))
    ]


def round_item(snap: TableSnapshot, part: PartitionSnapshot, key: str, kind: str, incoming: list[FileRef]) -> MergeItem:
    """A ``merge`` of pushed segments into the leader, or a ``major`` folding its visible chain."""
    site = snap.sites[part.leader.site_id]
    visible = visible_refs(snap, part)
    base = part.leader.root_segment_id
    inputs = [f.segment_id for f in (incoming if kind == "merge" else visible)]
    pid = part.partition.partition_id
    return leader_item(
        snap.info,
        part.partition,
        part.leader,
        site,
        item_id=f"{kind}-{pid}",
        kind=kind,
        base=base,
        visible=visible,
        incoming=incoming,
        output_segment_id=output_segment_id(key, kind, pid, base, inputs),
    )


def split_rewrite_item(
    view: SplitView, child: m.Partition, target: m.Placement, seg: m.Segment, source: FileRef
) -> MergeItem:
    """A ``split`` rewrite of ``seg`` for the child: the same id, base and shape, only rows in its range."""
    site, pid = view.sites[target.site_id], child.partition_id
    included = list(seg.included_segment_ids or [])
    shape: dict[str, Any] = {"is_major": bool(seg.is_major), "included_segment_ids": included}
    return leader_item(
        view.info,
        child,
        target,
        site,
        item_id=f"split-{pid}-{seg.segment_id}",
        kind="split",
        base=seg.base_segment_id,
        visible=[],
        incoming=[source],
        output_segment_id=seg.segment_id,
        partition_key=view.info.partition_key,
        **shape,
    )


def split_merge_item(
    view: SplitView, child: m.Partition, target: m.Placement, key: str, incoming: list[FileRef], base: str | None
) -> MergeItem:
    """A ``merge`` of parent segments into the child that it cannot take as they are; rows in its range only."""
    site, pid = view.sites[target.site_id], child.partition_id
    segs = view.by_id(target)
    visible = [file_ref(site, target, segs[r.segment_id]) for r in visible_segments(view.chain(target))]
    out_id = output_segment_id(key, "merge", pid, base, [f.segment_id for f in incoming])
    return leader_item(
        view.info,
        child,
        target,
        site,
        item_id=f"merge-{pid}-{incoming[0].holder_placement_id}",
        kind="merge",
        base=base,
        visible=visible,
        incoming=incoming,
        output_segment_id=out_id,
        partition_key=view.info.partition_key,
    )


def digest_item(pf: PlacementFiles, as_of_us: int) -> DigestItem:
    """A placement's rows as of ``as_of_us``, as ``data.reader.placement_files`` resolved what to read: its
    visible segments (with an unloading split parent's at the same site) and its key range."""
    options = options_for(pf.site.name, pf.site.uri)
    files = [
        FileRef(
            pf.site.name, pf.site.uri, seg.relpath, seg.segment_id, seg.byte_size, seg.sha256, seg.placement_id, options
        )
        for seg in pf.segments
    ]
    item_id = f"{pf.placement_id}@{as_of_us}"
    return DigestItem(
        item_id, pf.partition_id, pf.placement_id, pf.site.name, as_of_us, pf.key_begin, pf.key_end, files
    )
