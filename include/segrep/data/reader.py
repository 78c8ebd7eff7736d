"""Resolving a placement, or a table at a site, to its current rows.

The rows of a placement are those of its visible segments (newest major up to the root). For each primary
key the row with the highest ``(_version, _origin)`` wins; a winning tombstone hides the key. When the
segments' leading-key ranges do not overlap and hold no tombstone, no key can appear twice and the files are
simply concatenated: the common case of append-mostly tables costs no more than reading the files.

Every file is read at the table's target schema version (``TableInfo.versions``, read with the table's
row): its columns are projected by field id (``core.projection``) before rows of files of different versions
meet, so a table whose segments were written at several versions resolves, merges and digests as one.

No file serves rows before it proved to be the segment the catalog names: its bytes' content checksum
(computed as they are read, once, into memory: ``Site.read_checked``), its footer entry (segment id, table,
partition, counts, ranges), its size and row count, every page's CRC, then the row count and key and version
ranges of what was read (linear passes over columns already in memory). A mismatch raises CorruptSegmentError
naming the site, the file, what differs and how to restore the file.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy.orm import Session

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.site_identity import open_site
from segrep.core import keys
from segrep.core import schema as sch
from segrep.core.chain import is_referenced, visible_segments
from segrep.core.errors import CorruptSegmentError, NotFoundError
from segrep.core.projection import ReadVersions
from segrep.core.states import PartitionState
from segrep.storage.segment_meta import ExpectedSegment
from segrep.storage.site import Site

# Files read at once by one read: enough to keep both the disk (or the store) and the decoding busy; each
# holds one file's bytes in memory while it is decoded.
_READ_THREADS = max(4, os.cpu_count() or 1)
_Item = TypeVar("_Item")


@dataclass(frozen=True)
class PlacementFiles:
    """What a reader needs to resolve one placement: the files of its visible segments and its key range."""

    placement_id: int
    partition_id: int
    site: Site
    segments: tuple[m.Segment, ...]
    key_begin: Any
    key_end: Any
    disjoint: bool
    table: str
    is_leader: bool  # whose copy a damaged file is decides how to restore it


def segments_disjoint(segments: Sequence[m.Segment], decode: Callable[[Any], Any]) -> bool:
    """True if no primary key can occur in two of these segments and none holds a tombstone.

    Each segment's keys are unique (the writer de-duplicates a batch), so disjoint primary-key ranges
    (compared lexicographically) mean disjoint keys. Touching ranges count as overlapping.
    """
    if any(seg.deleted_rows for seg in segments):
        return False
    ranges = sorted((decode(seg.key_min), decode(seg.key_max)) for seg in segments if seg.row_count)
    return all(prev[1] < nxt[0] for prev, nxt in itertools.pairwise(ranges))


def placement_files(catalog: Catalog, table: str, site: str | None = None) -> tuple[q.TableInfo, list[PlacementFiles]]:
    """The files to read for a table at a site (default: each partition's leader), partitions in key order."""
    with catalog.read() as s:
        info = q.table_info(s, table)
        return info, placement_files_in(s, catalog, info, site)


def placement_files_in(s: Session, catalog: Catalog, info: q.TableInfo, site: str | None) -> list[PlacementFiles]:
    """:func:`placement_files` in the caller's session: one snapshot of the catalog for several sites' files
    (a publication of every site of a table reads them together), the rows read once."""
    table = info.name
    parts = q.serving_partitions(s, info)
    placements = q.active_placements(s, [p.partition_id for p in parts])
    sites = q.sites_by_id(s)
    site_row = q.site_by_name(s, site) if site is not None else None
    chosen: list[m.Placement] = []
    for part in parts:
        candidates = [
            pl
            for pl in placements
            if pl.partition_id == part.partition_id
            and (pl.site_id == site_row.site_id if site_row else pl.placement_id == part.leader_placement_id)
        ]
        if not candidates:
            where = f"site {site}" if site else "its leader"
            raise NotFoundError(f"table {table}: partition {part.partition_id} has no placement at {where}")
        chosen.append(candidates[0])
    unloading = _unloading_parents(s, info, parts, chosen)
    seg_lists = q.segments_of(s, [pl.placement_id for pl in (*chosen, *unloading.values())])
    by_partition = {p.partition_id: p for p in parts}
    out = []
    for pl in chosen:
        visible = _visible(pl, seg_lists)
        if info.row.writes == "any_site" and pl.placement_id != by_partition[pl.partition_id].leader_placement_id:
            visible = (*visible, *_local_writes(pl, seg_lists))  # read-your-writes before the merge
        begin, end = pl.key_begin, pl.key_end
        disjoint = segments_disjoint(visible, info.decode_primary_key)
        parent_pl = unloading.get(pl.placement_id)
        if parent_pl is not None:  # the parent's rows in this child's range, until UNLOAD_FINAL
            part = by_partition[pl.partition_id]
            visible = (*visible, *_visible(parent_pl, seg_lists))
            begin, end, disjoint = part.begin_key, part.end_key, False
        site_obj = open_site(catalog, sites[pl.site_id])
        is_leader = pl.placement_id == by_partition[pl.partition_id].leader_placement_id
        out.append(
            PlacementFiles(
                pl.placement_id, pl.partition_id, site_obj, visible, begin, end, disjoint, info.name, is_leader
            )
        )
    return out


def _visible(pl: m.Placement, seg_lists: dict[int, list[m.Segment]]) -> tuple[m.Segment, ...]:
    segs = seg_lists.get(pl.placement_id, [])
    by_id = {x.segment_id: x for x in segs}
    return tuple(by_id[ref.segment_id] for ref in visible_segments(q.chain_of(pl, segs)))


def _local_writes(pl: m.Placement, seg_lists: dict[int, list[m.Segment]]) -> tuple[m.Segment, ...]:
    """Segments written at this site of an active-active table that its chain does not reference yet (not
    merged at the leader, or merged but the output not fast-forwarded here): they sit beside the chain."""
    segs = seg_lists.get(pl.placement_id, [])
    chain = q.chain_of(pl, segs)
    return tuple(seg for seg in segs if seg.origin_site_id == pl.site_id and not is_referenced(chain, seg.segment_id))


def _unloading_parents(
    s: Any, info: q.TableInfo, parts: Sequence[m.Partition], chosen: Sequence[m.Placement]
) -> dict[int, m.Placement]:
    """Child placement id -> its parent's placement at the same site, for children of a parent in UNLOAD.

    After SPLIT_FINALIZE the children serve, but until UNLOAD completes the parent may hold rows they lack
    (all of them, for an async split): reading both, restricted to the child's range, last writer wins,
    answers what the parent would have. After UNLOAD_FINAL the children hold everything."""
    parents = {p.partition_id for p in q.partitions_of(s, info, [PartitionState.UNLOAD])}
    children = {p.partition_id: p.parent_partition_id for p in parts if p.parent_partition_id in parents}
    if not children:
        return {}
    at = {(pl.partition_id, pl.site_id): pl for pl in q.active_placements(s, sorted(parents))}
    out = {}
    for pl in chosen:
        parent_id = children.get(pl.partition_id)
        parent_pl = None if parent_id is None else at.get((parent_id, pl.site_id))
        if parent_pl is not None:
            out[pl.placement_id] = parent_pl
    return out


def read_table(
    catalog: Catalog,
    table: str,
    site: str | None = None,
    *,
    as_of: int | None = None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """The table's current rows at a site (default: at the leaders), optionally as of a version/safe time."""
    info, placements = placement_files(catalog, table, site)
    if columns is not None:
        unknown = [c for c in columns if c not in info.schema.names]
        if unknown:
            raise NotFoundError(f"table {table} has no column(s) {', '.join(unknown)}")
    simple: list[PlacementFiles] = []
    parts: list[pa.Table] = []
    for pf in placements:
        if as_of is None and pf.disjoint and pf.key_begin is None and pf.key_end is None:
            simple.append(pf)
        else:
            parts.append(read_placement(info, pf, as_of=as_of))
    if simple:
        parts.append(_read_concatenated(info, simple))
    out = pa.concat_tables(parts) if parts else info.schema.empty_table()
    return out.select(list(columns)) if columns is not None else out


def expected_segment(info: q.TableInfo, seg: m.Segment) -> ExpectedSegment:
    """What the catalog row says the segment's file is, for the checks every read makes (a file without
    schema metadata must hold the table's version 1)."""
    return ExpectedSegment(
        segment_id=seg.segment_id,
        table=info.name,
        partition_id=seg.partition_id,
        byte_size=seg.byte_size,
        row_count=seg.row_count,
        deleted_rows=seg.deleted_rows,
        min_version=seg.min_version,
        max_version=seg.max_version,
        key_min=seg.key_min,
        key_max=seg.key_max,
        schema=sch.segment_schema(info.versions.first.arrow()),
        schema_version=seg.schema_version,
        sha256=seg.sha256,
        crc64nvme=seg.crc64nvme,
    )


@contextmanager
def restore_advice(pf: PlacementFiles) -> Iterator[None]:
    """A CorruptSegmentError raised inside gets what to do about it: ``segrep repair`` fetches the file again
    from any site whose copy is intact (a replica's copy mends the leader's too)."""
    try:
        yield
    except CorruptSegmentError as exc:
        whose = "the leader's copy" if pf.is_leader else "a replica's copy"
        advice = f"{whose}: run `segrep repair {pf.table} --site {pf.site.name}` to fetch it again from an intact copy"
        raise CorruptSegmentError(f"{exc}; {advice}") from None


def placement_rows(info: q.TableInfo, pf: PlacementFiles) -> pa.Table:
    """A placement's rows in segment layout (internal columns kept, not yet resolved), every file checked,
    restricted to the placement's key range. None of its files: an empty segment-layout table."""
    tables = checked_reads(info, [(pf, seg) for seg in pf.segments])
    if not tables:
        return sch.segment_schema(info.versions.target.arrow()).empty_table()
    rows = pa.concat_tables(tables)
    restriction = _range_filter(info, pf.key_begin, pf.key_end)
    return rows if restriction is None else rows.filter(restriction)


def read_placement(info: q.TableInfo, pf: PlacementFiles, *, as_of: int | None = None) -> pa.Table:
    if not pf.segments:
        return info.schema.empty_table()
    rows = placement_rows(info, pf)
    if as_of is not None:
        rows = rows.filter(pc.field(sch.VERSION_COL) <= as_of)
    elif pf.disjoint:
        return rows.drop_columns(list(sch.INTERNAL_COLUMNS))
    return resolve(rows, info.primary_key)


def _read_concatenated(info: q.TableInfo, placements: Sequence[PlacementFiles]) -> pa.Table:
    """Placements whose segments cannot share a key: their files' table columns (the internal ones are not
    decoded), concatenated. Each file is checked as ``read_checked`` does (its bytes' checksum, its footer
    entry, which carries the version range and tombstone count, its pages, its row count and key range)."""
    files = [(pf, seg) for pf in placements for seg in pf.segments]
    tables = checked_reads(info, files, list(info.schema.names))
    return pa.concat_tables(tables).cast(info.schema) if tables else info.schema.empty_table()


def checked_reads(
    info: q.TableInfo, files: Sequence[tuple[PlacementFiles, m.Segment]], columns: list[str] | None = None
) -> list[pa.Table]:
    """Each file's rows at the table's target version (``Site.read_checked``, ``columns`` named as in that
    version), in order, read by a few threads at once: reading, hashing and
    decoding all release the GIL, so one file's bytes are read and hashed while another's are decoded. The
    first damaged file in order raises, with what to do about it (``restore_advice``); files not started yet
    are then not read."""

    versions = info.versions

    def read(item: tuple[PlacementFiles, m.Segment]) -> pa.Table:
        pf, seg = item
        with restore_advice(pf):
            return checked_read(info, pf.site, seg, columns, versions)

    return read_in_threads(read, files)


def read_in_threads(read: Callable[[_Item], pa.Table], items: Sequence[_Item]) -> list[pa.Table]:
    """``read`` of each item, in order, a few at once (file reads and Parquet decoding release the GIL; on an
    object store each read waits mostly on the network). The first failure in order raises; items not
    started yet are then not read."""
    if len(items) <= 1:
        return [read(item) for item in items]
    pool = ThreadPoolExecutor(min(len(items), _READ_THREADS), thread_name_prefix="segrep-read")
    try:
        return list(pool.map(read, items))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def checked_read(
    info: q.TableInfo,
    site: Site,
    seg: m.Segment,
    columns: list[str] | None = None,
    versions: ReadVersions | None = None,
) -> pa.Table:
    """One segment file's rows (segment layout; only ``columns`` if given), checked against the catalog's row
    and projected to the table's target version (``versions``, default the table's ``info.versions``)."""
    versions = info.versions if versions is None else versions
    return site.read_checked(seg.relpath, expected_segment(info, seg), info.primary_key, columns, versions)


def resolve(rows: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """Last writer wins per primary key over segment-layout rows; tombstones hidden, internal columns dropped."""
    if rows.num_rows == 0:
        return rows.drop_columns(list(sch.INTERNAL_COLUMNS))
    order, first = newest_first(rows, primary_key)
    deleted = rows.column(sch.DELETED_COL).take(order).to_numpy(zero_copy_only=False)
    winners = pc.filter(order, pa.array(first & ~deleted))
    return rows.take(winners).drop_columns(list(sch.INTERNAL_COLUMNS))


def latest(rows: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """One row per primary key, the highest ``(_version, _origin)``, in key order; tombstones and internal
    columns kept (what a merge or a major segment holds). Rows alike in key, version and origin are one write
    seen twice: the first in ``rows`` is kept."""
    if rows.num_rows == 0:
        return rows
    order, first = newest_first(rows, primary_key)
    return rows.take(pc.filter(order, pa.array(first)))


def newest_first(rows: pa.Table, primary_key: Sequence[str]) -> tuple[pa.Array, np.ndarray]:
    """The rows' order by key, then ``(_version, _origin)`` descending (a stable sort), and which positions in
    that order begin a key (its winner under last-writer-wins)."""
    sort_keys = [(k, "ascending") for k in primary_key] + [
        (sch.VERSION_COL, "descending"),
        (sch.ORIGIN_COL, "descending"),
    ]
    order = pc.sort_indices(rows.select([*primary_key, sch.VERSION_COL, sch.ORIGIN_COL]), sort_keys=sort_keys)
    ordered_keys = rows.select(list(primary_key)).take(order)
    first = np.ones(rows.num_rows, dtype=bool)
    if rows.num_rows > 1:
        changed = np.zeros(rows.num_rows - 1, dtype=bool)
        for name in primary_key:
            col = ordered_keys.column(name)
            changed |= pc.not_equal(col.slice(1), col.slice(0, rows.num_rows - 1)).to_numpy(zero_copy_only=False)
        first[1:] = changed
    return order, first


def _range_filter(info: q.TableInfo, begin: Any, end: Any) -> pc.Expression | None:
    return key_range(info.partition_key, info.key_type, begin, end)


def key_range(partition_key: str, key_type: pa.DataType, begin: Any, end: Any) -> pc.Expression | None:
    """Rows with ``begin <= partition_key < end`` (bounds in JSON form, ``core.keys``; None is unbounded);
    None when both are unbounded."""
    lo, hi = keys.decode(begin, key_type), keys.decode(end, key_type)
    expr = None
    key = pc.field(partition_key)
    if lo is not None:
        expr = key >= pa.scalar(lo, key_type)
    if hi is not None:
        upper = key < pa.scalar(hi, key_type)
        expr = upper if expr is None else expr & upper
    return expr
