"""segrep schema versions as an Iceberg schema and name mapping.

Field ids are segrep's own (``core.schema_versions``): every segment file written since field ids exist
carries them (``PARQUET:field_id``), so a file written before a rename or a widening still reads under the
current schema. Files from before that carry none; for them the table's name mapping lists, per field id,
every name the column ever had. The internal columns (``_version``, ``_deleted``, ``_origin``) have no field
id and are not in the schema: readers never see them.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.table.name_mapping import MappedField, NameMapping
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

from segrep.core.errors import SegrepError
from segrep.core.schema import INTERNAL_COLUMNS
from segrep.core.schema_versions import Column, SchemaVersion

# A segment file's internal columns carry no field id, so a reader matches the file's columns by the name
# mapping: it lists them under ids no table column ever has (segrep's ids count up from 1), outside the schema,
# so they are read by no query.
INTERNAL_ID_BASE = 2_000_000_000


def iceberg_type(column: Column) -> IcebergType:
    """The Iceberg type a column is published as (int8 and int16 widen to Iceberg's int, as its spec says)."""
    dtype = column.arrow_type
    if pa.types.is_boolean(dtype):
        return BooleanType()
    if pa.types.is_int8(dtype) or pa.types.is_int16(dtype) or pa.types.is_int32(dtype):
        return IntegerType()
    if pa.types.is_int64(dtype):
        return LongType()
    if pa.types.is_float32(dtype):
        return FloatType()
    if pa.types.is_float64(dtype):
        return DoubleType()
    if pa.types.is_string(dtype):
        return StringType()
    if pa.types.is_binary(dtype):
        return BinaryType()
    if pa.types.is_date32(dtype):
        return DateType()
    if pa.types.is_timestamp(dtype):
        return TimestamptzType()
    if pa.types.is_decimal(dtype):
        return DecimalType(dtype.precision, dtype.scale)
    raise SegrepError(f"column {column.name}: type {column.type} has no Iceberg equivalent")


def iceberg_schema(version: SchemaVersion, schema_id: int) -> Schema:
    """The current version's visible columns, optional (a tombstone row holds nulls in every column), with
    their defaults as ``initial-default`` (rows written before a column was added read as its default)."""
    fields = [
        NestedField(
            field_id=c.field_id,
            name=c.name,
            field_type=iceberg_type(c),
            required=False,
            initial_default=c.default,
            write_default=c.default,
        )
        for c in version.columns
    ]
    return Schema(*fields, schema_id=schema_id)


def name_mapping(versions: Iterable[SchemaVersion], current: SchemaVersion) -> NameMapping:
    """Per field id of the current version, every name it had in any version (a file without field ids is
    read by names). A name two field ids had is left out of both: a file found with it could not say which
    column it is, and an unmapped column reads as null rather than as the wrong column's values."""
    names: dict[int, list[str]] = {c.field_id: [] for c in current.columns}
    owners: dict[str, set[int]] = {}
    for v in versions:
        for c in v.columns:
            owners.setdefault(c.name, set()).add(c.field_id)
            if c.field_id in names and c.name not in names[c.field_id]:
                names[c.field_id].append(c.name)
    fields = [
        MappedField(field_id=fid, names=[n for n in ns if len(owners[n]) == 1])
        for fid, ns in names.items()
        if any(len(owners[n]) == 1 for n in ns)
    ]
    internal = [MappedField(field_id=INTERNAL_ID_BASE + i, names=[n]) for i, n in enumerate(INTERNAL_COLUMNS)]
    return NameMapping(fields + internal)


def same_columns(a: Schema, b: Schema) -> bool:
    """True if two published schemas are the same columns (ids, names, types, order, defaults)."""
    return [(f.field_id, f.name, f.field_type, f.initial_default) for f in a.fields] == [
        (f.field_id, f.name, f.field_type, f.initial_default) for f in b.fields
    ]
