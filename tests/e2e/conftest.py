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
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ORDERS_YAML, Env, make_env

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
BIN = Path(sys.executable).parent
AIRFLOW = str(BIN / "airflow")
EVENTS_DAG = "segrep_replicate_events"
PK_SORT = [("tenant", "ascending"), ("seq", "ascending")]

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
}
os.environ.update(AIRFLOW_ENV)
os.environ["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"  # spark-submit and airflow of this venv


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    """The session's Airflow home with a migrated metadata database (``airflow db migrate``, once per process)."""
    if _AIRFLOW_IMPORTED_FIRST:
        pytest.fail(
            "airflow was imported before tests/e2e/conftest.py could give it a throw-away AIRFLOW_HOME (it reads "
            "its configuration on import): collect tests/e2e before any test module that imports airflow at the "
            "top (pytest collects tests/e2e first by default)."
        )
    proc = subprocess.run([AIRFLOW, "db", "migrate"], capture_output=True, text=True, env=os.environ.copy())
    assert proc.returncode == 0, f"airflow db migrate failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return _HOME


def events_yaml(policy: dict[str, Any] | None = None, *, tables: tuple[str, ...] = ("orders", "events")) -> str:
    """ORDERS_YAML (table `events` replicates primary -> dr, edge) with a replication policy for `events`."""
    doc = yaml.safe_load(ORDERS_YAML)
    doc["tables"] = {name: body for name, body in doc["tables"].items() if name in tables}
    if policy is not None:
        doc["tables"]["events"]["policy"] = policy
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.fixture
def segrep_env(airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Env]]:
    """``segrep_env(policy=..., tables=...)``: definitions + migrated, applied catalog in tmp_path, exported as
    SEGREP_CONFIG / SEGREP_CATALOG_URL for the DAG file and its tasks."""
    made: list[Env] = []

    def make(policy: dict[str, Any] | None = None, *, tables: tuple[str, ...] = ("orders", "events")) -> Env:
        assert not made, "one segrep environment per test"
        env = make_env(tmp_path, f"sqlite:///{tmp_path / 'catalog.db'}", events_yaml(policy, tables=tables))
        monkeypatch.setenv("SEGREP_CONFIG", str(env.config))
        monkeypatch.setenv("SEGREP_CATALOG_URL", env.url)
        for var in ("SEGREP_SPARK_PY_FILES", "SEGREP_SPARK_PYTHON", "SEGREP_SPARK_JOBS", "SEGREP_SPARK_CONN_ID"):
            monkeypatch.delenv(var, raising=False)
        made.append(env)
        return env

    yield make
    for env in made:
        env.catalog.dispose()


def load_dagbag(dags: Path = DAGS) -> Any:
    """Parse the DAG folder now (after SEGREP_CONFIG is set) and insist it imports cleanly."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(dags))
    assert bag.import_errors == {}, bag.import_errors
    return bag


def load_dag(dag_id: str = EVENTS_DAG) -> Any:
    dag = load_dagbag().get_dag(dag_id)
    assert dag is not None, f"{dag_id} not in the DagBag"
    return dag


# -- data and catalog helpers -----------------------------------------------------------------------------


def events_batch(keys: list[int], tag: str) -> Any:
    import pyarrow as pa

    return pa.table(
        {
            "tenant": [f"t{k % 5}" if k % 2 else f"a{k % 3}" for k in keys],  # both partitions (split at "m")
            "seq": keys,
            "payload": [f"{tag}-{k}" for k in keys],
            "at": pa.array([None] * len(keys), pa.timestamp("us")),
        }
    )


Batches = list[tuple[range, str]]  # (keys, tag) of each events_batch, in the order they were written


def replay_rows(batches: Batches) -> dict[tuple[str, int], str]:
    """An independent replay of the writes: last writer wins per key, in the order the batches were written,
    with plain dictionaries (no catalog, no segment, no reader). What every site must read in the end."""
    rows: dict[tuple[str, int], str] = {}
    for keys, tag in batches:
        batch = events_batch(list(keys), tag)
        for tenant, seq, payload in zip(*(batch[c].to_pylist() for c in ("tenant", "seq", "payload")), strict=True):
            rows[(tenant, seq)] = payload
    return rows


def rows_of(table: Any) -> dict[tuple[str, int], str]:
    """An events table read back, as replay_rows gives it: (tenant, seq) -> payload."""
    return {(t, s): p for t, s, p in zip(*(table[c].to_pylist() for c in ("tenant", "seq", "payload")), strict=True)}


def set_leader(env: Env, site: str) -> None:
    """Move every partition's leadership to ``site`` (a failover made directly in the catalog)."""
    from sqlalchemy import select

    from segrep.catalog import models as m

    site_id = env.defs.site(site).site_id
    with env.catalog.write() as s:
        for part in s.scalars(select(m.Partition)):
            placement = s.scalars(
                select(m.Placement).where(m.Placement.partition_id == part.partition_id, m.Placement.site_id == site_id)
            ).one()
            part.leader_placement_id = placement.placement_id
            part.epoch += 1


def read_sorted(env: Env, site: str | None = None) -> Any:
    from segrep.data.reader import read_table

    return read_table(env.catalog, "events", site).sort_by(PK_SORT)


def rounds(env: Env) -> list[Any]:
    """The table's rounds, oldest interval first."""
    from sqlalchemy import select

    from segrep.catalog import models as m

    with env.catalog.read() as s:
        return list(s.scalars(select(m.Round).order_by(m.Round.interval_end_us)))


def ti_states(dag_run: Any) -> dict[tuple[str, int], str | None]:
    return {(ti.task_id, ti.map_index): (str(ti.state) if ti.state else None) for ti in dag_run.get_task_instances()}


def wait_until(deadline: float) -> None:
    """Sleep until the wall clock reaches ``deadline`` (epoch seconds)."""
    while (left := deadline - time.time()) > 0:
        time.sleep(min(left, 0.2))
