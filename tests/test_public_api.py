"""The curated public API: every name in ``segrep.__all__`` resolves, and importing the package is cheap."""

from __future__ import annotations

import subprocess
import sys

import segrep


def test_every_public_name_resolves_to_its_defining_module() -> None:
    for name in segrep.__all__:
        value = getattr(segrep, name)
        assert value is not None, name
    assert segrep.run_round.__module__ == "segrep.replication.orchestrator"
    assert segrep.Catalog.__module__ == "segrep.catalog.engine"


def test_all_lists_exactly_the_exports() -> None:
    assert sorted(segrep.__all__) == sorted(["__version__", *segrep._EXPORTS])


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        segrep.no_such_name  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("segrep.no_such_name resolved")


def test_import_segrep_loads_neither_sqlalchemy_nor_pyarrow() -> None:
    """Spark executors and the CLI import sub-packages; the package itself must not pull in the world."""
    code = "import sys, segrep; print(sorted(m for m in ('sqlalchemy', 'pyarrow', 'airflow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
