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
from segrep.core.errors import SegrepError
from segrep.core.schema_versions import FIRST_VERSION, version_of_file

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
    # the table's schema version the rows were written at (a file written before versions existed: 1)
    schema_version: int = 1

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


def stamp_rows(
    rows: pa.Table,
    schema: pa.Schema,
    *,
    version: int,
    deleted: bool,
    origin: int,
    layout: pa.Schema | None = None,
) -> pa.Table:
    """Rows in segment layout: every table column (nulls where a tombstone has none) plus internal columns.
    ``layout``: the file's schema when it is more than names and types (``SchemaVersion.segment_arrow``:
    field ids and the version in its metadata); the same columns as ``segment_schema(schema)``."""
    n = rows.num_rows
    arrays = [rows.column(f.name) if f.name in rows.column_names else pa.nulls(n, f.type) for f in schema]
    arrays += [
        pa.array(np.full(n, version, np.int64)),
        pa.array(np.full(n, deleted, np.bool_)),
        pa.array(np.full(n, origin, np.int32)),
    ]
    return pa.Table.from_arrays(arrays, schema=layout if layout is not None else sch.segment_schema(schema))


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


@dataclass(frozen=True)
class ExpectedSegment:
    """What the catalog says one segment file is. Every read checks the file against it, so a file that is
    another segment (swapped, copied to the wrong place), truncated, damaged or rewritten never serves rows."""

    segment_id: str
    table: str
    partition_id: int
    byte_size: int
    row_count: int
    deleted_rows: int
    min_version: int
    max_version: int
    key_min: Any  # None where the catalog has no key range
    key_max: Any
    # the segment layout of a file without schema metadata (the table's version 1, ``schema.segment_schema``);
    # a file that says its version (``core.schema_versions``) must have that version's columns instead
    schema: pa.Schema
    sha256: str  # the file's bytes, as the catalog records them (every read checks one of the two)
    crc64nvme: str | None  # None for segments written before the catalog recorded it
    schema_version: int | None = None  # the version the catalog says the file is at (None: not recorded)

    def describe(self) -> str:
        return f"segment {self.segment_id} of {self.table} partition {self.partition_id}"


_ENTRY_FIELDS = ("row_count", "deleted_rows", "min_version", "max_version", "key_min", "key_max")


def footer_differences(
    expected: ExpectedSegment, entry: dict[str, Any] | None, num_rows: int, size: int, schema: pa.Schema
) -> list[str]:
    """How a file's size, footer entry (``segrep.segment``), row count and columns (as a read would see them)
    differ from the catalog's row and the table's schema.

    Costs nothing beyond reading the footer; an empty list means the file says it is the expected segment. A
    file that says its schema version must hold that version's columns (and be at the catalog's version where
    it is recorded), one without must hold version 1's (``expected.schema``). The
    columns matter: a multi-file read fills a column one file lacks (a damaged name) with nulls."""
    out = []
    try:
        declared = version_of_file(schema)
    except SegrepError as exc:
        return [f"its {exc}"]
    version = FIRST_VERSION if declared is None else declared.version
    if expected.schema_version is not None and version != expected.schema_version:
        out.append(f"it is at schema version {version} (the catalog says {expected.schema_version})")
    got = [(f.name, f.type) for f in schema]
    want = [(f.name, f.type) for f in (expected.schema if declared is None else declared.segment_arrow())]
    if got != want:
        diff = next(((g, w) for g, w in zip(got, want, strict=False) if g != w), None)
        detail = (
            f"column {diff[0][0]} {diff[0][1]} where the table has {diff[1][0]} {diff[1][1]}"
            if diff is not None
            else f"{len(got)} columns where the table's segments have {len(want)}"
        )
        out.append(f"its columns are not the table's ({detail})")
    if size != expected.byte_size:
        out.append(f"size {size} bytes (the catalog says {expected.byte_size})")
    if entry is None:
        out.append("its footer carries no segrep segment entry")
    elif (entry.get("segment_id"), entry.get("table"), entry.get("partition_id")) != (
        expected.segment_id,
        expected.table,
        expected.partition_id,
    ):
        out.append(
            f"its footer says it is segment {entry.get('segment_id')} of {entry.get('table')} partition "
            f"{entry.get('partition_id')}, not {expected.describe()}"
        )
    else:
        out += [
            f"its footer's {name} is {entry.get(name)!r} (the catalog says {getattr(expected, name)!r})"
            for name in _ENTRY_FIELDS
            if not _same_or_unknown(getattr(expected, name), entry.get(name))
        ]
    if num_rows != expected.row_count:
        out.append(f"{num_rows} rows (the catalog says {expected.row_count})")
    return out


def rows_differences(expected: ExpectedSegment, rows: pa.Table, primary_key: Sequence[str]) -> list[str]:
    """How rows read from a segment file differ from the catalog's row: count, primary-key range and, where
    the internal columns were read, version range and tombstones. Linear passes over columns in memory."""
    out = []
    if rows.num_rows != expected.row_count:
        out.append(f"{rows.num_rows} rows read (the catalog says {expected.row_count})")
        return out
    if expected.key_min is not None and expected.key_max is not None and rows.num_rows:
        key_min = [keys.encode(v) for v in lexicographic_extreme(rows, primary_key, "min")]
        key_max = [keys.encode(v) for v in lexicographic_extreme(rows, primary_key, "max")]
        if key_min != list(expected.key_min) or key_max != list(expected.key_max):
            out.append(
                f"keys {key_min}..{key_max} read (the catalog says {list(expected.key_min)}..{list(expected.key_max)})"
            )
    if sch.VERSION_COL in rows.column_names and rows.num_rows:
        versions = pc.min_max(rows.column(sch.VERSION_COL))
        got = (versions["min"].as_py(), versions["max"].as_py())
        if got != (expected.min_version, expected.max_version):
            out.append(
                f"versions {got[0]}..{got[1]} read (the catalog says {expected.min_version}..{expected.max_version})"
            )
    if sch.DELETED_COL in rows.column_names:
        deleted = int(pc.sum(rows.column(sch.DELETED_COL).cast(pa.int64())).as_py() or 0)
        if deleted != expected.deleted_rows:
            out.append(f"{deleted} tombstones read (the catalog says {expected.deleted_rows})")
    return out


def _same_or_unknown(expected: Any, got: Any) -> bool:
    """Equal, comparing JSON lists and tuples alike; a value the catalog does not have (None) matches anything."""
    if expected is None:
        return True
    if isinstance(expected, list | tuple) and isinstance(got, list | tuple):
        return list(expected) == list(got)
    return bool(expected == got)
