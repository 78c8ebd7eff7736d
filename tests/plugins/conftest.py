"""The operator page's tests: an Airflow home for the in-process app tests, users and their tokens, and a
segrep environment with lag.

Airflow reads its home when first imported. ``tests/dags/conftest.py`` gives a run a throw-away home when it
is collected (before this folder, in any whole-suite run); when it was not (this folder run alone) this file
does the same, so no test ever touches a developer's ``~/airflow``. Nothing here imports Airflow at import
time; the plugin package (``plugins/``) is put on ``sys.path`` as the api-server does.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.airflow import AIRFLOW
from tests.support.airflow_rows import DAG_TABLES, AirflowRows
from tests.support.env import Env, make_env
from tests.support.plugin_page import JWT_SECRET, PLUGINS, RPO_YAML, USERS, Tokens, users

if str(PLUGINS) not in sys.path:
    sys.path.append(str(PLUGINS))
if "tests.dags.conftest" not in sys.modules:
    _home = Path(tempfile.mkdtemp(prefix="segrep-plugin-airflow-"))
    atexit.register(shutil.rmtree, _home, ignore_errors=True)
    os.environ.update(
        {
            "AIRFLOW_HOME": str(_home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_home / 'airflow.db'}",
            "AIRFLOW__API_AUTH__JWT_SECRET": JWT_SECRET,
        }
    )


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """Airflow's metadata database, migrated (the auth manager checks token revocations there)."""
    proc = subprocess.run([AIRFLOW, "db", "migrate"], capture_output=True, text=True, env=os.environ.copy())
    assert proc.returncode == 0, f"airflow db migrate failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.fixture
def tokens(airflow_db: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Tokens]:
    """Airflow's SimpleAuthManager with three users, initialised as the api-server does, and a JWT for each."""
    monkeypatch.setenv(
        "AIRFLOW__CORE__AUTH_MANAGER", "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
    )
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", USERS)
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(tmp_path / "passwords.json"))
    from airflow.api_fastapi.app import init_auth_manager, purge_cached_app
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    manager = init_auth_manager()
    yield Tokens(*(manager.generate_jwt(SimpleAuthManagerUser(username=n, role=r or "")) for n, r in users()))
    purge_cached_app()


@pytest.fixture
def lag_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    """`events` replicated once to dr and edge, then written again (2 segments pending at each); `orders`
    written, never replicated. SEGREP_CATALOG_URL names the catalog, as for the DAGs."""
    from segrep.data.writer import write_batch
    from segrep.replication.orchestrator import run_round
    from tests.support.rounds import no_spark
    from tests.support.tables import TABLE, batch, orders

    (tmp_path / "segrep").mkdir()
    env = make_env(tmp_path / "segrep", f"sqlite:///{tmp_path / 'catalog.db'}", RPO_YAML)
    monkeypatch.setenv("SEGREP_CATALOG_URL", env.url)
    monkeypatch.setenv("SEGREP_CONFIG", str(env.config))
    write_batch(env.catalog, TABLE, batch(range(20), "a"))
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).status == "ok"
    write_batch(env.catalog, TABLE, batch(range(20, 30), "b"))
    write_batch(env.catalog, "orders", orders(list(range(1, 6))))
    return env


@pytest.fixture
def dag_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    """Three tables shaped like `events` (replicated primary -> dr, edge; RPO 15 min), the first replicated
    once (its last round ok); each table's DAG is set up in Airflow by the test (``airflow_rows``)."""
    import yaml

    from segrep.data.writer import write_batch
    from segrep.replication.orchestrator import run_round
    from tests.support.rounds import no_spark
    from tests.support.tables import batch

    doc = yaml.safe_load(RPO_YAML)
    doc["tables"] = {name: doc["tables"]["events"] for name in DAG_TABLES}
    (tmp_path / "segrep").mkdir()
    env = make_env(tmp_path / "segrep", f"sqlite:///{tmp_path / 'catalog.db'}", yaml.safe_dump(doc))
    monkeypatch.setenv("SEGREP_CATALOG_URL", env.url)
    monkeypatch.setenv("SEGREP_CONFIG", str(env.config))
    write_batch(env.catalog, DAG_TABLES[0], batch(range(20), "a"))
    assert run_round(env.catalog, env.defs, DAG_TABLES[0], submit=no_spark).status == "ok"
    return env


@pytest.fixture
def airflow_rows(airflow_db: None) -> Iterator[AirflowRows]:
    """DAGs, runs and task instances a test writes into Airflow's metadata database; deleted afterwards."""
    rows = AirflowRows()
    try:
        yield rows
    finally:
        rows.cleanup()
