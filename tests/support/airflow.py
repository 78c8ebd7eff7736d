"""Helpers of the DAG tests (tests/dags): the DAG folder, events batches and their replay, task states.

Nothing here imports Airflow at import time: tests/dags/conftest.py must give Airflow its throw-away home
before the first import (see there).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tests.support.env import ORDERS_YAML, Env

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
BIN = Path(sys.executable).parent
AIRFLOW = str(BIN / "airflow")
EVENTS_DAG = "segrep_replicate_events"
PK_SORT = [("tenant", "ascending"), ("seq", "ascending")]


def events_yaml(policy: dict[str, Any] | None = None, *, tables: tuple[str, ...] = ("orders", "events")) -> str:
    """ORDERS_YAML (table `events` replicates primary -> dr, edge) with a replication policy for `events`."""
    doc = yaml.safe_load(ORDERS_YAML)
    doc["tables"] = {name: body for name, body in doc["tables"].items() if name in tables}
    if policy is not None:
        doc["tables"]["events"]["policy"] = policy
    return yaml.safe_dump(doc, sort_keys=False)


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


def edge_rejoins(env: Env) -> None:
    """edge leaves events (no data there yet), the table gets data and a round, then edge is a replica again:
    JOINING, waiting for a bootstrap (the bootstrap DAG's tests)."""
    from segrep.catalog.apply import apply_definitions
    from segrep.data.writer import write_batch
    from segrep.replication.orchestrator import run_round
    from tests.support.rounds import no_spark

    env.config.write_text(env.config.read_text().replace("replicas:\n    - dr\n    - edge", "replicas:\n    - dr"))
    apply_definitions(env.catalog, env.defs)  # edge leaves (no data there yet: placements REMOVED)
    for keys, tag in ((range(0, 60), "a"), (range(40, 90), "b")):
        write_batch(env.catalog, "events", events_batch(list(keys), tag))
    run_round(env.catalog, env.defs, "events", submit=no_spark)
    env.config.write_text(env.config.read_text().replace("replicas:\n    - dr", "replicas:\n    - dr\n    - edge"))
    apply_definitions(env.catalog, env.defs)  # edge is back: JOINING, waiting for a bootstrap


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


def postgres_dag_env(pg_server: str, tmp_path: Path, monkeypatch: Any, yaml_text: str) -> Any:
    """The body of a DAG test's PostgreSQL environment fixture: the definitions and a migrated, applied catalog
    in a fresh schema, exported for the DAG file and its tasks as SEGREP_CONFIG / SEGREP_CATALOG_URL (as
    tests/dags/conftest.py's segrep_env does on SQLite), with no Spark override from the environment."""
    from tests.support.env import make_env, pg_schema_url

    for url in pg_schema_url(pg_server):
        env = make_env(tmp_path, url, yaml_text)
        monkeypatch.setenv("SEGREP_CONFIG", str(env.config))
        monkeypatch.setenv("SEGREP_CATALOG_URL", env.url)
        for var in ("SEGREP_SPARK_PY_FILES", "SEGREP_SPARK_PYTHON", "SEGREP_SPARK_JOBS", "SEGREP_SPARK_CONN_ID"):
            monkeypatch.delenv(var, raising=False)
        yield env
        env.catalog.dispose()


def airflow_rows(dag_id: str) -> tuple[frozenset[str], frozenset[tuple[str, str, int]]]:
    """The DAG runs (ids) and task instances (run, task, map index) of ``dag_id`` in Airflow's database."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        runs = frozenset(session.scalars(select(DagRun.run_id).where(DagRun.dag_id == dag_id)))
        tis = session.execute(
            select(TaskInstance.run_id, TaskInstance.task_id, TaskInstance.map_index).where(
                TaskInstance.dag_id == dag_id
            )
        )
        return runs, frozenset((str(r), str(t), int(i)) for r, t, i in tis)


def made_nothing(before: tuple[frozenset[str], frozenset[tuple[str, str, int]]], dag_id: str) -> bool:
    """No run and no task instance of ``dag_id`` appeared since ``before`` (``airflow_rows``). Not equality:
    ``dag.test`` deletes an earlier run it would collide with (one without a logical date, which other tests
    of the worker's Airflow database may have left) before it validates the conf."""
    runs, tis = airflow_rows(dag_id)
    return runs <= before[0] and tis <= before[1]
