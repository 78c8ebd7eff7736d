"""Airflow's metadata for the page's DAG-state tests: a replication DAG as the dag-processor records it
(paused or not), its runs and their task instances, written through Airflow's ORM into the test process's
Airflow database, and removed again afterwards (the database is shared with the other tests of the worker).

The page reads these rows exactly as it reads a scheduler's: ``DagModel.is_paused``, the newest ``DagRun``
per DAG, the failed ``TaskInstance`` rows of a failed run. Airflow is imported inside the methods (see
tests/plugins/conftest.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

BUNDLE = "segrep-page-tests"
# Tables of their own for the DAG-state tests: their DAG ids are no other test's (tests/dags runs
# segrep_replicate_events and _orders in the same Airflow database when the whole suite runs in one worker).
DAG_TABLES = ("pgt_failing", "pgt_paused", "pgt_missing")


class AirflowRows:
    """What one test wrote, by DAG id: ``cleanup`` deletes the DAGs' task instances, runs and DAG rows."""

    def __init__(self) -> None:
        self.dag_ids: set[str] = set()

    def dag(self, dag_id: str, *, paused: bool = False) -> None:
        from airflow.models.dag import DagModel
        from airflow.models.dagbundle import DagBundleModel
        from airflow.utils.session import create_session

        with create_session() as s:
            if s.get(DagBundleModel, BUNDLE) is None:
                s.add(DagBundleModel(name=BUNDLE))
                s.flush()
            s.add(
                DagModel(
                    dag_id=dag_id,
                    bundle_name=BUNDLE,
                    is_paused=paused,
                    is_stale=False,
                    max_active_tasks=16,
                    max_active_runs=1,
                    max_consecutive_failed_dag_runs=0,
                    has_task_concurrency_limits=False,
                )
            )
        self.dag_ids.add(dag_id)

    def run(
        self, dag_id: str, run_id: str, state: str, minutes_ago: float, failed: tuple[tuple[str, int], ...] = ()
    ) -> None:
        """A scheduled run ``minutes_ago``, with a failed task instance per ``failed`` (task id, map index;
        ending in that order) and a ``report`` that did not run (upstream_failed), as a failed round leaves them."""
        from airflow.models.dagrun import DagRun
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session

        when = datetime.now(UTC) - timedelta(minutes=minutes_ago)
        with create_session() as s:
            s.add(
                DagRun(
                    dag_id=dag_id,
                    run_id=run_id,
                    run_type="scheduled",
                    logical_date=when,
                    run_after=when,
                    start_date=when,
                    state=state,
                )
            )
            s.flush()
            rows: list[dict[str, Any]] = [  # failed in this order, a second apart
                _ti(dag_id, run_id, task_id, map_index, "failed", when + timedelta(seconds=k))
                for k, (task_id, map_index) in enumerate(failed)
            ]
            if failed:
                rows.append(_ti(dag_id, run_id, "report", -1, "upstream_failed", when + timedelta(seconds=len(failed))))
            if rows:
                s.execute(TaskInstance.__table__.insert(), rows)
        self.dag_ids.add(dag_id)

    def cleanup(self) -> None:
        from airflow.models.dag import DagModel
        from airflow.models.dagrun import DagRun
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session
        from sqlalchemy import delete

        ids = sorted(self.dag_ids)
        with create_session() as s:
            s.execute(delete(TaskInstance).where(TaskInstance.dag_id.in_(ids)))
            s.execute(delete(DagRun).where(DagRun.dag_id.in_(ids)))
            s.execute(delete(DagModel).where(DagModel.dag_id.in_(ids)))


def _ti(dag_id: str, run_id: str, task_id: str, map_index: int, state: str, when: datetime) -> dict[str, Any]:
    import uuid

    return {
        "id": uuid.uuid4(),
        "dag_id": dag_id,
        "run_id": run_id,
        "task_id": task_id,
        "map_index": map_index,
        "state": state,
        "try_number": 1,
        "pool": "default_pool",
        "pool_slots": 1,
        "start_date": when,
        "end_date": when,
    }
