"""A segment file's rows at another schema version of its table, matched by field id (DESIGN 16).

A file keeps the columns of the version it was written at; every read projects it to the version it reads at:
a column the target has and the file has (by id) is the file's, renamed and widened as the target says; one the
file lacks (added later) reads as the target's default, or null; one the target lacks (dropped) is left out.
The internal columns (``_version``, ``_deleted``, ``_origin``) are matched by name and stay after the table's.
A file already at the target version is returned as it is: the common case costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa

from segrep.core import keys
from segrep.core.errors import SegrepError
from segrep.core.schema import INTERNAL_COLUMNS
from segrep.core.schema_versions import Column, SchemaVersion, version_of_file


@dataclass(frozen=True)
class ReadVersions:
    """What a read of a table's segment files needs: the table's version 1 (what a file without schema
    metadata holds) and the version every file is projected to."""

    first: SchemaVersion
    target: SchemaVersion

    def file_version(self, schema: pa.Schema) -> SchemaVersion:
        return file_version_of(schema, self.first)


def file_version_of(schema: pa.Schema, first: SchemaVersion) -> SchemaVersion:
    """The version a segment file was written at: what its metadata says, else ``first`` (version 1)."""
    return version_of_file(schema) or first


def same_columns(a: SchemaVersion, b: SchemaVersion) -> bool:
    """True if files of the two versions hold the same columns (ids, names, types, order): no projection."""
    return [(c.field_id, c.name, c.type) for c in a.columns] == [(c.field_id, c.name, c.type) for c in b.columns]


def narrowed(version: SchemaVersion, names: Sequence[str]) -> SchemaVersion:
    """``version`` with only the columns named (in its own order): the part of a file a narrow read holds."""
    wanted = set(names)
    return SchemaVersion(version.version, tuple(c for c in version.columns if c.name in wanted))


def project(table: pa.Table, file_version: SchemaVersion, target: SchemaVersion) -> pa.Table:
    """``table`` (a file's rows, written at ``file_version``) as rows of ``target``: the target's columns in
    its order, by field id, then the internal columns the table has. SegrepError for a type change that is
    not a widening (the catalog accepts none) or a file column the table lacks."""
    if same_columns(file_version, target):
        return table
    n = table.num_rows
    have = file_version.by_id()
    arrays: list[pa.ChunkedArray | pa.Array] = []
    fields: list[pa.Field] = []
    for col in target.columns:
        wanted = col.arrow_type
        source = have.get(col.field_id)
        if source is None:
            arrays.append(_default(col, n))
        else:
            if source.name not in table.column_names:
                raise SegrepError(f"segment rows lack column {source.name} (field id {source.field_id})")
            arrays.append(_widened(table.column(source.name), source, col))
        fields.append(pa.field(col.name, wanted))
    for name in INTERNAL_COLUMNS:
        if name in table.column_names:
            arrays.append(table.column(name))
            fields.append(table.schema.field(name))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def stamp(rows: pa.Table, version: SchemaVersion) -> pa.Table:
    """Rows at ``version`` (its columns and the internal ones) as a file of that version holds them: its
    segment layout, with the field ids and the version in the metadata (``SchemaVersion.segment_arrow``)."""
    layout = version.segment_arrow()
    table = rows.select(layout.names)
    columns = [col if col.type == f.type else col.cast(f.type) for col, f in zip(table.columns, layout, strict=True)]
    return pa.Table.from_arrays(columns, schema=layout)


def source_columns(file_version: SchemaVersion, target: SchemaVersion, names: Sequence[str]) -> list[str]:
    """The file's columns a read of the target's ``names`` needs (internal names as they are; a target
    column the file lacks needs none)."""
    by_name = {c.name: c for c in target.columns}
    have = file_version.by_id()
    out = []
    for name in names:
        col = by_name.get(name)
        if col is None:
            out.append(name)
        elif col.field_id in have:
            out.append(have[col.field_id].name)
    return out


def read_projected(
    schema: pa.Schema,
    versions: ReadVersions,
    columns: Sequence[str] | None,
    read: Callable[[list[str] | None], pa.Table],
) -> pa.Table:
    """A file's rows at ``versions.target`` (only ``columns``, target names, in that order, if given):
    ``schema`` is the file's, ``read`` reads the named file columns (all for None). Only the columns needed
    are read; a file at the target version is read as it is."""
    file_version = versions.file_version(schema)
    target = versions.target
    if same_columns(file_version, target):
        return read(None if columns is None else list(columns))
    names = list(columns) if columns is not None else [*(c.name for c in target.columns), *INTERNAL_COLUMNS]
    unknown = [n for n in names if n not in INTERNAL_COLUMNS and n not in {c.name for c in target.columns}]
    if unknown:
        raise SegrepError(f"schema version {target.version} has no column(s) {', '.join(unknown)}")
    sources = source_columns(file_version, target, names)
    rows = read(sources)
    out = project(rows, narrowed(file_version, sources), narrowed(target, names))
    return out.select(names)


def _widened(col: pa.ChunkedArray, source: Column, target: Column) -> pa.ChunkedArray:
    """A file column as the target column's type: as it is, or widened. Anything else cannot have been
    accepted by the catalog: SegrepError naming the column and both types."""
    wanted = target.arrow_type
    if source.type == target.type or source.arrow_type == wanted:
        return col if col.type == wanted else col.cast(wanted)
    if not is_widening(source.arrow_type, wanted):
        raise SegrepError(
            f"column {target.name} (field id {target.field_id}): a file's {source.type} cannot be read as "
            f"{target.type} (only widenings are: int8 to int16 to int32 to int64, float32 to float64, a "
            "decimal's precision up at the same scale)"
        )
    return col.cast(wanted)


def is_widening(given: pa.DataType, wanted: pa.DataType) -> bool:
    """True if every value of ``given`` is exactly a value of ``wanted`` (the type changes a schema accepts)."""
    if pa.types.is_integer(given) and pa.types.is_integer(wanted):
        signed = pa.types.is_signed_integer(given) and pa.types.is_signed_integer(wanted)
        return bool(signed and given.bit_width < wanted.bit_width)
    if pa.types.is_floating(given) and pa.types.is_floating(wanted):
        return bool(given == pa.float32() and wanted == pa.float64())
    if pa.types.is_decimal(given) and pa.types.is_decimal(wanted):
        return bool(given.scale == wanted.scale and given.precision < wanted.precision)
    return False


def _default(col: Column, n: int) -> pa.Array:
    """``n`` values of a column added after the file was written: its default, or nulls. The default is kept in
    its JSON form (``keys.encode``, as the definitions give it): decoded by its inverse, ``keys.decode``."""
    dtype = col.arrow_type
    if col.default is None:
        return pa.nulls(n, dtype)
    try:
        value = pa.scalar(keys.decode(col.default, dtype), dtype)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as exc:
        raise SegrepError(f"column {col.name}: default {col.default!r} is not a {col.type}: {exc}") from None
    return pa.repeat(value, n)
