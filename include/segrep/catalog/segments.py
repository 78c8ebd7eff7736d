"""A segment's catalog row: built from its entry, read back as one, and registered in a placement's list.

Registering a segment never reads its rows: it is one INSERT and a conditional root move.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, insert, update
from sqlalchemy.orm import Session

from segrep.catalog import models as m
from segrep.catalog.sql import rowcount
from segrep.core.errors import ConflictError
from segrep.storage.atomic import FileFacts
from segrep.storage.segment_meta import SegmentEntry


def entry_of(seg: m.Segment, table: str, partition: m.Partition) -> SegmentEntry:
    """The entry of a catalog row (the footer's metadata as the catalog holds it)."""
    return SegmentEntry(
        segment_id=seg.segment_id,
        table=table,
        partition_id=seg.partition_id,
        base_segment_id=seg.base_segment_id,
        is_major=seg.is_major,
        row_count=seg.row_count,
        deleted_rows=seg.deleted_rows,
        min_version=seg.min_version,
        max_version=seg.max_version,
        key_min=seg.key_min,
        key_max=seg.key_max,
        origin_site_id=seg.origin_site_id,
        epoch=seg.epoch,
        schema_fingerprint=seg.schema_fingerprint,
        partition_begin=partition.begin_key,
        partition_end=partition.end_key,
        included_segment_ids=tuple(seg.included_segment_ids or ()),
        schema_version=seg.schema_version,
    )


def segment_row(entry: SegmentEntry, placement_id: int, relpath: str, facts: FileFacts, committed_us: int) -> m.Segment:
    """The catalog row of an entry held by a placement."""
    return m.Segment(**segment_values(entry, placement_id, relpath, facts, committed_us))


def segment_values(
    entry: SegmentEntry, placement_id: int, relpath: str, facts: FileFacts, committed_us: int
) -> dict[str, Any]:
    """The columns of ``segment_row``, for ``insert_segments``."""
    return {
        "placement_id": placement_id,
        "segment_id": entry.segment_id,
        "partition_id": entry.partition_id,
        "base_segment_id": entry.base_segment_id,
        "included_segment_ids": list(entry.included_segment_ids),
        "is_major": entry.is_major,
        "row_count": entry.row_count,
        "deleted_rows": entry.deleted_rows,
        "byte_size": facts.byte_size,
        "sha256": facts.sha256,
        "crc64nvme": facts.crc64nvme,
        "min_version": entry.min_version,
        "max_version": entry.max_version,
        "key_min": entry.key_min,
        "key_max": entry.key_max,
        "origin_site_id": entry.origin_site_id,
        "epoch": entry.epoch,
        "schema_fingerprint": entry.schema_fingerprint,
        "schema_version": entry.schema_version,
        "relpath": relpath,
        "committed_us": committed_us,
    }


def insert_segments(s: Session, rows: list[dict[str, Any]]) -> None:
    """Add list entries (``segment_values``) in the order given, in one statement: the ORM would flush one
    INSERT per row to learn each new ``entry_id``, which nobody reads here. The entries are numbered in
    that order (an INSERT's rows take their ids in order), which is the list order."""
    if rows:
        s.execute(_INSERT_SEGMENTS, rows)


def register_segment(
    s: Session,
    placement: m.Placement,
    entry: SegmentEntry,
    relpath: str,
    facts: FileFacts,
    committed_us: int,
    *,
    expected_root: str | None,
    move_root: bool = True,
) -> m.Segment:
    """Insert a segment into a placement's list and (by default) make it the root, in the caller's
    transaction. The root moves only if it is still ``expected_root`` (a conditional update), else
    ConflictError: someone else extended the chain first and the caller must re-decide."""
    if move_root:
        move_root_to(s, placement.placement_id, entry.segment_id, expected_root=expected_root)
    row = segment_row(entry, placement.placement_id, relpath, facts, committed_us)
    s.add(row)
    return row


# built once (catalog.sql says why): every commit of a batch moves a root
_MOVE_ROOT = (
    update(m.Placement)
    .where(m.Placement.placement_id == bindparam("placement"), m.Placement.root_segment_id == bindparam("expected"))
    .values(root_segment_id=bindparam("root"))
    .execution_options(synchronize_session=False)
)
_MOVE_FIRST_ROOT = (
    update(m.Placement)
    .where(m.Placement.placement_id == bindparam("placement"), m.Placement.root_segment_id.is_(None))
    .values(root_segment_id=bindparam("root"))
    .execution_options(synchronize_session=False)
)
_INSERT_SEGMENTS = insert(m.Segment)


def move_root_to(s: Session, placement_id: int, segment_id: str, *, expected_root: str | None) -> None:
    """Make ``segment_id`` (in the placement's list, or being added to it) the placement's root if the root is
    still ``expected_root`` (a conditional update), else ConflictError: someone else moved the chain first."""
    if expected_root is None:
        res = s.execute(_MOVE_FIRST_ROOT, {"placement": placement_id, "root": segment_id})
    else:
        res = s.execute(_MOVE_ROOT, {"placement": placement_id, "root": segment_id, "expected": expected_root})
    if rowcount(res) != 1:
        raise ConflictError(f"placement {placement_id}: root moved while writing {segment_id}")
