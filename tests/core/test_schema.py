"""Tests of segrep.core.schema: the type vocabulary, conforming input batches, last-row-wins dedupe, fingerprints.

conform_batch is the gate between user data and segment files (DESIGN section 10, "wrong schema"): it must
refuse anything it cannot cast without loss, naming the column, rather than write a segment that differs.
"""

from __future__ import annotations

import datetime as dt
import decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segrep.core import keys
from segrep.core import schema as sch
from segrep.core.errors import SchemaMismatchError, SegrepError

SIMPLE = ["bool", "int8", "int16", "int32", "int64", "float32", "float64", "string", "binary", "date", "timestamp"]
DECIMALS = ["decimal(1,0)", "decimal(15,2)", "decimal(38,0)", "decimal(38,38)", "decimal(10,10)"]

TABLE = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("amount", pa.decimal128(15, 2)),
        ("day", pa.date32()),
    ]
)
PK = ("id",)


# --------------------------------------------------------------------------------------------------------------
# Type vocabulary
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SIMPLE + DECIMALS)
def test_parse_type_and_type_name_round_trip(name: str) -> None:
    dtype = sch.parse_type(name)
    assert sch.type_name(dtype) == name
    assert sch.parse_type(sch.type_name(dtype)) == dtype


def test_parse_type_values() -> None:
    assert sch.parse_type("date") == pa.date32()
    assert sch.parse_type("timestamp") == pa.timestamp("us", tz="UTC")
    assert sch.parse_type("decimal(15,2)") == pa.decimal128(15, 2)


@pytest.mark.parametrize(
    ("text", "expected"),
    [(" INT64 ", pa.int64()), ("String", pa.string()), ("Decimal(15, 2)", pa.decimal128(15, 2))],
)
def test_parse_type_is_lenient_on_case_and_spaces(text: str, expected: pa.DataType) -> None:
    assert sch.parse_type(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "decimal(0,0)",
        "decimal(39,2)",
        "decimal(5,6)",
        "decimal(100,2)",
        "decimal(-1,2)",
        "decimal(5)",
        "decimal(,)",
        "decimal(5,2,1)",
        "decimal",
        "decimal(a,b)",
    ],
)
def test_bad_decimals(text: str) -> None:
    with pytest.raises(SegrepError, match="decimal") as info:
        sch.parse_type(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize("text", ["int65", "", "varchar", "uint64", "list<int64>", "timestamp[ns]"])
def test_unknown_types(text: str) -> None:
    with pytest.raises(SegrepError) as info:
        sch.parse_type(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize("value", [None, 5, pa.int64()])
def test_parse_type_needs_a_string(value: object) -> None:
    with pytest.raises(SegrepError, match="must be a string"):
        sch.parse_type(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("dtype", "name"),
    [
        (pa.string_view(), "string"),
        (pa.large_string(), "string"),
        (pa.large_binary(), "binary"),
        (pa.binary_view(), "binary"),
        (pa.date64(), "date"),
        (pa.timestamp("ns"), "timestamp"),
        (pa.timestamp("ms", tz="Europe/Paris"), "timestamp"),
        (pa.decimal256(20, 4), "decimal(20,4)"),
    ],
)
def test_type_name_normalizes_physical_variants(dtype: pa.DataType, name: str) -> None:
    assert sch.type_name(dtype) == name


@pytest.mark.parametrize(
    "dtype",
    [
        pa.uint64(),
        pa.float16(),
        pa.list_(pa.int64()),
        pa.struct([("a", pa.int64())]),
        pa.null(),
        pa.decimal256(40, 2),
    ],
    ids=str,
)
def test_type_name_refuses_types_outside_the_vocabulary(dtype: pa.DataType) -> None:
    """Refusal must be a SegrepError (a clear one-line error), not a ValueError from pyarrow."""
    with pytest.raises(SegrepError, match="unsupported column type"):
        sch.type_name(dtype)


def test_schema_from_arrow_drops_metadata_and_not_null() -> None:
    src = pa.schema(
        [pa.field("id", pa.int64(), nullable=False), pa.field("s", pa.string_view(), metadata={b"k": b"v"})],
        metadata={b"x": b"y"},
    )
    out = sch.schema_from_arrow(src)
    assert out == pa.schema([("id", pa.int64()), ("s", pa.string())])
    assert out.metadata is None
    assert all(f.nullable and f.metadata is None for f in out)


def test_schema_columns_round_trip() -> None:
    columns = {"id": "int64", "name": "string", "amount": "decimal(15,2)", "day": "date"}
    assert sch.schema_from_columns(columns) == TABLE
    assert sch.schema_to_columns(TABLE) == columns


def test_segment_schema_appends_internal_columns() -> None:
    seg = sch.segment_schema(TABLE)
    assert seg.names == [*TABLE.names, *sch.INTERNAL_COLUMNS]
    assert all(seg.field(n).nullable for n in TABLE.names)


# --------------------------------------------------------------------------------------------------------------
# conform_batch
# --------------------------------------------------------------------------------------------------------------


def good_columns() -> dict[str, pa.Array]:
    return {
        "id": pa.array([1, 2], pa.int64()),
        "name": pa.array(["a", None], pa.string()),
        "amount": pa.array([decimal.Decimal("1.50"), None], pa.decimal128(15, 2)),
        "day": pa.array([dt.date(2026, 1, 1), dt.date(2026, 1, 2)], pa.date32()),
    }


def batch(**overrides: pa.Array | None) -> pa.Table:
    """The good batch with some columns replaced (or dropped when None)."""
    cols = {**good_columns(), **overrides}
    return pa.table({k: v for k, v in cols.items() if v is not None})


def mismatch(b: pa.Table, *fragments: str, keys_only: bool = False, pk: tuple[str, ...] = PK) -> str:
    with pytest.raises(SchemaMismatchError) as info:
        sch.conform_batch(b, TABLE, pk, keys_only=keys_only)
    msg = str(info.value)
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"
    return msg


def test_schema_mismatch_is_a_segrep_error() -> None:
    assert issubclass(SchemaMismatchError, SegrepError)


def test_conform_identity() -> None:
    b = batch()
    out = sch.conform_batch(b, TABLE, PK, keys_only=False)
    assert out.schema == TABLE
    assert out.equals(b)


def test_conform_reorders_columns() -> None:
    b = batch()
    shuffled = b.select(["day", "name", "id", "amount"])
    out = sch.conform_batch(shuffled, TABLE, PK, keys_only=False)
    assert out.schema == TABLE
    assert out.to_pylist() == b.to_pylist()


@pytest.mark.parametrize(
    ("column", "array"),
    [
        ("id", pa.array([1, 2], pa.int32())),
        ("id", pa.array([1, 2], pa.int8())),
        ("name", pa.array(["a", None], pa.string_view())),
        ("name", pa.array(["a", None], pa.large_string())),
        ("amount", pa.array([decimal.Decimal("1.5"), None], pa.decimal128(10, 1))),
        ("day", pa.array([dt.datetime(2026, 1, 1), dt.datetime(2026, 1, 2)], pa.date64())),
    ],
    ids=lambda v: v if isinstance(v, str) else str(v.type),
)
def test_conform_casts_safely(column: str, array: pa.Array) -> None:
    out = sch.conform_batch(batch(**{column: array}), TABLE, PK, keys_only=False)
    assert out.schema == TABLE
    assert out.to_pylist() == batch().to_pylist()


def test_conform_accepts_chunked_input() -> None:
    """A batch assembled from several writes arrives as chunked columns; casting must handle every chunk."""
    part = batch(id=pa.array([1, 2], pa.int32()))
    out = sch.conform_batch(pa.concat_tables([part, part]), TABLE, PK, keys_only=False)
    assert out.schema == TABLE
    assert out.to_pylist() == batch().to_pylist() * 2


def test_missing_columns_are_all_named() -> None:
    mismatch(batch(name=None, day=None), "lacks", "name", "day")


def test_extra_columns_are_named() -> None:
    mismatch(batch(comment=pa.array(["x", "y"])), "comment")


def test_missing_takes_precedence_but_nothing_is_silently_dropped() -> None:
    """A renamed column (typo) is both missing and extra: refused either way."""
    with pytest.raises(SchemaMismatchError):
        sch.conform_batch(batch(day=None, dya=good_columns()["day"]), TABLE, PK, keys_only=False)


def test_duplicate_columns() -> None:
    cols = good_columns()
    b = pa.Table.from_arrays([*cols.values(), cols["name"]], names=[*cols, "name"])
    mismatch(b, "duplicate", "name")


@pytest.mark.parametrize(
    ("column", "array"),
    [
        ("id", pa.array(["abc", "1"])),
        ("id", pa.array([1.5, 2.0])),
        ("id", pa.array([2**64 - 1, 2], pa.uint64())),
        ("id", pa.array([[1], [2]])),
        ("amount", pa.array([decimal.Decimal("1.505"), None], pa.decimal128(15, 3))),
        ("amount", pa.array([decimal.Decimal("1" * 20), None], pa.decimal128(30, 0))),
        ("day", pa.array(["2026-01-01", "not a date"])),
        ("day", pa.array([1, 2], pa.int64())),
    ],
    ids=lambda v: v if isinstance(v, str) else str(v.type),
)
def test_unsafe_casts_are_refused_naming_the_column(column: str, array: pa.Array) -> None:
    mismatch(batch(**{column: array}), f"column {column}", sch.type_name(TABLE.field(column).type))


def test_null_key_is_refused() -> None:
    mismatch(batch(id=pa.array([1, None], pa.int64())), "key column id", "1 null")


def test_null_key_after_cast_is_refused() -> None:
    mismatch(batch(id=pa.array([None, None], pa.int32())), "key column id", "2 null")


def test_null_in_composite_key_is_refused() -> None:
    mismatch(batch(), "key column name", pk=("id", "name"))


def test_nulls_allowed_outside_the_key() -> None:
    out = sch.conform_batch(batch(), TABLE, PK, keys_only=False)
    assert out.column("name").null_count == 1


def test_keys_only_for_deletes() -> None:
    pk = ("day", "id")
    keys = pa.table({"id": pa.array([1, 2], pa.int32()), "day": good_columns()["day"]})
    out = sch.conform_batch(keys, TABLE, pk, keys_only=True)
    # table column order (id before day), not key order
    assert out.schema == pa.schema([("id", pa.int64()), ("day", pa.date32())])
    assert out.column("id").to_pylist() == [1, 2]


def test_keys_only_refuses_non_key_columns() -> None:
    mismatch(batch(), "name", keys_only=True)


def test_keys_only_refuses_missing_key_columns() -> None:
    mismatch(pa.table({"id": [1]}), "key columns for a delete", "day", keys_only=True, pk=("id", "day"))


def test_keys_only_refuses_null_keys() -> None:
    mismatch(pa.table({"id": pa.array([None], pa.int64())}), "key column id", keys_only=True)


# --------------------------------------------------------------------------------------------------------------
# dedupe_last
# --------------------------------------------------------------------------------------------------------------


def test_dedupe_last_keeps_the_last_row_per_composite_key_in_order() -> None:
    t = pa.table(
        {
            "a": [1, 1, 2, 1, 2, 3],
            "b": ["x", "y", "x", "x", "x", "x"],
            "v": [10, 11, 12, 13, 14, 15],
        }
    )
    out = sch.dedupe_last(t, ["a", "b"])
    assert out.to_pylist() == [
        {"a": 1, "b": "y", "v": 11},
        {"a": 1, "b": "x", "v": 13},
        {"a": 2, "b": "x", "v": 14},
        {"a": 3, "b": "x", "v": 15},
    ]
    assert out.schema == t.schema


@pytest.mark.parametrize("n", [0, 1])
def test_dedupe_last_small_batches(n: int) -> None:
    t = pa.table({"a": pa.array(list(range(n)), pa.int64())})
    assert sch.dedupe_last(t, ["a"]).equals(t)


def test_dedupe_last_without_duplicates_is_identity() -> None:
    t = pa.table({"a": [3, 1, 2], "v": ["c", "a", "b"]})
    assert sch.dedupe_last(t, ["a"]).equals(t)


ROWS = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from(["", "a", "b", "é"]), st.integers(-(2**63), 2**63 - 1)),
    max_size=40,
)


@given(rows=ROWS, cut=st.integers(0, 40), single_key=st.booleans())
def test_dedupe_last_matches_a_dict_reference(rows: list[tuple[int, str, int]], cut: int, single_key: bool) -> None:
    """Against a plain dict: the last index per key wins, survivors keep their relative order; the input
    may arrive in several chunks (a concatenation of writes)."""
    key = ["k1"] if single_key else ["k1", "k2"]
    cols = {
        "k1": [r[0] for r in rows],
        "k2": [r[1] for r in rows],
        "v": [r[2] for r in rows],
        "i": list(range(len(rows))),
    }
    schema = pa.schema([("k1", pa.int64()), ("k2", pa.string()), ("v", pa.int64()), ("i", pa.int64())])
    whole = pa.table(cols, schema=schema)
    cut = min(cut, len(rows))
    t = pa.concat_tables([whole.slice(0, cut), whole.slice(cut)])
    last: dict[tuple[object, ...], int] = {}
    for i, row in enumerate(rows):
        last[tuple(row[: len(key)])] = i
    expected = [whole.slice(i, 1).to_pylist()[0] for i in sorted(last.values())]
    out = sch.dedupe_last(t, key)
    assert out.schema == schema
    assert out.to_pylist() == expected


# --------------------------------------------------------------------------------------------------------------
# fingerprint
# --------------------------------------------------------------------------------------------------------------


def test_fingerprint_is_stable_when_nothing_changes() -> None:
    again = sch.schema_from_columns({"id": "int64", "name": "string", "amount": "decimal(15,2)", "day": "date"})
    fp = sch.fingerprint(TABLE, PK)
    assert len(fp) == 16 and int(fp, 16) >= 0
    assert sch.fingerprint(again, ["id"]) == fp
    assert sch.fingerprint(TABLE, PK) == fp


def test_fingerprint_ignores_physical_variants() -> None:
    """A schema read from a file (string_view, ns timestamps) is the same table as the declared one."""
    variant = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            ("name", pa.string_view()),
            ("amount", pa.decimal256(15, 2)),
            ("day", pa.date64()),
        ],
        metadata={b"k": b"v"},
    )
    assert sch.fingerprint(variant, PK) == sch.fingerprint(TABLE, PK)


@pytest.mark.parametrize(
    "changed",
    [
        TABLE.set(0, pa.field("id", pa.int32())),
        TABLE.set(2, pa.field("amount", pa.decimal128(15, 3))),
        TABLE.set(2, pa.field("amount", pa.decimal128(16, 2))),
        TABLE.set(1, pa.field("name", pa.binary())),
        TABLE.set(1, pa.field("label", pa.string())),
        TABLE.append(pa.field("extra", pa.string())),
        TABLE.remove(3),
    ],
    ids=["int32", "scale", "precision", "binary", "rename", "added", "removed"],
)
def test_fingerprint_changes_with_the_schema(changed: pa.Schema) -> None:
    assert sch.fingerprint(changed, PK) != sch.fingerprint(TABLE, PK)


@pytest.mark.parametrize("key", [("name",), ("id", "name"), ("name", "id")])
def test_fingerprint_changes_with_the_key(key: tuple[str, ...]) -> None:
    assert sch.fingerprint(TABLE, key) != sch.fingerprint(TABLE, PK)


# --------------------------------------------------------------------------------------------------------------
# keys.from_user: one key value a user gives (CLI string, YAML/JSON value), converted strictly
# --------------------------------------------------------------------------------------------------------------

UTC_TS = pa.timestamp("us", tz="UTC")


@pytest.mark.parametrize(
    ("value", "dtype", "expected"),
    [
        ("150000", pa.int64(), 150000),
        (" -7 ", pa.int32(), -7),
        (5.0, pa.int64(), 5),
        (decimal.Decimal("5.00"), pa.int16(), 5),
        (2**63 - 1, pa.int64(), 2**63 - 1),
        ("2.5", pa.float64(), 2.5),
        (3, pa.float32(), 3.0),
        ("m", pa.string(), "m"),
        ("m", pa.large_string(), "m"),
        (np.int16(-3), pa.int8(), -3),
        (7, pa.uint16(), 7),
        ("true", pa.bool_(), True),
        (False, pa.bool_(), False),
        ("ff00", pa.binary(), b"\xff\x00"),
        ("2026-01-01", pa.date32(), dt.date(2026, 1, 1)),
        ("2026-01-01T10:00", UTC_TS, dt.datetime(2026, 1, 1, 10, tzinfo=dt.UTC)),
        ("2026-01-01T10:00+02:00", UTC_TS, dt.datetime(2026, 1, 1, 8, tzinfo=dt.UTC)),
        (dt.date(2026, 1, 2), UTC_TS, dt.datetime(2026, 1, 2, tzinfo=dt.UTC)),
        ("12.34", pa.decimal128(15, 2), decimal.Decimal("12.34")),
        (12.5, pa.decimal128(15, 2), decimal.Decimal("12.50")),
        (0.1, pa.decimal128(15, 2), decimal.Decimal("0.10")),
    ],
)
def test_from_user_converts_without_loss(value: object, dtype: pa.DataType, expected: object) -> None:
    got = keys.from_user(value, dtype, "--at")
    assert got == expected and type(got) is type(expected)
    assert pa.array([got], dtype).to_pylist() == [got]


@pytest.mark.parametrize(
    ("value", "dtype", "reason"),
    [
        (2**70, pa.int64(), "out of range"),
        (2**31, pa.int32(), "out of range"),
        (True, pa.int64(), "true/false"),
        (2.5, pa.int64(), "fractional part"),
        (float("nan"), pa.int64(), "not a finite number"),
        ("1_000", pa.int64(), "not an integer"),
        ("5.0", pa.int64(), "not an integer"),
        ("9" * 5000, pa.int64(), "not an integer"),
        (None, pa.int64(), "cannot be null"),
        ([1], pa.int64(), "expected an integer"),
        (float("nan"), pa.float64(), "NaN and infinity"),
        ("-inf", pa.float64(), "NaN and infinity"),
        ("nan", pa.float32(), "NaN and infinity"),
        (1e39, pa.float32(), "out of range"),
        (2**53 + 1, pa.float64(), "not exactly representable"),
        (True, pa.float64(), "true/false"),
        (5, pa.string(), "expected a string"),
        ("a\udcff", pa.string(), "surrogates not allowed"),
        (-1, pa.uint16(), "out of range"),
        (1, pa.bool_(), "expected true or false"),
        ("zz", pa.binary(), "hex digits"),
        ("2026-02-30", pa.date32(), "expected a date"),
        (dt.datetime(2026, 1, 1), pa.date32(), "a date-time is not a date"),
        ("yesterday", UTC_TS, "ISO-8601"),
        ("12.345", pa.decimal128(15, 2), "more than 2 digit(s) after the point"),
        ("1e20", pa.decimal128(15, 2), "more than 13 digit(s) before the point"),
        ("1e999999", pa.decimal128(15, 2), "before the point"),
        ("NaN", pa.decimal128(15, 2), "not a finite number"),
    ],
)
def test_from_user_refuses_naming_what_value_and_type(value: object, dtype: pa.DataType, reason: str) -> None:
    with pytest.raises(SegrepError) as info:
        keys.from_user(value, dtype, "split key --at")
    message = str(info.value)
    assert message.startswith("split key --at ")
    assert reason in message
    assert f"valid {keys._type_name(dtype)} key" in message
    assert "\n" not in message


@settings(max_examples=60)
@given(st.integers(min_value=-(2**80), max_value=2**80), st.sampled_from([pa.int8(), pa.int32(), pa.int64()]))
def test_from_user_integers_in_range_exactly(value: int, dtype: pa.DataType) -> None:
    bits = dtype.bit_width - 1
    for given_as in (value, str(value)):
        if -(2**bits) <= value < 2**bits:
            assert keys.from_user(given_as, dtype, "key") == value
        else:
            with pytest.raises(SegrepError, match="out of range"):
                keys.from_user(given_as, dtype, "key")


@settings(max_examples=60)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_from_user_floats_never_let_nan_or_infinity_through(value: float) -> None:
    if value != value or value in (float("inf"), float("-inf")):
        with pytest.raises(SegrepError, match="NaN and infinity"):
            keys.from_user(value, pa.float64(), "key")
    else:
        assert keys.from_user(value, pa.float64(), "key") == value
        assert keys.from_user(repr(value), pa.float64(), "key") == value


# --------------------------------------------------------------------------------------------------------------
# conform_batch: kinds of value (issue 11 item 4)
# --------------------------------------------------------------------------------------------------------------

KIND_SAMPLES: dict[str, list[pa.Array]] = {
    "bool": [pa.array([True, False])],
    "integer": [pa.array([1, 0], t) for t in (pa.int8(), pa.int32(), pa.int64(), pa.uint8(), pa.uint64())],
    "float": [pa.array([1.0, 0.0], t) for t in (pa.float32(), pa.float64())],
    "decimal": [pa.array([decimal.Decimal("1.00"), decimal.Decimal("0.00")], pa.decimal128(15, 2))],
    "string": [pa.array(["1", "0"], t) for t in (pa.string(), pa.large_string(), pa.string_view())],
    "binary": [pa.array([b"1", b"0"], pa.binary())],
    "date": [pa.array([dt.date(2026, 1, 1), dt.date(2026, 1, 2)], t) for t in (pa.date32(), pa.date64())],
    "timestamp": [
        pa.array([1, 0], t)
        for t in (pa.timestamp("us", tz="UTC"), pa.timestamp("s"), pa.timestamp("ms", tz="Asia/Tokyo"))
    ],
}
TABLE_TYPES = [sch.parse_type(name) for name in [*SIMPLE, "decimal(15,2)"]]


@settings(max_examples=120)
@given(
    kind=st.sampled_from(sorted(KIND_SAMPLES)),
    index=st.integers(min_value=0, max_value=4),
    wanted=st.sampled_from(TABLE_TYPES),
    as_key=st.booleans(),
)
def test_columns_never_change_kind(kind: str, index: int, wanted: pa.DataType, as_key: bool) -> None:
    """A column converts only to a type of its own kind; across kinds it is refused naming the column and both
    types, key or not (True is not 1, a timestamp is not its microseconds)."""
    samples = KIND_SAMPLES[kind]
    given_array = samples[index % len(samples)]
    table = pa.schema([("c", wanted)])
    batch_ = pa.table({"c": given_array})
    pk = ("c",) if as_key else ()
    if sch.kind_of(wanted) == kind:
        out = sch.conform_batch(batch_, table, pk, keys_only=False)
        assert out.schema == table
        assert out.column("c").cast(given_array.type).to_pylist() == given_array.to_pylist()
    else:
        with pytest.raises(SchemaMismatchError) as info:
            sch.conform_batch(batch_, table, pk, keys_only=False)
        msg = str(info.value)
        assert f"column c has type {given_array.type}, table wants {sch.type_name(wanted)}" in msg
        assert "never converted" in msg


@pytest.mark.parametrize(
    ("column", "array"),
    [
        ("id", pa.array([True, False])),
        ("id", pa.array([dt.datetime(2026, 1, 1), dt.datetime(2026, 1, 2)], pa.timestamp("us"))),
        ("name", pa.array([1, 2])),
        ("amount", pa.array([1.5, None])),
        ("amount", pa.array([1, None])),
    ],
    ids=lambda v: v if isinstance(v, str) else str(v.type),
)
def test_cross_kind_casts_are_refused_even_when_arrow_would_cast(column: str, array: pa.Array) -> None:
    mismatch(batch(**{column: array}), f"column {column}", str(array.type), "never converted")


def test_float_narrowing_only_when_every_value_is_kept() -> None:
    table = pa.schema([("k", pa.int64()), ("x", pa.float32())])
    exact = pa.table({"k": [1, 2, 3], "x": pa.array([0.5, None, float("nan")], pa.float64())})
    out = sch.conform_batch(exact, table, ("k",), keys_only=False)
    assert out.column("x").type == pa.float32()
    assert out.column("x").to_pylist()[:2] == [0.5, None]
    rounded = pa.table({"k": [1], "x": pa.array([0.1], pa.float64())})
    with pytest.raises(SchemaMismatchError, match="column x has type double, table wants float32: some values"):
        sch.conform_batch(rounded, table, ("k",), keys_only=False)


@pytest.mark.parametrize("keys_only", [False, True])
def test_nan_keys_are_refused(keys_only: bool) -> None:
    table = pa.schema([("k", pa.float64()), ("v", pa.string())])
    rows = {"k": [1.0, float("nan"), float("nan")]} | ({} if keys_only else {"v": ["a", "b", "c"]})
    with pytest.raises(SchemaMismatchError, match="key column k has 2 NaN value"):
        sch.conform_batch(pa.table(rows), table, ("k",), keys_only=keys_only)


def test_nan_outside_the_key_is_a_value() -> None:
    table = pa.schema([("k", pa.int64()), ("x", pa.float64())])
    out = sch.conform_batch(pa.table({"k": [1], "x": [float("nan")]}), table, ("k",), keys_only=False)
    assert out.column("x").to_pylist()[0] != out.column("x").to_pylist()[0]


def test_negative_zero_key_becomes_zero() -> None:
    table = pa.schema([("k", pa.float64())])
    out = sch.conform_batch(pa.table({"k": [-0.0, 1.0]}), table, ("k",), keys_only=True)
    assert [str(v) for v in out.column("k").to_pylist()] == ["0.0", "1.0"]


def test_all_null_column_takes_any_type_outside_the_key() -> None:
    out = sch.conform_batch(batch(name=pa.array([None, None])), TABLE, PK, keys_only=False)
    assert out.column("name").type == pa.string() and out.column("name").null_count == 2


def test_one_line_decimal_in_a_flow_mapping_gets_a_hint() -> None:
    """`{amount: decimal(15,2)}` on one line reaches parse_type as 'decimal(15' (YAML splits at the comma)."""
    with pytest.raises(SegrepError, match="quote it"):
        sch.parse_type("decimal(15")
