"""Tests of segrep.core.projection: a segment file's rows read at a later schema version, by field id.

The property: random sequences of schema changes (add with or without a default, drop, rename, widen,
reorder), rows written at every version, each version's rows projected to the last version equal what an
oracle gets by applying the same changes to plain Python dicts.
"""

from __future__ import annotations

import datetime as dt
import decimal
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from segrep.core import keys
from segrep.core import schema as sch
from segrep.core.errors import SegrepError
from segrep.core.projection import ReadVersions, file_version_of, project, read_projected
from segrep.core.schema_versions import Column, SchemaVersion, first_version

WIDER = {
    "int8": ["int16", "int32", "int64"],
    "int16": ["int32", "int64"],
    "int32": ["int64"],
    "int64": [],
    "float32": ["float64"],
    "float64": [],
    "decimal(5,2)": ["decimal(9,2)", "decimal(20,2)"],
    "decimal(9,2)": ["decimal(20,2)"],
    "decimal(20,2)": [],
    "string": [],
}
INTERNAL = {sch.VERSION_COL: 7, sch.DELETED_COL: False, sch.ORIGIN_COL: 1}


def values(kind: str) -> st.SearchStrategy[Any]:
    if kind.startswith("int"):
        bits = int(kind[3:])
        return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if kind == "float32":
        return st.floats(width=32, allow_nan=False)
    if kind == "float64":
        return st.floats(allow_nan=False)
    if kind.startswith("decimal"):
        return st.decimals(min_value=-999, max_value=999, places=2, allow_nan=False, allow_infinity=False)
    return st.text(max_size=5)


def nullable(kind: str) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), values(kind))


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[SchemaVersion, list[dict[str, Any]]]]:
    """Versions 1..n, each with the rows written at it (column name -> value, in the version's order)."""
    kinds = list(WIDER)
    start = draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=4))
    version = first_version([(f"c{i}", k) for i, k in enumerate(start, 1)])
    next_id = len(start) + 1
    fresh = iter(range(10_000))
    out = []
    for _ in range(draw(st.integers(0, 6))):
        rows = draw(st.lists(st.fixed_dictionaries({c.name: nullable(c.type) for c in version.columns}), max_size=3))
        out.append((version, rows))
        cols = list(version.columns)
        op = draw(st.sampled_from(["add", "add_default", "drop", "rename", "widen", "reorder"]))
        if op in {"add", "add_default"}:
            kind = draw(st.sampled_from(kinds))
            default = draw(values(kind)) if op == "add_default" else None
            if isinstance(default, decimal.Decimal):
                default = str(default)  # JSON has no decimal: the default is its text
            cols.append(Column(next_id, f"n{next(fresh)}", kind, default))
            next_id += 1
        elif op == "drop" and len(cols) > 1:
            cols.pop(draw(st.integers(0, len(cols) - 1)))
        elif op == "rename":
            i = draw(st.integers(0, len(cols) - 1))
            cols[i] = replace(cols[i], name=f"r{next(fresh)}")
        elif op == "widen":
            i = draw(st.integers(0, len(cols) - 1))
            wider = WIDER[cols[i].type]
            if wider:
                cols[i] = replace(cols[i], type=draw(st.sampled_from(wider)))
        elif op == "reorder":
            cols = draw(st.permutations(cols))
        version = SchemaVersion(version.version + 1, tuple(cols))
    rows = draw(st.lists(st.fixed_dictionaries({c.name: nullable(c.type) for c in version.columns}), max_size=3))
    out.append((version, rows))
    return out


def oracle(rows: list[dict[str, Any]], written: SchemaVersion, later: list[SchemaVersion]) -> list[dict[str, Any]]:
    """The rows after each later version's change, applied to dicts: what a reader at the last one sees."""
    out = [{c.name: r[c.name] for c in written.columns} for r in rows]  # in the version's order
    prev = written
    for nxt in later:
        old = prev.by_id()
        for r in out:
            moved = {}
            for col in nxt.columns:
                if col.field_id in old:
                    moved[col.name] = r[old[col.field_id].name]  # renamed, widened: the same value
                else:
                    default = col.default
                    moved[col.name] = (
                        decimal.Decimal(default) if col.type.startswith("decimal") and default else default
                    )
            r.clear()
            r.update(moved)
        prev = nxt
    return [{**r, **INTERNAL} for r in out]


def segment(version: SchemaVersion, rows: list[dict[str, Any]]) -> pa.Table:
    layout = version.segment_arrow()
    return pa.Table.from_pylist([{**r, **INTERNAL} for r in rows], schema=layout)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_rows_of_every_version_read_at_the_last_as_the_oracle_says(history: list[tuple[SchemaVersion, Any]]) -> None:
    versions = [v for v, _ in history]
    last = versions[-1]
    for i, (version, rows) in enumerate(history):
        got = project(segment(version, rows), version, last)
        assert got.column_names == [*(c.name for c in last.columns), *sch.INTERNAL_COLUMNS]
        assert [f.type for f in got.schema][: len(last.columns)] == [c.arrow_type for c in last.columns]
        want = oracle(rows, version, versions[i + 1 :])
        assert [list(r.items()) for r in got.to_pylist()] == [list(r.items()) for r in want]


def test_a_file_at_the_target_version_is_returned_as_it_is() -> None:
    v = first_version([("id", "int64"), ("name", "string")])
    table = segment(v, [{"id": 1, "name": "a"}])
    assert project(table, v, v) is table


def test_a_narrowing_type_change_is_refused_naming_the_column_and_both_types() -> None:
    v1 = first_version([("id", "int64"), ("n", "int32")])
    v2 = SchemaVersion(2, (v1.columns[0], Column(2, "count", "int16")))
    with pytest.raises(SegrepError, match=r"column count \(field id 2\).*int32.*int16"):
        project(segment(v1, [{"id": 1, "n": 5}]), v1, v2)
    v3 = SchemaVersion(3, (v1.columns[0], Column(2, "n", "string")))
    with pytest.raises(SegrepError, match="int32 cannot be read as string"):
        project(segment(v1, [{"id": 1, "n": 5}]), v1, v3)


def test_an_added_columns_default_reads_as_the_definitions_gave_it_in_every_type() -> None:
    """Defaults are kept in their JSON form (``keys.encode``, as the definitions store them): a binary one
    is its hex text and reads as those bytes, a decimal, date or timestamp one as its value."""
    given = {
        "binary": b"\x00\xff",
        "decimal(10,2)": decimal.Decimal("1.50"),
        "date": dt.date(2026, 11, 28),
        "int32": 7,
        "string": "web",
    }
    v1 = first_version([("id", "int64")])
    added = tuple(
        Column(i, f"c{i}", kind, keys.encode(value)) for i, (kind, value) in enumerate(given.items(), start=2)
    )
    v2 = SchemaVersion(2, (v1.columns[0], *added))
    got = project(segment(v1, [{"id": 1}]), v1, v2).to_pylist()[0]
    assert [got[c.name] for c in added] == list(given.values())


def test_a_file_without_metadata_is_version_one_and_a_file_with_it_says_its_version(tmp_path: Any) -> None:
    """Through Parquet: the field ids and the version survive the write; a legacy file is read as version 1."""
    v1 = first_version([("id", "int64"), ("qty", "int16"), ("gone", "string")])
    v2 = SchemaVersion(2, (Column(2, "quantity", "int64"), v1.columns[0], Column(4, "note", "string", "n/a")))
    legacy = pa.Table.from_pylist(
        [{"id": 1, "qty": 3, "gone": "x", **INTERNAL}], schema=sch.segment_schema(v1.arrow().remove_metadata())
    )
    pq.write_table(legacy, tmp_path / "old.parquet")
    pq.write_table(segment(v2, [{"quantity": 9, "id": 2, "note": "hi"}]), tmp_path / "new.parquet")
    versions = ReadVersions(v1, v2)
    old_schema = pq.read_schema(tmp_path / "old.parquet")
    new_schema = pq.read_schema(tmp_path / "new.parquet")
    assert file_version_of(old_schema, v1) == v1
    assert file_version_of(new_schema, v1) == v2
    read: list[list[str] | None] = []

    def reader(path: str) -> Any:
        def read_columns(cols: list[str] | None) -> pa.Table:
            read.append(cols)
            return pq.read_table(path, columns=cols)

        return read_columns

    old = read_projected(old_schema, versions, None, reader(str(tmp_path / "old.parquet")))
    assert old.to_pylist() == [{"quantity": 3, "id": 1, "note": "n/a", **INTERNAL}]
    assert read[-1] == ["qty", "id", *sch.INTERNAL_COLUMNS]  # the dropped column is never read
    narrow = read_projected(
        old_schema, versions, ["id", "note", sch.VERSION_COL], reader(str(tmp_path / "old.parquet"))
    )
    assert narrow.to_pylist() == [{"id": 1, "note": "n/a", sch.VERSION_COL: 7}]
    assert read[-1] == ["id", sch.VERSION_COL]
    new = read_projected(new_schema, versions, ["id", "quantity"], reader(str(tmp_path / "new.parquet")))
    assert new.to_pylist() == [{"id": 2, "quantity": 9}]
    assert read[-1] == ["id", "quantity"]  # at the target version: read as asked
    with pytest.raises(SegrepError, match="has no column"):
        read_projected(old_schema, versions, ["qty"], reader(str(tmp_path / "old.parquet")))
