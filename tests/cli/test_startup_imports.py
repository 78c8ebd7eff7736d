"""What a ``segrep`` process imports before its command runs: every command and every DAG task starts one.

pyiceberg, pyarrow.dataset (which imports pandas), boto3 and alembic cost 0.1-0.8 s each to import; only the
commands that use them import them (a publication, an S3 site, ``segrep init``). Checked in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

HEAVY = ("pyiceberg", "pyarrow.dataset", "pandas", "boto3", "alembic", "pyspark")


def _imported(code: str, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    probe = f"import json, sys\n{code}\nprint(json.dumps([m for m in {heavy!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "module",
    [
        "segrep.cli.main",  # every command, and --help
        "segrep.cli.views",  # status, list, describe
        "segrep.replication.orchestrator",  # round: a table that does not publish
        "segrep.replication.publication",  # write: the written sites' publication, asked first
        "segrep.data.reader",  # read
        "segrep.maintenance.gc",  # gc: a table that does not publish
        "segrep",  # the Python API
    ],
)
def test_a_command_imports_nothing_heavy_it_does_not_use(module: str) -> None:
    assert _imported(f"import {module}") == []


def test_a_local_publication_imports_neither_pyicebergs_pyarrow_io_nor_pyarrow_dataset(tmp_path: Path) -> None:
    """A round of a table that publishes, between local sites, to the default SQL catalog: pyiceberg itself, but
    neither its pyarrow FileIO (segrep's ``publish.site_io`` writes the files), ``pyarrow.dataset``, nor its REST
    catalog client and requests. (pandas comes anyway: pyarrow imports it on its first conversion of Python
    values.)"""
    config = tmp_path / "segrep.yaml"
    config.write_text(
        "data_dir: data\n"
        "sites:\n  primary: {id: 1, uri: sites/primary}\n  dr: {id: 2, uri: sites/dr}\n"
        "tables:\n  t:\n    columns: {k: int64, v: string}\n    primary_key: [k]\n    leader: primary\n"
        "    replicas: [dr]\n    policy: {publish: iceberg}\n"
    )
    code = (
        "import pyarrow as pa\n"
        "from segrep import Catalog, apply_definitions, load_definitions, run_round, upgrade, write_batch\n"
        f"catalog = Catalog('sqlite:///{tmp_path}/catalog.db')\n"
        f"upgrade(catalog); defs = load_definitions('{config}'); apply_definitions(catalog, defs)\n"
        "write_batch(catalog, 't', pa.table({'k': pa.array([1, 2], pa.int64()), 'v': ['a', 'b']}), defs=defs)\n"
        "report = run_round(catalog, defs, 't')\n"
        "assert {p.site: str(p.status) for p in report.published}['dr'] == 'published', report.published\n"
        "assert 'pyiceberg' in sys.modules\n"
    )
    unused = ("pyiceberg.io.pyarrow", "pyarrow.dataset", "pyiceberg.catalog.rest", "requests")
    assert _imported(code, unused) == []


def test_commands_on_a_table_with_split_points_import_no_pandas(tmp_path: Path) -> None:
    """Every command parses the definitions, split points included: an integer or string split point is checked
    without Arrow's conversion of a Python value, which imports pandas (0.2 s of every process)."""
    config = tmp_path / "segrep.yaml"
    config.write_text(
        "data_dir: data\n"
        "sites:\n  primary: {id: 1, uri: sites/primary}\n  dr: {id: 2, uri: sites/dr}\n"
        "tables:\n"
        "  t:\n    columns: {k: int64, v: string}\n    primary_key: [k]\n    partition_key: k\n"
        "    split_points: [100, 200]\n    leader: primary\n    replicas: [dr]\n"
        "  s:\n    columns: {name: string}\n    primary_key: [name]\n    partition_key: name\n"
        "    split_points: [m]\n    leader: primary\n    replicas: [dr]\n"
    )
    base = _applied(config, tmp_path)
    for args in (["status", "t"], ["status", "s", "--json"], ["segments", "t"], ["round", "s"]):
        # the click group, not the console script (which hides pandas): what Airflow's tasks and the API parse
        assert not _command_imports_pandas("main", [*base, *args], tmp_path), args


def _applied(config: Path, root: Path) -> list[str]:
    """A SQLite catalog under ``root`` holding ``config``'s definitions; the options that name both."""
    url = f"sqlite:///{root}/catalog.db"
    setup = (
        "from segrep import Catalog, apply_definitions, load_definitions, upgrade\n"
        f"catalog = Catalog({url!r}); upgrade(catalog); apply_definitions(catalog, load_definitions({str(config)!r}))\n"
    )
    subprocess.run([sys.executable, "-c", setup], check=True)
    return ["--config", str(config), "--catalog", url]


def _command_imports_pandas(entry: str, args: list[str], cwd: Path) -> bool:
    """Whether ``segrep.cli.main.<entry>`` (``main``, the click group; ``run``, the console script's entry point)
    running the command ``args`` in ``cwd`` imported pandas; the command must succeed."""
    code = (
        f"import os, sys\nos.chdir({str(cwd)!r}); sys.argv = ['segrep', *{args!r}]\n"
        f"from segrep.cli.main import {entry}\n"
        f"try:\n    {entry}()\nexcept SystemExit as exit:\n    assert exit.code in (0, None), exit.code\n"
    )
    return _imported(code, ("pandas",)) == ["pandas"]


def test_the_console_script_writes_reads_and_publishes_without_pandas(tmp_path: Path) -> None:
    """pyarrow imports pandas on its first type inference or numpy conversion, only to recognise pandas objects;
    the console script hides pandas, so a write, a round that publishes and a read of a table that publishes
    never import it (0.2-0.3 s of each), and their results are those of the Python API."""
    config = tmp_path / "segrep.yaml"
    config.write_text(
        "data_dir: data\n"
        "sites:\n  primary: {id: 1, uri: sites/primary}\n  dr: {id: 2, uri: sites/dr}\n"
        "tables:\n  t:\n    columns: {k: int64, v: string, at: timestamp, x: float64}\n    primary_key: [k]\n"
        "    partition_key: k\n    split_points: [100]\n    leader: primary\n    replicas: [dr]\n"
        "    policy: {publish: iceberg}\n"
    )
    base = _applied(config, tmp_path)
    batch = pa.table(
        {
            "k": pa.array([1, 150, 7], pa.int64()),
            "v": pa.array(["a", None, "c"]),
            "at": pa.array([0, 10**15, None], pa.timestamp("us", tz="UTC")),
            "x": pa.array([1.5, None, float("nan")]),
        }
    )
    pq.write_table(batch, tmp_path / "batch.parquet")
    out = tmp_path / "out.parquet"
    for args in (["write", "t", "batch.parquet"], ["round", "t"], ["read", "t", "--site", "dr", "--output", str(out)]):
        assert not _command_imports_pandas("run", [*base, *args], tmp_path), args
    got = pq.read_table(out).sort_by("k").select(batch.column_names)
    assert repr(got.to_pylist()) == repr(batch.sort_by("k").to_pylist())  # repr: NaN equals NaN


def test_hidden_pandas_fails_to_import_and_pyarrow_still_converts() -> None:
    """In a process that hid pandas, ``import pandas`` fails and pyarrow still infers, converts and compares
    (missing values, NaN, timestamps, numpy); the Python API never hides it."""
    code = (
        "import datetime as dt, math, numpy as np, pyarrow as pa, pyarrow.compute as pc\n"
        "from segrep.cli.no_pandas import hide_pandas\n"
        "hide_pandas(); hide_pandas()\n"
        "try:\n    import pandas\nexcept ModuleNotFoundError:\n    pass\nelse:\n    raise SystemExit('imported')\n"
        "a = pa.array([1, None, 3]); assert a.type == pa.int64() and a.null_count == 1\n"
        "assert pa.array([dt.datetime(2026, 1, 1, tzinfo=dt.UTC)]).type == pa.timestamp('us', tz='UTC')\n"
        "assert math.isnan(pa.array([float('nan')]).to_pylist()[0])\n"
        "assert pa.array(np.arange(3)).to_numpy().tolist() == [0, 1, 2]\n"
        "assert pc.sum(pa.chunked_array([[1, 2], [3]])).as_py() == 6\n"
        "assert pa.scalar('x').as_py() == 'x'\n"
    )
    assert _imported(code) == []
    assert _imported("import segrep.cli.main\nimport pandas", ("pandas",)) == ["pandas"]
