"""A segment's catalog entry: built from rows, carried in the file's footer, and registered in the catalog.

The same entry travels three ways (catalog row, Parquet metadata, rebuild from storage), so it is defined
once here. Registering a segment never reads its rows: it is one INSERT and a conditional root move.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy import update
from sqlalchemy.orm import Session

from segrep.catalog import models as m
from segrep.core import keys
from segrep.core import schema as sch
from segrep.core.errors import ConflictError
from segrep.storage.site import FileFacts

META_FORMAT = 1


@dataclass(frozen=True)
class SegmentEntry:
    segment_id: str
    table: str
    partition_id: int
    base_segment_id: str | None
    is_major: bool
    row_count: int
    deleted_rows: int
    min_version: int
    max_version: int
    key_min: Any  # smallest and largest primary key (JSON list, lexicographic), for the reader's overlap check
    key_max: Any
    origin_site_id: int
    epoch: int
    schema_fingerprint: str
    partition_begin: Any = None
    partition_end: Any = None
    included_segment_ids: tuple[str, ...] = field(default_factory=tuple)

    def to_meta(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["included_segment_ids"] = list(self.included_segment_ids)
        doc["format"] = META_FORMAT
        return doc

    @classmethod
    def from_meta(cls, doc: dict[str, Any]) -> SegmentEntry:
        doc = dict(doc)
        doc.pop("format", None)
        doc["included_segment_ids"] = tuple(doc.get("included_segment_ids") or ())
        return cls(**doc)

    @classmethod
    def from_row(cls, seg: m.Segment, table: str, partition: m.Partition) -> SegmentEntry:
        return cls(
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
        )

    def to_row(self, placement_id: int, relpath: str, facts: FileFacts, committed_us: int) -> m.Segment:
        return m.Segment(
            placement_id=placement_id,
            segment_id=self.segment_id,
            partition_id=self.partition_id,
            base_segment_id=self.base_segment_id,
            included_segment_ids=list(self.included_segment_ids),
            is_major=self.is_major,
            row_count=self.row_count,
            deleted_rows=self.deleted_rows,
            byte_size=facts.byte_size,
            sha256=facts.sha256,
            min_version=self.min_version,
            max_version=self.max_version,
            key_min=self.key_min,
            key_max=self.key_max,
            origin_site_id=self.origin_site_id,
            epoch=self.epoch,
            schema_fingerprint=self.schema_fingerprint,
            relpath=relpath,
            committed_us=committed_us,
        )


def stamp_rows(rows: pa.Table, schema: pa.Schema, *, version: int, deleted: bool, origin: int) -> pa.Table:
    """Rows in segment layout: every table column (nulls where a tombstone has none) plus internal columns."""
    n = rows.num_rows
    arrays = [rows.column(f.name) if f.name in rows.column_names else pa.nulls(n, f.type) for f in schema]
    arrays += [
        pa.array(np.full(n, version, np.int64)),
        pa.array(np.full(n, deleted, np.bool_)),
        pa.array(np.full(n, origin, np.int32)),
    ]
    return pa.Table.from_arrays(arrays, schema=sch.segment_schema(schema))


def entry_stats(rows: pa.Table, primary_key: Sequence[str]) -> dict[str, Any]:
    """Row count, tombstones, version range and primary-key range of segment-layout rows."""
    versions = pc.min_max(rows.column(sch.VERSION_COL))
    return {
        "row_count": rows.num_rows,
        "deleted_rows": int(pc.sum(rows.column(sch.DELETED_COL).cast(pa.int64())).as_py() or 0),
        "min_version": int(versions["min"].as_py() or 0),
        "max_version": int(versions["max"].as_py() or 0),
        "key_min": [keys.encode(v) for v in lexicographic_extreme(rows, primary_key, "min")],
        "key_max": [keys.encode(v) for v in lexicographic_extreme(rows, primary_key, "max")],
    }


def lexicographic_extreme(rows: pa.Table, primary_key: Sequence[str], which: str) -> list[Any]:
    """The smallest (or largest) composite key, in linear passes: extreme of the first column, then of
    the second among the rows that tie on the first, and so on."""
    if rows.num_rows == 0:
        return [None] * len(primary_key)
    out: list[Any] = []
    candidates = rows.select(list(primary_key))
    for name in primary_key:
        col = candidates.column(name)
        value = pc.min_max(col)[which]
        out.append(value.as_py())
        candidates = candidates.filter(pc.equal(col, value))
    return out


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
        root_is = (
            m.Placement.root_segment_id.is_(None)
            if expected_root is None
            else m.Placement.root_segment_id == expected_root
        )
        res = s.execute(
            update(m.Placement)
            .where(m.Placement.placement_id == placement.placement_id, root_is)
            .values(root_segment_id=entry.segment_id)
            .execution_options(synchronize_session=False)
        )
        if res.rowcount != 1:
            raise ConflictError(f"placement {placement.placement_id}: root moved while writing {entry.segment_id}")
    row = entry.to_row(placement.placement_id, relpath, facts, committed_us)
    s.add(row)
    return row
