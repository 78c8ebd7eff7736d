"""Golden spark-submit command lines (tests/dags/expected/): a command with the machine's paths and the run's
own values replaced by placeholders, compared one argument per line with its expected file; with
SEGREP_UPDATE_EXPECTED=1 the file is rewritten instead (a deliberate change)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.support.airflow import REPO

EXPECTED = REPO / "tests" / "dags" / "expected"
UPDATE_ENV = "SEGREP_UPDATE_EXPECTED"
PLACEHOLDERS = (
    "# Placeholders: {VENV_BIN} = the directory of the test interpreter, {PYTHON} = the interpreter itself,",
    "# {REPO} = the repository root, {ENV_ROOT} = the test's segrep environment (tmp_path).",
)


def normalise(args: Sequence[str], replacements: Mapping[str, str]) -> list[str]:
    """Each argument with every key of ``replacements`` replaced by its placeholder, in the mapping's order."""
    out = []
    for arg in args:
        for real, placeholder in replacements.items():
            arg = arg.replace(real, placeholder)
        out.append(arg)
    return out


def machine_paths(env_root: Path) -> dict[str, str]:
    """This machine's paths in a command line, the interpreter before its directory."""
    return {
        sys.executable: "{PYTHON}",
        str(Path(sys.executable).parent): "{VENV_BIN}",
        str(env_root): "{ENV_ROOT}",
        str(REPO): "{REPO}",
    }


def assert_matches_expected(got: list[str], expected_file: Path, header: Sequence[str], update_hint: str) -> None:
    """``got`` (normalised) equals the expected file's arguments (its lines but comments and blank ones)."""
    if os.environ.get(UPDATE_ENV) == "1":  # a deliberate change: rewrite the expectation
        expected_file.parent.mkdir(parents=True, exist_ok=True)
        expected_file.write_text("\n".join([*header, *got]) + "\n")
    assert expected_file.is_file(), f"no expected command {expected_file.name} ({update_hint} writes it)"
    expected = [line for line in expected_file.read_text().splitlines() if line and not line.startswith("#")]
    assert got == expected, (
        f"the command line changed ({update_hint} rewrites {expected_file.relative_to(REPO)}):\n" + "\n".join(got)
    )
