"""Table schemas: the type vocabulary of the definitions file, fingerprints, and conforming input batches.

Segment files hold the table's columns plus three internal ones: ``_version`` (row version from the hybrid
logical clock), ``_deleted`` (tombstone) and ``_origin`` (site id of the writer, the LWW tie-break).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from segrep.core.errors import SchemaMismatchError, SegrepError
from segrep.core.names import check_name

VERSION_COL = "_version"
DELETED_COL = "_deleted"
ORIGIN_COL = "_origin"
INTERNAL_FIELDS = (
    pa.field(VERSION_COL, pa.int64(), nullable=False),
    pa.field(DELETED_COL, pa.bool_(), nullable=False),
    pa.field(ORIGIN_COL, pa.int32(), nullable=False),
)
INTERNAL_COLUMNS = tuple(f.name for f in INTERNAL_FIELDS)

_SIMPLE_TYPES: dict[str, pa.DataType] = {
    "bool": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "string": pa.string(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}
_DECIMAL_RE = re.compile(r"^decimal\((\d{1,2}),\s*(\d{1,2})\)$")


def parse_type(text: str) -> pa.DataType:
    """A type name of the definitions file (``int64``, ``string``, ``decimal(15,2)``...) as an Arrow type."""
    if not isinstance(text, str):
        raise SegrepError(f"column type must be a string, got {text!r}")
    t = text.strip().lower()
    if t in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[t]
    m = _DECIMAL_RE.match(t)
    if m:
        precision, scale = int(m.group(1)), int(m.group(2))
        if not 1 <= precision <= 38 or scale > precision:
            raise SegrepError(f"invalid decimal type {text!r}: need 1 <= precision <= 38 and scale <= precision")
        return pa.decimal128(precision, scale)
    if t.startswith("decimal(") and "," not in t and not t.endswith(")"):
        # `{amount: decimal(15,2)}` on one line: YAML splits the flow mapping at the comma
        raise SegrepError(f"unknown column type {text!r}: in a one-line {{...}} mapping, quote it: 'decimal(15,2)'")
    allowed = ", ".join([*_SIMPLE_TYPES, "decimal(p,s)"])
    raise SegrepError(f"unknown column type {text!r}; allowed: {allowed}")


def type_name(dtype: pa.DataType) -> str:
    """The definitions-file name of an Arrow type (inverse of parse_type after normalize_type)."""
    dtype = normalize_type(dtype)
    for name, t in _SIMPLE_TYPES.items():
        if t == dtype:
            return name
    if pa.types.is_decimal128(dtype):
        return f"decimal({dtype.precision},{dtype.scale})"
    raise SegrepError(f"unsupported column type {dtype}")


def normalize_type(dtype: pa.DataType) -> pa.DataType:
    """Map equivalent physical types onto the vocabulary (views and large variants, timestamp units)."""
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or pa.types.is_string_view(dtype):
        return pa.string()
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype) or pa.types.is_binary_view(dtype):
        return pa.binary()
    if pa.types.is_date(dtype):
        return pa.date32()
    if pa.types.is_timestamp(dtype):
        return pa.timestamp("us", tz="UTC")
    if pa.types.is_decimal(dtype) and dtype.precision <= 38:
        return pa.decimal128(dtype.precision, dtype.scale)
    return dtype


def schema_from_columns(columns: Mapping[str, str]) -> pa.Schema:
    fields = []
    for name, text in columns.items():
        check_name("column", name)
        try:
            fields.append(pa.field(name, parse_type(text)))
        except SegrepError as exc:
            raise SegrepError(f"column {name}: {exc}") from None
    return pa.schema(fields)


def schema_from_arrow(schema: pa.Schema) -> pa.Schema:
    """A table schema taken from a file: types normalized, metadata and not-null flags dropped."""
    fields = []
    for f in schema:
        check_name("column", f.name)  # also keeps the internal _version/_deleted/_origin names out
        dtype = normalize_type(f.type)
        try:
            type_name(dtype)  # raises on types outside the vocabulary
        except SegrepError as exc:
            raise SegrepError(f"column {f.name}: {exc}") from None
        fields.append(pa.field(f.name, dtype))
    return pa.schema(fields)


def schema_to_columns(schema: pa.Schema) -> dict[str, str]:
    return {f.name: type_name(f.type) for f in schema}


def fingerprint(schema: pa.Schema, primary_key: Sequence[str]) -> str:
    """Stable short hash of column names, types and key: stamped on segments to catch schema drift."""
    doc = json.dumps({"columns": schema_to_columns(schema), "key": list(primary_key)}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def segment_schema(schema: pa.Schema) -> pa.Schema:
    """The schema of a segment file: the table's columns (nullable, for tombstones) plus internal columns."""
    return pa.schema([*(pa.field(f.name, f.type) for f in schema), *INTERNAL_FIELDS])


def conform_batch(batch: pa.Table, schema: pa.Schema, primary_key: Sequence[str], *, keys_only: bool) -> pa.Table:
    """Check an input batch against the table and cast it to the table's types and column order.

    ``keys_only`` is for deletes: the batch must hold exactly the primary key columns. Every column, key or
    not, must be of its declared type or convert to it without loss within the same kind of value (see
    :func:`conform_column`): a bool silently becoming 1 is wrong in any column. Key columns must also hold no
    null and no NaN (NaN equals nothing: two NaN rows would coexist and a delete of NaN would delete nothing);
    a float key's -0.0 becomes 0.0, the key it equals. Raises SchemaMismatchError naming every missing or extra
    column, or the column, its type and the table's type.
    """
    wanted = [f for f in schema if f.name in primary_key] if keys_only else list(schema)
    wanted_names = [f.name for f in wanted]
    have = batch.column_names
    if len(set(have)) != len(have):
        dupes = sorted({c for c in have if have.count(c) > 1})
        raise SchemaMismatchError(f"batch has duplicate columns: {', '.join(dupes)}")
    missing = [c for c in wanted_names if c not in have]
    extra = [c for c in have if c not in wanted_names]
    what = "key columns for a delete" if keys_only else "columns"
    problems = [f"lacks {what}: {', '.join(missing)}"] if missing else []
    problems += [f"has columns the table does not: {', '.join(extra)}"] if extra else []
    if problems:
        raise SchemaMismatchError(f"batch {'; and '.join(problems)}")
    arrays = []
    for f in wanted:
        col = conform_column(f.name, batch.column(f.name), f.type)
        if f.name in primary_key:
            col = _check_key(f.name, col)
        arrays.append(col)
    return pa.Table.from_arrays(arrays, schema=pa.schema(wanted))


# Kinds of value: a column converts only within its kind. Across kinds a cast changes what a value means
# (True -> 1, a timestamp -> its microseconds, 2.5 -> 2, "007" -> 7) even when Arrow calls it safe.
_KINDS: tuple[tuple[str, Callable[[pa.DataType], bool]], ...] = (
    ("bool", pa.types.is_boolean),
    ("integer", pa.types.is_integer),
    ("float", pa.types.is_floating),
    ("decimal", pa.types.is_decimal),
    ("string", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)),
    (
        "binary",
        lambda t: (
            pa.types.is_binary(t)
            or pa.types.is_large_binary(t)
            or pa.types.is_binary_view(t)
            or pa.types.is_fixed_size_binary(t)
        ),
    ),
    ("date", pa.types.is_date),
    ("timestamp", pa.types.is_timestamp),
)


def kind_of(dtype: pa.DataType) -> str | None:
    """The kind of value a type holds (``integer``, ``string``, ``timestamp``...), None outside the vocabulary."""
    return next((kind for kind, test in _KINDS if test(dtype)), None)


def conform_column(name: str, col: pa.ChunkedArray, wanted: pa.DataType) -> pa.ChunkedArray:
    """``col`` as type ``wanted``: unchanged, or converted within its kind with every value kept exactly
    (int64 -> int32 when every value fits, float32 -> float64, string views, decimal rescaling without loss,
    date64 -> date32, timestamp units and zones; dictionary-encoded columns are decoded first); a column of
    nulls only (type null) takes any type. Anything else raises SchemaMismatchError naming the column."""
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    given = col.type
    if given == wanted:
        return col
    given_kind, wanted_kind = kind_of(given), kind_of(wanted)
    problem: str | None = None
    if not pa.types.is_null(given) and given_kind != wanted_kind:
        problem = f"a {given_kind or str(given)} column is never converted to {wanted_kind} (it would change values)"
    else:
        try:
            cast = col.cast(wanted, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            problem = str(exc).splitlines()[0]
        else:
            if wanted_kind == "float" and _float_changed(col, cast):
                problem = "some values would be rounded"
    if problem is not None:
        raise SchemaMismatchError(f"column {name} has type {given}, table wants {type_name(wanted)}: {problem}")
    return cast


def _float_changed(before: pa.ChunkedArray, after: pa.ChunkedArray) -> bool:
    """True if narrowing floats changed a value (NaN stays NaN; a widening never changes one)."""
    if after.type.bit_width >= before.type.bit_width:
        return False
    back = after.cast(before.type)
    same = pc.or_kleene(pc.equal(back, before), pc.and_(pc.is_nan(back), pc.is_nan(before)))
    return not pc.all(pc.fill_null(same, True)).as_py()


def _check_key(name: str, col: pa.ChunkedArray) -> pa.ChunkedArray:
    if col.null_count:
        raise SchemaMismatchError(f"key column {name} has {col.null_count} null value(s); a key cannot be null")
    if pa.types.is_floating(col.type):
        nans = pc.sum(pc.is_nan(col)).as_py() or 0
        if nans:
            raise SchemaMismatchError(
                f"key column {name} has {nans} NaN value(s); NaN equals nothing, so it cannot be a key"
            )
        col = pc.add(col, pa.scalar(0.0, col.type))  # -0.0 + 0.0 is 0.0: keys that compare equal are one key
    return col


def strictly_increasing(batch: pa.Table, primary_key: Sequence[str]) -> bool:
    """True if the rows are in strictly increasing primary-key order (so every key is unique)."""
    n = batch.num_rows
    less = np.zeros(n - 1, dtype=bool)
    equal = np.ones(n - 1, dtype=bool)
    for name in primary_key:
        col = batch.column(name)
        prev, nxt = col.slice(0, n - 1), col.slice(1)
        less |= equal & pc.less(prev, nxt).to_numpy(zero_copy_only=False)
        equal &= pc.equal(prev, nxt).to_numpy(zero_copy_only=False)
        if less.all():
            return True
    return bool(less.all())


def dedupe_last(batch: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """Keep the last row per primary key (a batch is one write; its later rows win)."""
    if batch.num_rows < 2 or strictly_increasing(batch, primary_key):
        return batch  # bulk loads usually arrive sorted by key: unique, checked in one linear pass
    idx_col = "__segrep_idx"
    indexed = batch.select(list(primary_key)).append_column(idx_col, pa.array(range(batch.num_rows), pa.int64()))
    last = indexed.group_by(list(primary_key), use_threads=False).aggregate([(idx_col, "max")])
    if last.num_rows == batch.num_rows:
        return batch
    keep = pc.sort_indices(last.column(f"{idx_col}_max"))
    return batch.take(pc.take(last.column(f"{idx_col}_max"), keep))
