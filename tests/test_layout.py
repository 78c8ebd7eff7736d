"""Dependency direction (DESIGN section 3): dags/, plugins/, spark_jobs/ -> segrep, never the reverse; the
package never imports Airflow (only the glue package segrep_airflow does), so Spark executors and the CLI
run without it. The tests' own layout: they share code only through tests/support and fixtures only through
conftest.py files, each fixture defined once."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def test_the_package_never_imports_airflow_or_the_dags() -> None:
    offenders = {
        str(p.relative_to(ROOT)): sorted(_imports(p) & {"airflow", "segrep_airflow", "dags"})
        for p in (ROOT / "include" / "segrep").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_spark_jobs_import_only_the_package() -> None:
    for p in (ROOT / "spark_jobs").glob("*.py"):
        assert "airflow" not in _imports(p), p


def _imported_modules(path: Path) -> list[str]:
    """Every module ``path`` imports by absolute name (``from tests import x`` counts as ``tests.x``)."""
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [f"{node.module}.{alias.name}" for alias in node.names] if node.module == "tests" else [node.module]
    return out


def test_no_test_module_imports_another() -> None:
    """Tests share code through tests/support only, and fixtures through conftest.py files, which pytest
    loads itself: a test module (or conftest) imported by another is imported a second time under another
    name, runs its set-up twice, and ties one test's changes to another's."""
    offenders = {
        str(p.relative_to(ROOT)): bad
        for p in (ROOT / "tests").rglob("*.py")
        if (bad := [n for n in _imported_modules(p) if n.startswith("tests.") and not n.startswith("tests.support")])
    }
    assert offenders == {}


# A fixture a conftest defines as a default that test modules override (pytest's own mechanism).
OVERRIDE_POINTS = {"pg_definitions"}


def test_each_fixture_is_defined_once() -> None:
    """A fixture name defined in two files is two fixtures that drift apart: each is defined once (a
    conftest.py at the level that uses it), except the override points above."""
    where: dict[str, list[str]] = {}
    for p in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.FunctionDef) and any("fixture" in ast.unparse(d) for d in node.decorator_list):
                where.setdefault(node.name, []).append(str(p.relative_to(ROOT)))
    twice = {name: files for name, files in where.items() if len(files) > 1 and name not in OVERRIDE_POINTS}
    assert twice == {}
