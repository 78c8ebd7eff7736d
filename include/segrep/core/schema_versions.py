"""Numbered schema versions of a table, whose columns carry field ids that never change (Iceberg's rule).

A rename keeps the field id, so a rename is never a drop plus an add; a dropped column's id is never reused.
Every segment is self-describing: its Parquet fields carry their ids (``PARQUET:field_id``, which Arrow writes
as Parquet's own field_id) and its key-value metadata the whole version (``segrep.schema``), so a reader maps
an old file's columns to the current ones by id, and a catalog rebuilt from files recovers the history. A file
written before versions existed carries neither: it is version 1, whose ids are 1..n in column order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from segrep.core.errors import SegrepError
from segrep.core.schema import INTERNAL_FIELDS, parse_type

FIELD_ID_KEY = b"PARQUET:field_id"
SCHEMA_META_KEY = b"segrep.schema"
FIRST_VERSION = 1


@dataclass(frozen=True)
class Column:
    """One column of one schema version. ``type`` is the definitions file's type name (``int64``,
    ``decimal(15,2)``); ``default`` the JSON value rows written before the column existed read as (None:
    null)."""

    field_id: int
    name: str
    type: str
    default: Any = None

    @property
    def arrow_type(self) -> pa.DataType:
        return parse_type(self.type)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.field_id, "name": self.name, "type": self.type}
        if self.default is not None:
            out["default"] = self.default
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Column:
        return cls(int(raw["id"]), str(raw["name"]), str(raw["type"]), raw.get("default"))


@dataclass(frozen=True)
class SchemaVersion:
    """The visible columns of a table at one version, in their order."""

    version: int
    columns: tuple[Column, ...]

    def __post_init__(self) -> None:
        ids = [c.field_id for c in self.columns]
        names = [c.name for c in self.columns]
        if len(set(ids)) != len(ids) or len(set(names)) != len(names) or any(i < 1 for i in ids):
            raise SegrepError(f"schema version {self.version}: field ids and names must be unique, ids >= 1")

    def by_id(self) -> dict[int, Column]:
        return {c.field_id: c for c in self.columns}

    def arrow(self) -> pa.Schema:
        """The table's columns as Arrow fields, each carrying its field id."""
        return pa.schema([_field(c) for c in self.columns])

    def segment_arrow(self) -> pa.Schema:
        """A segment file's schema at this version: the columns (nullable, for tombstones), the internal
        columns (no field id: matched by name), and the version itself in the schema's metadata."""
        return pa.schema(
            [*(_field(c) for c in self.columns), *INTERNAL_FIELDS], metadata={SCHEMA_META_KEY: self.to_json()}
        )

    def to_json(self) -> str:
        return json.dumps({"version": self.version, "columns": [c.to_dict() for c in self.columns]}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> SchemaVersion:
        raw = json.loads(text)
        return cls(int(raw["version"]), tuple(Column.from_dict(c) for c in raw["columns"]))


def first_version(columns: Mapping[str, str] | Sequence[tuple[str, str]]) -> SchemaVersion:
    """Version 1 of a table with ``columns`` (name -> type name, in order): field ids 1..n in that order,
    the ids every file written before versions existed is read with."""
    pairs = list(columns.items()) if isinstance(columns, Mapping) else list(columns)
    return SchemaVersion(FIRST_VERSION, tuple(Column(i, name, kind) for i, (name, kind) in enumerate(pairs, 1)))


def version_of_file(schema: pa.Schema) -> SchemaVersion | None:
    """The schema version a segment file says it was written at; None for a file written before versions
    existed (read it as version 1). SegrepError if the metadata is there but malformed."""
    raw = (schema.metadata or {}).get(SCHEMA_META_KEY)
    if raw is None:
        return None
    try:
        version = SchemaVersion.from_json(raw)
        for column in version.columns:
            column.arrow_type  # noqa: B018 - a type name that does not parse is malformed metadata too
    except (ValueError, KeyError, TypeError, SegrepError) as exc:
        raise SegrepError(f"segment schema metadata is malformed: {exc}") from None
    return version


def _field(column: Column) -> pa.Field:
    return pa.field(column.name, column.arrow_type, metadata={FIELD_ID_KEY: str(column.field_id).encode()})
