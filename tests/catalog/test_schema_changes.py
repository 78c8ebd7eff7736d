"""Schema versions (issue 35): each accepted change set through `segrep apply` makes one new version with field
ids kept, every refused one writes nothing; the writer stamps the version and field ids in every file; the
migration gives existing tables version 1; `table describe` shows the history; a rebuild from files recovers
a version the catalog lost."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from alembic import command
from sqlalchemy import delete, select

from segrep.catalog import models as m
from segrep.catalog.migrate import _config, upgrade
from segrep.catalog.revisions import head_revision
from segrep.catalog.schemas import current_schema, schema_history, schema_version, schema_versions
from segrep.core.errors import NotFoundError
from segrep.core.schema_changes import version_fingerprint, widens_to
from segrep.core.schema_versions import FIELD_ID_KEY, first_version, version_of_file
from segrep.data.reader import read_table
from segrep.data.writer import write_batch
from tests.support.badinput import assert_user_error, unchanged
from tests.support.cli import cli
from tests.support.env import Env, make_env

COLUMNS = """      k: int64
      a: string
      b: int32
      c: float32
      d: decimal(10,2)
      e: string
"""
YAML = f"""
data_dir: data
sites:
  primary: {{id: 1, uri: sites/primary}}
tables:
  t:
    columns:
{COLUMNS}    primary_key: [k]
    leader: primary
"""

V1 = [(1, "k", "int64"), (2, "a", "string"), (3, "b", "int32"), (4, "c", "float32"), (5, "d", "decimal(10,2)")]
V1 = [*V1, (6, "e", "string")]


@pytest.fixture
def schema_env(catalog_url: str, tmp_path: Path) -> Env:
    e = make_env(tmp_path, catalog_url, YAML)
    yield e
    e.catalog.dispose()


def _batch(keys: list[int], **extra: pa.Array) -> pa.Table:
    n = len(keys)
    cols = {
        "k": pa.array(keys, pa.int64()),
        "a": pa.array(["x"] * n),
        "b": pa.array([1] * n, pa.int32()),
        "c": pa.array([0.5] * n, pa.float32()),
        "d": pa.array([decimal.Decimal("1.25")] * n, pa.decimal128(10, 2)),
        "e": pa.array(["y"] * n),
    }
    cols.update(extra)
    return pa.table(cols)


def _redefine(schema_env: Env, columns: str) -> None:
    schema_env.config.write_text(YAML.replace(COLUMNS, columns))


def _table(schema_env: Env) -> m.Table:
    with schema_env.catalog.read() as s:
        row = s.scalars(select(m.Table).where(m.Table.name == "t")).one()
        s.expunge(row)
        return row


def _ids(schema_env: Env) -> list[tuple[int, str, str]]:
    with schema_env.catalog.read() as s:
        return [(c.field_id, c.name, c.type) for c in current_schema(s, _table(schema_env).table_id).columns]


CHANGED = """      k: int64
      note: {type: string, renamed_from: a}
      b: int64
      d: decimal(12,2)
      c: float64
      channel: {type: string, default: web}
"""
CHANGE_TEXT = (
    "add channel string (default 'web'); rename a -> note; widen b int32 -> int64; widen d decimal(10,2) -> "
    "decimal(12,2); widen c float32 -> float64; drop e (soft); reorder columns"
)


def test_a_new_table_is_version_1_with_ids_in_column_order(schema_env: Env) -> None:
    table = _table(schema_env)
    assert (table.schema_version, table.next_field_id) == (1, 7)
    assert _ids(schema_env) == V1
    assert table.schema_fingerprint == version_fingerprint(first_version([(n, t) for _, n, t in V1]), ["k"])
    assert table.schema_fingerprint == schema_env.defs.table("t").fingerprint
    with schema_env.catalog.read() as s:
        history = schema_history(s, table.table_id)
        assert [(e.version, e.change) for e in history] == [(1, "created")]
        assert schema_version(s, table.table_id, 1) == history[0].schema
        with pytest.raises(NotFoundError, match="no schema version 2"):
            schema_version(s, table.table_id, 2)


def test_accepted_changes_make_one_version_and_keep_field_ids(schema_env: Env) -> None:
    write_batch(schema_env.catalog, "t", _batch([1, 2]))
    _redefine(schema_env, CHANGED)
    with unchanged(schema_env):
        code, out, _err = cli(schema_env, "apply", "--dry-run")
    assert code == 0, out
    assert f"table t: schema v1 -> v2: {CHANGE_TEXT}" in out
    code, out, err = cli(schema_env, "apply")
    assert code == 0, err
    assert f"table t: schema v1 -> v2: {CHANGE_TEXT}" in out
    table = _table(schema_env)
    assert (table.schema_version, table.next_field_id) == (2, 8)
    assert _ids(schema_env) == [
        (1, "k", "int64"),
        (2, "note", "string"),
        (3, "b", "int64"),
        (5, "d", "decimal(12,2)"),
        (4, "c", "float64"),
        (7, "channel", "string"),
    ]
    assert list(table.columns) == ["k", "note", "b", "d", "c", "channel"]
    with schema_env.catalog.read() as s:
        history = schema_history(s, table.table_id)
        assert [(e.version, e.change) for e in history] == [(1, "created"), (2, CHANGE_TEXT)]
        assert history[1].schema.by_id()[7].default == "web"
        assert set(schema_versions(s, table.table_id)) == {1, 2}
    assert table.schema_fingerprint == version_fingerprint(history[1].schema, ["k"])
    # the file still says renamed_from: applying it again changes nothing
    code, out, _err = cli(schema_env, "apply")
    assert code == 0 and "schema" not in out, out
    assert _table(schema_env).schema_version == 2
    # a dropped id is never reused: the next new column takes 8
    _redefine(schema_env, CHANGED + "      more: {type: int16, default: 3}\n")
    assert cli(schema_env, "apply")[0] == 0
    assert _ids(schema_env)[-1] == (8, "more", "int16")
    assert _table(schema_env).next_field_id == 9


def test_the_writer_stamps_the_version_and_field_ids(schema_env: Env) -> None:
    _written_before_and_after_the_change(schema_env, b=2**40, d="1234567890.12")
    with schema_env.catalog.read() as s:
        segs = s.scalars(select(m.Segment).order_by(m.Segment.entry_id)).all()
        versions = schema_versions(s, _table(schema_env).table_id)
    assert [x.schema_version for x in segs] == [1, 2]
    assert segs[0].schema_fingerprint != segs[1].schema_fingerprint  # each keeps the one it was written with
    for seg in segs:
        schema = pq.read_schema(schema_env.site_dir("primary") / seg.relpath)
        assert version_of_file(schema) == versions[seg.schema_version]
        ids = [(int(f.metadata[FIELD_ID_KEY]), f.name) for f in schema if f.metadata and FIELD_ID_KEY in f.metadata]
        assert ids == [(c.field_id, c.name) for c in versions[seg.schema_version].columns]
        # Parquet's own field ids, as any Parquet reader sees them
        parquet = pq.ParquetFile(schema_env.site_dir("primary") / seg.relpath).schema
        assert parquet.column(0).name == "k" and "field_id=1" in str(parquet)


@pytest.mark.parametrize(
    ("columns", "needles"),
    [
        (COLUMNS.replace("b: int32", "b: int16"), ["column b", "int32 -> int16", "segrep table rewrite"]),
        (COLUMNS.replace("a: string", "a: int64"), ["column a", "string -> int64", "segrep table rewrite"]),
        (COLUMNS.replace("c: float32", "c: decimal(10,2)"), ["column c", "float32 -> decimal(10,2)", "way out"]),
        (COLUMNS.replace("decimal(10,2)", "decimal(12,3)"), ["column d", "decimal(10,2) -> decimal(12,3)"]),
        (COLUMNS.replace("k: int64", "k: int32"), ["key column k", "int64 -> int32", "segrep table rewrite"]),
        (COLUMNS.replace("k: int64\n", "k: int64\n      b2: {type: int32, renamed_from: zz}\n"), ["renamed_from 'zz'"]),
        (COLUMNS + "      b3: {type: int32, renamed_from: b}\n", ["b3", "claim column b", "way out"]),
        (COLUMNS + "      f: {type: int32, default: x}\n", ["column f", "default 'x'", "int32"]),
        (COLUMNS.replace("b: int32", "b: {type: int32, default: 5}"), ["column b", "default", "way out: none"]),
    ],
    ids=[
        "narrow",
        "family",
        "float-to-decimal",
        "decimal-scale",
        "key-type",
        "no-such-column",
        "kept-and-renamed",
        "default-type",
        "default-later",
    ],
)
def test_refused_changes_name_the_column_and_write_nothing(schema_env: Env, columns: str, needles: list[str]) -> None:
    write_batch(schema_env.catalog, "t", _batch([1]))
    _redefine(schema_env, columns)
    with unchanged(schema_env):
        code, out, err = cli(schema_env, "apply")
    assert_user_error(code, out, err, *needles)


def test_a_new_tables_defaults_are_kept_in_version_1(schema_env: Env) -> None:
    _redefine(schema_env, COLUMNS.replace("e: string", "e: {type: string, default: none}"))
    code, out, err = cli(schema_env, "apply")  # the table holds no segment: created again, with the default
    assert code == 0, err
    assert _ids(schema_env)[-1] == (6, "e", "string")
    code, out, _err = cli(schema_env, "apply")
    assert (code, out) == (0, "no changes\n") or (code == 0 and "table t" not in out), out
    with schema_env.catalog.read() as s:
        assert current_schema(s, _table(schema_env).table_id).by_id()[6].default == "none"


def test_a_reorder_alone_reorders_what_reads_return(schema_env: Env) -> None:
    """Found by the schema state machine: a change that only reorders made version 2 in the right order, but
    the table row's column mapping equals the old one as a dict, so it was never written back and reads kept
    the old order."""
    write_batch(schema_env.catalog, "t", _batch([1]))
    order = ["k", "e", "d", "c", "b", "a"]
    _redefine(schema_env, "".join(f"      {n}: {dict((c, t) for _i, c, t in V1)[n]}\n" for n in order))
    code, out, err = cli(schema_env, "apply")
    assert code == 0 and "reorder columns" in out, err
    assert read_table(schema_env.catalog, "t").column_names == order
    assert list(_table(schema_env).columns) == order


def test_key_columns_are_never_renamed_or_dropped(schema_env: Env) -> None:
    write_batch(schema_env.catalog, "t", _batch([1]))
    schema_env.config.write_text(
        YAML.replace("      k: int64\n", "      key: {type: int64, renamed_from: k}\n").replace("[k]", "[key]")
    )
    with unchanged(schema_env):
        code, out, err = cli(schema_env, "apply")
    assert_user_error(code, out, err, "key column k", "renaming", "segrep table rewrite")
    schema_env.config.write_text(YAML.replace("      k: int64\n", "      k2: int64\n").replace("[k]", "[k2]"))
    with unchanged(schema_env):
        code, out, err = cli(schema_env, "apply")
    assert_user_error(code, out, err, "key column k", "dropping")


def test_a_name_always_means_one_column(schema_env: Env) -> None:
    write_batch(schema_env.catalog, "t", _batch([1]))
    _redefine(schema_env, COLUMNS.replace("      e: string\n", ""))
    assert cli(schema_env, "apply")[0] == 0  # e dropped (soft)
    _redefine(schema_env, COLUMNS.replace("e: string", "e: int64"))
    with unchanged(schema_env):
        code, out, err = cli(schema_env, "apply")
    assert_user_error(code, out, err, "column e", "field id 6", "another name")
    swapped = COLUMNS.replace("      e: string\n", "").replace("a: string", "e: {type: string, renamed_from: a}")
    _redefine(schema_env, swapped)
    with unchanged(schema_env):
        code, out, err = cli(schema_env, "apply")
    assert_user_error(code, out, err, "renaming a to e", "field id 6")


def test_an_empty_table_is_created_again_for_a_change_that_would_misread_rows(schema_env: Env) -> None:
    _redefine(schema_env, COLUMNS.replace("b: int32", "b: string"))
    code, out, err = cli(schema_env, "apply")
    assert code == 0, err
    assert "table t (columns)" in out
    assert _table(schema_env).schema_version == 1
    assert (3, "b", "string") in _ids(schema_env)


def test_migration_gives_existing_tables_version_1(catalog_url: str, tmp_path: Path) -> None:
    """A catalog with a table and a segment at the previous revision (0009: downgraded from head, which drops
    what 0010 added) upgraded to head: version 1 from tables.columns, ids 1..n, the segment at version 1."""
    schema_env = make_env(tmp_path, catalog_url, YAML)
    write_batch(schema_env.catalog, "t", _batch([1]))
    cfg = _config()
    with schema_env.catalog.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0009")
    assert upgrade(schema_env.catalog) == ("0009", head_revision())
    table = _table(schema_env)
    assert (table.schema_version, table.next_field_id) == (1, 7)
    assert _ids(schema_env) == V1
    assert table.schema_fingerprint == schema_env.defs.table("t").fingerprint
    with schema_env.catalog.read() as s:
        assert [x.schema_version for x in s.scalars(select(m.Segment))] == [1]
        assert [e.change for e in schema_history(s, table.table_id)] == ["created"]
    code, out, _err = cli(schema_env, "apply")
    assert code == 0 and "schema" not in out, out
    assert _table(schema_env).schema_version == 1
    schema_env.catalog.dispose()


def test_describe_shows_the_schema_history(schema_env: Env) -> None:
    _redefine(schema_env, CHANGED)
    assert cli(schema_env, "apply")[0] == 0
    code, out, err = cli(schema_env, "table", "describe", "t")
    assert code == 0, err
    assert "table t  (schema v2, fingerprint" in out
    assert "schema history" in out
    assert "  v1  " in out and "created" in out
    assert "  v2  " in out and CHANGE_TEXT in out
    assert "1:k int64, 2:a string, 3:b int32, 4:c float32, 5:d decimal(10,2), 6:e string" in out
    assert "1:k int64, 2:note string, 3:b int64, 5:d decimal(12,2), 4:c float64, 7:channel string default 'web'" in out
    year = str(dt.datetime.now(dt.UTC).year)
    assert f"  v2  {year}" in out


def test_a_rebuild_recovers_a_version_the_catalog_lost(schema_env: Env) -> None:
    _written_before_and_after_the_change(schema_env, b=7, d="1.00")
    with schema_env.catalog.read() as s:
        v2 = current_schema(s, _table(schema_env).table_id)
    # the catalog restored from before the change: version 1 current, version 2 unknown
    with schema_env.catalog.write() as s:
        table = s.scalars(select(m.Table).where(m.Table.name == "t")).one()
        s.execute(delete(m.SchemaVersionRow).where(m.SchemaVersionRow.version == 2))
        table.schema_version, table.next_field_id = 1, 7
        table.columns = {name: kind for _, name, kind in V1}
    code, out, err = cli(schema_env, "catalog", "rebuild", "--site", "primary", "--dry-run")
    assert code == 0, err
    assert "SCHEMA: table t schema version 2" in out and "would be recorded" in out
    code, out, err = cli(schema_env, "catalog", "rebuild", "--site", "primary")
    assert code == 0, err
    table = _table(schema_env)
    assert (table.schema_version, table.next_field_id, list(table.columns)) == (2, 8, [c.name for c in v2.columns])
    with schema_env.catalog.read() as s:
        assert current_schema(s, table.table_id) == v2
        assert sorted(x.schema_version for x in s.scalars(select(m.Segment))) == [1, 2]
        assert schema_history(s, table.table_id)[1].change == "recovered from segment files at site primary"


@pytest.mark.parametrize(
    ("old", "new", "ok"),
    [
        ("int8", "int16", True),
        ("int8", "int64", True),
        ("int32", "int64", True),
        ("int64", "int32", False),
        ("int32", "int32", False),
        ("float32", "float64", True),
        ("float64", "float32", False),
        ("int32", "float64", False),
        ("decimal(10,2)", "decimal(12,2)", True),
        ("decimal(12,2)", "decimal(10,2)", False),
        ("decimal(10,2)", "decimal(12,3)", False),
        ("int64", "decimal(38,0)", False),
        ("date", "timestamp", False),
        ("string", "binary", False),
    ],
)
def test_only_widening_is_a_type_change(old: str, new: str, ok: bool) -> None:
    assert widens_to(old, new) is ok


def _written_before_and_after_the_change(schema_env: Env, *, b: int, d: str) -> None:
    """A row written at version 1, the CHANGED definitions applied, a row written at version 2."""
    write_batch(schema_env.catalog, "t", _batch([1]))
    _redefine(schema_env, CHANGED)
    assert cli(schema_env, "apply")[0] == 0
    v2_row = {
        "k": pa.array([2], pa.int64()),
        "note": pa.array(["n"]),
        "b": pa.array([b], pa.int64()),
        "d": pa.array([decimal.Decimal(d)], pa.decimal128(12, 2)),
        "c": pa.array([0.25], pa.float64()),
        "channel": pa.array(["app"]),
    }
    write_batch(schema_env.catalog, "t", pa.table(v2_row))
