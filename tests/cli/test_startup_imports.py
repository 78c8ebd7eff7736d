"""What a ``segrep`` process imports before its command runs: every command and every DAG task starts one.

pyiceberg, pyarrow.dataset (which imports pandas), boto3 and alembic cost 0.1-0.8 s each to import; only the
commands that use them import them (a publication, an S3 site, ``segrep init``). Checked in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("pyiceberg", "pyarrow.dataset", "pandas", "boto3", "alembic", "pyspark")


def _imported(code: str) -> list[str]:
    probe = f"import json, sys\n{code}\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
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
