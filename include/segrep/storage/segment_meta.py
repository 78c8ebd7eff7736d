"""A segment's entry: built from rows and carried in the file's footer (its catalog row: catalog.segments).

The same entry travels three ways (catalog row, Parquet metadata, rebuild from storage), so it is defined
once here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from segrep.core import keys
from segrep.core import schema as sch

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
