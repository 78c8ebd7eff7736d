"""End-to-end set-up: a throw-away Airflow home for the whole session and one segrep environment per test.

Airflow reads its configuration (AIRFLOW_HOME, the metadata database) when it is first imported, so the
environment is set here, when pytest imports this conftest: before any e2e module is collected and before
anything in this package imports Airflow (the modules import it lazily, inside fixtures and tests). The home
comes from ``mkdtemp``, so each pytest-xdist worker (a separate process) gets its own home and database.

Each test then gets its own definitions file and catalog (SEGREP_CONFIG, SEGREP_CATALOG_URL) and loads the
DagBag after setting them: the DAG file reads the definitions at parse time.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.airflow import AIRFLOW, BIN, DAGS, events_yaml
from tests.support.airflow_services import Services
from tests.support.env import Env, make_env

_AIRFLOW_IMPORTED_FIRST = "airflow" in sys.modules
_HOME = Path(tempfile.mkdtemp(prefix="segrep-e2e-airflow-"))
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
AIRFLOW_ENV = {
    "AIRFLOW_HOME": str(_HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_HOME / 'airflow.db'}",
    # The api-server and the scheduler of the backfill test must sign and check the same task tokens.
    "AIRFLOW__API_AUTH__JWT_SECRET": "segrep-e2e-tests-only-" + "0123456789abcdef" * 4,
    "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type": "spark", "host": "local[*]"}',
    # Each test parses the DAGs against its own definitions (other tables, other sites). Airflow keeps a DAG's
    # stored serialization for 30 s by default, so a test's trigger could be checked against the forms of the
    # test before it in the same worker.
    "AIRFLOW__CORE__MIN_SERIALIZED_DAG_UPDATE_INTERVAL": "0",
}
os.environ.update(AIRFLOW_ENV)
os.environ["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"  # spark-submit and airflow of this venv


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    """The session's Airflow home with a migrated metadata database (``airflow db migrate``, once per process)."""
    if _AIRFLOW_IMPORTED_FIRST:
        pytest.fail(
            "airflow was imported before tests/dags/conftest.py could give it a throw-away AIRFLOW_HOME (it reads "
            "its configuration on import): no test module collected before tests/dags may import airflow at the "
            "top (they import it inside fixtures and tests)."
        )
    proc = subprocess.run([AIRFLOW, "db", "migrate"], capture_output=True, text=True, env=os.environ.copy())
    assert proc.returncode == 0, f"airflow db migrate failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return _HOME


@pytest.fixture
def segrep_env(airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Env]]:
    """``segrep_env(policy=..., tables=...)`` (or ``segrep_env(yaml_text=...)``): definitions + migrated, applied
    catalog in tmp_path, exported as SEGREP_CONFIG / SEGREP_CATALOG_URL for the DAG file and its tasks."""
    made: list[Env] = []

    def make(
        policy: dict[str, Any] | None = None,
        *,
        tables: tuple[str, ...] = ("orders", "events"),
        yaml_text: str | None = None,
    ) -> Env:
        assert not made, "one segrep environment per test"
        text = yaml_text if yaml_text is not None else events_yaml(policy, tables=tables)
        env = make_env(tmp_path, f"sqlite:///{tmp_path / 'catalog.db'}", text)
        monkeypatch.setenv("SEGREP_CONFIG", str(env.config))
        monkeypatch.setenv("SEGREP_CATALOG_URL", env.url)
        for var in ("SEGREP_SPARK_PY_FILES", "SEGREP_SPARK_PYTHON", "SEGREP_SPARK_JOBS", "SEGREP_SPARK_CONN_ID"):
            monkeypatch.delenv(var, raising=False)
        made.append(env)
        return env

    yield make
    for env in made:
        env.catalog.dispose()


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    """Airflow's api-server and scheduler for this test (started by the test, stopped here)."""
    svc = Services(tmp_path)
    try:
        yield svc
    finally:
        svc.stop()
