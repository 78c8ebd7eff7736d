"""What a ``segrep`` process imports before its command runs: every command and every DAG task starts one.

pyiceberg, pyarrow.dataset (which imports pandas), boto3 and alembic cost 0.1-0.8 s each to import; only the
commands that use them import them (a publication, an S3 site, ``segrep init``). Checked in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
    url = f"sqlite:///{tmp_path}/catalog.db"
    setup = (
        "from segrep import Catalog, apply_definitions, load_definitions, upgrade\n"
        f"catalog = Catalog({url!r}); upgrade(catalog); apply_definitions(catalog, load_definitions({str(config)!r}))\n"
    )
    subprocess.run([sys.executable, "-c", setup], check=True)
    for args in (["status", "t"], ["status", "s", "--json"], ["segments", "t"], ["round", "s"]):
        code = (
            "from segrep.cli.main import main\n"
            f"try:\n    main([{'--config'!r}, {str(config)!r}, {'--catalog'!r}, {url!r}, *{args!r}])\n"
            "except SystemExit as exit:\n    assert exit.code in (0, None), exit.code\n"
        )
        assert _imported(code, ("pandas",)) == [], args
