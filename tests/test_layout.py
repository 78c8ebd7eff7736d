"""Dependency direction (DESIGN section 3): dags/, plugins/, spark_jobs/ -> segrep, never the reverse; the
package never imports Airflow (only the glue package segrep_airflow does), so Spark executors and the CLI
run without it."""

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
