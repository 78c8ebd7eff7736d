"""Bad keys and column types through `segrep write` (issue 11 item 4): each refused as one line naming the
column, the given type and the table's type, exit 2, nothing written; lossless widenings still write the
exact rows.

Today's failures this guards against: a bool column became an int64 key (True overwrote key 1), a timestamp
became its microseconds, NaN keys were accepted (two NaN rows coexisted; a delete of NaN deleted nothing).
"""

from __future__ import annotations

import datetime as dt
import decimal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from segrep.data.reader import read_table
from tests.support.badinput import assert_user_error, catalog_rows, tree_state, unchanged
from tests.support.cli import cli, cli_command
from tests.support.env import BACKENDS, Env, env_fixture, shared_env
from tests.support.tables import orders

KEYS_YAML = """
data_dir: data
sites:
  primary: {id: 1, uri: sites/primary}
  dr: {id: 2, uri: sites/dr}
tables:
  ik:
    columns: {k: int64, v: string, f: float64, b: bool, at: timestamp}
    primary_key: [k]
    split_points: [100]
    leader: primary
    replicas: [dr]
  fk:
    columns: {k: float64, v: string}
    primary_key: [k]
    leader: primary
  tk:
    columns: {k: timestamp, v: string}
    primary_key: [k]
    leader: primary
  dk:
    columns: {k: 'decimal(10,2)', d: date, v: string}
    primary_key: [k]
    leader: primary
"""

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.fixture
def kenv(catalog_url: str, tmp_path: Path) -> Iterator[Env]:
    """Tables keyed by int64 (`ik`, two partitions), float64 (`fk`), timestamp (`tk`) and decimal (`dk`)."""
    root = tmp_path / "env"  # the input files stay outside the environment `unchanged` compares
    root.mkdir()
    yield from env_fixture(root, catalog_url, KEYS_YAML)


@pytest.fixture(scope="module", params=BACKENDS)
def refusing_kenv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """``kenv`` shared by the tests that prove a refused write changed nothing (``unchanged``)."""
    yield from shared_env(request, tmp_path_factory, KEYS_YAML)


def ik_rows(**columns: pa.Array) -> pa.Table:
    """Two good rows of `ik`, with some columns replaced."""
    good = {
        "k": pa.array([1, 200], pa.int64()),
        "v": pa.array(["a", "b"]),
        "f": pa.array([0.5, 1.5]),
        "b": pa.array([True, False]),
        "at": pa.array([T0, T0], pa.timestamp("us", tz="UTC")),
    }
    return pa.table({**good, **columns})


def parquet(tmp_path: Path, rows: pa.Table, name: str = "in.parquet") -> Path:
    path = tmp_path / name
    pq.write_table(rows, path)
    return path


BAD_PARQUET: list[tuple[str, str, pa.Table, bool, tuple[str, ...]]] = [
    # (id, table, rows, delete, needles)
    ("bool-as-int-key", "ik", ik_rows(k=pa.array([True, False])), False, ("column k", "bool", "int64")),
    ("timestamp-as-int-key", "ik", ik_rows(k=pa.array([T0, T0])), False, ("column k", "timestamp", "int64")),
    ("float-as-int-key", "ik", ik_rows(k=pa.array([1.0, 2.0])), False, ("column k", "double", "int64")),
    ("string-as-int-key", "ik", ik_rows(k=pa.array(["1", "2"])), False, ("column k", "string", "int64")),
    ("uint64-out-of-range", "ik", ik_rows(k=pa.array([2**64 - 1, 1], pa.uint64())), False, ("column k", "int64")),
    ("null-int-key", "ik", ik_rows(k=pa.array([1, None], pa.int64())), False, ("key column k", "null")),
    ("int-as-bool-column", "ik", ik_rows(b=pa.array([1, 0])), False, ("column b", "int64", "bool")),
    ("int-as-float-column", "ik", ik_rows(f=pa.array([1, 2])), False, ("column f", "int64", "float64")),
    ("string-as-timestamp", "ik", ik_rows(at=pa.array(["2026-01-01", "x"])), False, ("column at", "timestamp")),
    ("nan-float-key", "fk", pa.table({"k": [float("nan"), 1.0], "v": ["a", "b"]}), False, ("key column k", "NaN")),
    ("nan-float-key-delete", "fk", pa.table({"k": [float("nan")]}), True, ("key column k", "NaN")),
    ("bool-key-delete", "ik", pa.table({"k": [True]}), True, ("column k", "bool", "int64")),
    ("int-as-timestamp-key", "tk", pa.table({"k": [1, 2], "v": ["a", "b"]}), False, ("column k", "timestamp")),
    (
        "timestamp-ns-below-us",
        "tk",
        pa.table({"k": pa.array([1_500], pa.timestamp("ns")), "v": ["a"]}),
        False,
        ("column k", "timestamp", "lose data"),
    ),
    (
        "decimal-losing-digits",
        "dk",
        pa.table(
            {
                "k": pa.array([decimal.Decimal("1.234")], pa.decimal128(15, 3)),
                "d": [dt.date(2026, 1, 1)],
                "v": ["a"],
            }
        ),
        False,
        ("column k", "decimal(10,2)"),
    ),
    (
        "float-as-decimal-key",
        "dk",
        pa.table({"k": [1.25], "d": [dt.date(2026, 1, 1)], "v": ["a"]}),
        False,
        ("column k", "double", "decimal(10,2)"),
    ),
    (
        "datetime-as-date",
        "dk",
        pa.table({"k": pa.array([decimal.Decimal("1.00")], pa.decimal128(10, 2)), "d": [T0], "v": ["a"]}),
        False,
        ("column d", "timestamp", "date"),
    ),
]


@pytest.mark.parametrize(
    ("table", "rows", "delete", "needles"), [c[1:] for c in BAD_PARQUET], ids=[c[0] for c in BAD_PARQUET]
)
def test_bad_parquet_input_is_refused_and_writes_nothing(
    refusing_kenv: Env, tmp_path: Path, table: str, rows: pa.Table, delete: bool, needles: tuple[str, ...]
) -> None:
    kenv = refusing_kenv
    path = parquet(tmp_path, rows)
    with unchanged(kenv):
        code, out, err = cli(kenv, "write", table, str(path), *(["--delete"] if delete else []))
    assert_user_error(code, out, err, *needles)


BAD_CSV = [
    ("nan-key", "fk", "k,v\nnan,a\n1.0,b\n", ("key column k", "null")),  # Arrow's CSV reader: "nan" is null
    ("bool-in-int-key", "ik", "k,v,f,b,at\ntrue,a,0.5,true,2026-01-01T00:00:00Z\n", ("column k:", "int64", "'true'")),
    ("empty-int-key", "ik", "k,v,f,b,at\n,a,0.5,true,2026-01-01T00:00:00Z\n", ("key column k", "null")),
    (
        "huge-int-key",
        "ik",
        "k,v,f,b,at\n1180591620717411303424,a,0.5,true,2026-01-01T00:00:00Z\n",
        ("int64", "1180591620717411303424"),
    ),
]


@pytest.mark.parametrize(("table", "text", "needles"), [c[1:] for c in BAD_CSV], ids=[c[0] for c in BAD_CSV])
def test_bad_csv_input_is_refused_and_writes_nothing(
    refusing_kenv: Env, tmp_path: Path, table: str, text: str, needles: tuple[str, ...]
) -> None:
    kenv = refusing_kenv
    path = tmp_path / "in.csv"
    path.write_text(text)
    with unchanged(kenv):
        code, out, err = cli(kenv, "write", table, str(path))
    assert_user_error(code, out, err, *needles)


def test_a_bool_never_overwrites_key_1(kenv: Env, tmp_path: Path) -> None:
    """The issue's case: after writing key 1, a batch whose key column is bool True is refused; key 1 keeps
    its row."""
    code, _, err = cli(kenv, "write", "ik", str(parquet(tmp_path, ik_rows(), "good.parquet")))
    assert code == 0, err
    with unchanged(kenv):
        code, out, err = cli(
            kenv, "write", "ik", str(parquet(tmp_path, ik_rows(k=pa.array([True, False]), v=pa.array(["x", "y"]))))
        )
    assert_user_error(code, out, err, "column k", "bool")
    assert read_table(kenv.catalog, "ik").sort_by("k").column("v").to_pylist() == ["a", "b"]


def test_lossless_widenings_write_the_exact_rows(kenv: Env, tmp_path: Path) -> None:
    """Narrower integers, float32, string views, timestamps in other units and zones, dictionary-encoded
    strings and decimals of another scale are written as the table's types, values unchanged."""
    paris = pa.timestamp("ms", tz="Europe/Paris")
    rows = pa.table(
        {
            "k": pa.array([1, 200], pa.int16()),
            "v": pa.array(["a", "b"]).dictionary_encode(),
            "f": pa.array([0.5, 1.5], pa.float32()),
            "b": pa.array([True, False]),
            "at": pa.array([T0, T0 + dt.timedelta(milliseconds=7)], paris),
        }
    )
    code, _, err = cli(kenv, "write", "ik", str(parquet(tmp_path, rows)))
    assert code == 0, err
    got = read_table(kenv.catalog, "ik").sort_by("k")
    assert got.column("k").to_pylist() == [1, 200]
    assert got.column("v").to_pylist() == ["a", "b"]
    assert got.column("f").to_pylist() == [0.5, 1.5]
    assert got.column("at").to_pylist() == [T0, T0 + dt.timedelta(milliseconds=7)]

    dec = pa.table(
        {
            "k": pa.array([decimal.Decimal("1.200"), decimal.Decimal("-3.000")], pa.decimal128(12, 3)),
            "d": pa.array([dt.datetime(2026, 1, 2), dt.datetime(2026, 1, 3)], pa.date64()),
            "v": pa.array(["a", "b"], pa.large_string()),
        }
    )
    code, _, err = cli(kenv, "write", "dk", str(parquet(tmp_path, dec, "dec.parquet")))
    assert code == 0, err
    got = read_table(kenv.catalog, "dk").sort_by("k")
    assert got.column("k").to_pylist() == [decimal.Decimal("-3.00"), decimal.Decimal("1.20")]
    assert got.column("d").to_pylist() == [dt.date(2026, 1, 3), dt.date(2026, 1, 2)]


def test_negative_zero_and_zero_are_one_float_key(kenv: Env, tmp_path: Path) -> None:
    """-0.0 == 0.0: the later row of the batch wins, as for any equal key, and a delete of 0.0 deletes it."""
    rows = pa.table({"k": [-0.0, 0.0, 1.0], "v": ["first", "second", "x"]})
    code, _, err = cli(kenv, "write", "fk", str(parquet(tmp_path, rows)))
    assert code == 0, err
    got = read_table(kenv.catalog, "fk").sort_by("k")
    assert got.to_pylist() == [{"k": 0.0, "v": "second"}, {"k": 1.0, "v": "x"}]
    code, _, err = cli(kenv, "write", "fk", str(parquet(tmp_path, pa.table({"k": [-0.0]}), "del.parquet")), "--delete")
    assert code == 0, err
    assert read_table(kenv.catalog, "fk").column("k").to_pylist() == [1.0]


@pytest.mark.parametrize("blocked", ["orders", "orders/1"])
def test_a_plain_file_where_a_leader_directory_goes_is_named_and_nothing_is_written(
    sqlite_env: Env, tmp_path: Path, blocked: str
) -> None:
    """Before: `segrep: error: NotADirectoryError: [Errno 20] Not a directory: '...'`, no site named."""
    src = tmp_path.parent / f"{tmp_path.name}-in.parquet"  # outside the environment's root
    pq.write_table(orders([1, 2, 200_000]), src)
    in_the_way = sqlite_env.site_dir("primary") / blocked
    in_the_way.parent.mkdir(parents=True, exist_ok=True)
    in_the_way.write_text("not a directory\n")
    rows, files = catalog_rows(sqlite_env), _files(sqlite_env.root)
    run = subprocess.run(cli_command(sqlite_env, "write", "orders", str(src)), capture_output=True, text=True)
    # the files written for the other partitions are removed (their new directories may stay, empty)
    assert catalog_rows(sqlite_env) == rows and _files(sqlite_env.root) == files
    assert run.returncode == 1 and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
    assert f"site primary: {in_the_way} is a plain file where a directory is needed" in run.stderr, run.stderr


def _files(root: Path) -> dict[str, str]:
    return {path: digest for path, digest in tree_state(root).items() if digest != "dir"}
