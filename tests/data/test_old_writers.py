"""A writer at an older schema version (issue 35 item 4): after `segrep apply` moved the table to version 2, a
writer not yet redeployed still sends version 1's columns. Its batch is accepted (checked at version 1's types,
projected to version 2 by field id: the rename maps, the widened column casts, the added column takes its
default, the dropped column's values are discarded) and stored at version 2; a batch of a column set no version
had is refused naming the columns and the versions tried, nothing written, by the API and by `segrep write`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from segrep.catalog import models as m
from segrep.catalog.apply import apply_definitions
from segrep.core.errors import SchemaMismatchError
from segrep.data.reader import read_table
from segrep.data.writer import write_batch
from tests.support.badinput import assert_user_error, unchanged
from tests.support.cli import cli
from tests.support.env import Env, make_env

YAML = """
data_dir: data
sites:
  primary: {id: 1, uri: sites/primary}
tables:
  kv:
    columns: {k: int64, n: int16, gone: string, v: string}
    primary_key: [k]
    split_points: [5]
    leader: primary
"""
# v renamed to value, n widened, gone dropped (soft), note added with a default, extra added without one
YAML_V2 = YAML.replace(
    "    columns: {k: int64, n: int16, gone: string, v: string}\n",
    "    columns:\n"
    "      k: int64\n"
    "      n: int64\n"
    "      value: {type: string, renamed_from: v}\n"
    "      note: {type: string, default: '-'}\n"
    "      extra: float64\n",
)


def v1_rows(keys: list[int], tag: str) -> pa.Table:
    return pa.table(
        {
            "k": pa.array(keys, pa.int64()),
            "n": pa.array([k * 100 for k in keys], pa.int16()),
            "gone": [f"g{k}" for k in keys],
            "v": [f"{tag}{k}" for k in keys],
        }
    )


def v2_row(k: int, tag: str, note: str = "-", extra: float | None = None) -> dict[str, Any]:
    return {"k": k, "n": k * 100, "value": f"{tag}{k}", "note": note, "extra": extra}


@pytest.fixture
def writers_env(tmp_path: Path) -> Iterator[Env]:
    e = make_env(tmp_path, f"sqlite:///{tmp_path}/catalog.db", YAML)
    write_batch(e.catalog, "kv", v1_rows([1, 2, 6], "a"))
    e.config.write_text(YAML_V2)
    apply_definitions(e.catalog, e.defs)
    yield e
    e.catalog.dispose()


def rows_of(writers_env: Env) -> list[dict[str, Any]]:
    return sorted(read_table(writers_env.catalog, "kv").to_pylist(), key=lambda r: r["k"])


def segment_versions(writers_env: Env) -> list[int]:
    with writers_env.catalog.read() as s:
        return sorted(seg.schema_version for seg in s.query(m.Segment).all())


def test_a_batch_of_version_1_columns_is_stored_at_version_2(writers_env: Env) -> None:
    result = write_batch(writers_env.catalog, "kv", v1_rows([2, 7], "b"))  # an update of a v1 row and a new row
    assert (result.batch_version, result.stored_version, result.rows_written) == (1, 2, 2)
    assert segment_versions(writers_env) == [1, 1, 2, 2]  # the new segments (one per partition) are at version 2
    assert rows_of(writers_env) == [v2_row(1, "a"), v2_row(2, "b"), v2_row(6, "a"), v2_row(7, "b")]
    # a version 2 writer and a version 1 writer side by side, and a delete of keys (the key was not renamed)
    write_batch(
        writers_env.catalog,
        "kv",
        pa.table({"k": [8], "n": [2**40], "value": ["c8"], "note": ["x"], "extra": [0.5]}),
    )
    write_batch(writers_env.catalog, "kv", pa.table({"k": pa.array([1, 7], pa.int64())}), delete=True)
    assert rows_of(writers_env) == [
        v2_row(2, "b"),
        v2_row(6, "a"),
        {"k": 8, "n": 2**40, "value": "c8", "note": "x", "extra": 0.5},
    ]


def test_a_version_1_batch_is_checked_at_version_1_types(writers_env: Env) -> None:
    """The old writer's batch converts as strictly as any: a value version 1's int16 column cannot hold is
    refused, naming the column, although the current int64 would hold it."""
    batch = v1_rows([3], "b").set_column(1, "n", pa.array([100_000], pa.int64()))
    with unchanged(writers_env), pytest.raises(SchemaMismatchError, match="column n has type int64, table wants int16"):
        write_batch(writers_env.catalog, "kv", batch)


def test_a_batch_of_columns_no_version_had_is_refused(writers_env: Env, tmp_path: Path) -> None:
    mixed = v1_rows([3], "b").append_column("note", pa.array(["x"]))  # version 1's columns plus version 2's note
    with unchanged(writers_env), pytest.raises(SchemaMismatchError) as caught:
        write_batch(writers_env.catalog, "kv", mixed)
    assert str(caught.value) == (
        "batch lacks columns: value, extra; and has columns the table does not: gone, v (against the current "
        "schema version 2; its columns match no schema version of the table, versions tried: 2, 1)"
    )

    src = tmp_path / "in" / "mixed.parquet"
    src.parent.mkdir()
    pq.write_table(mixed, src)
    with unchanged(writers_env):
        code, out, err = cli(writers_env, "write", "kv", str(src))
    assert_user_error(code, out, err, "batch lacks columns: value, extra", "versions tried: 2, 1")


def test_segrep_write_takes_an_old_writers_csv(writers_env: Env, tmp_path: Path) -> None:
    """The CLI reads a CSV's columns at the types of the version that has them (v is a string column)."""
    src = tmp_path / "in" / "old.csv"
    src.parent.mkdir()
    src.write_text("k,n,gone,v\n3,300,g3,007\n")
    code, out, err = cli(writers_env, "write", "kv", str(src))
    assert code == 0, err
    assert "the file has the columns of schema version 1: stored at the current version 2" in out
    assert rows_of(writers_env)[2] == {"k": 3, "n": 300, "value": "007", "note": "-", "extra": None}
