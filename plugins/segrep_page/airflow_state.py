"""What Airflow knows of each table's replication DAG: whether it is paused, its newest run and its newest
finished run, and the tasks that failed in them.

The catalog says what the last *recorded* round did; a DAG that is paused, or whose runs fail before a round
is recorded, leaves that record looking fine while nothing moves. So the page reads Airflow's own metadata
too (the plugin runs inside the api-server, on Airflow's ORM session), in three queries whatever the number
of tables. Read-only. When that read fails the page still shows segrep's numbers, with the DAG state
"unknown" (:func:`read_states` returns None and logs why).

Airflow is imported inside the functions, as in ``access``: every Airflow component loads the plugin module.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import func, select

log = logging.getLogger(__name__)

FAILED = "failed"
FINISHED = ("success", FAILED)


class Health(StrEnum):
    """One word for a DAG's state, worst first: what the row of its table says."""

    NOT_IN_AIRFLOW = "not in Airflow"  # no such DAG, or its file no longer defines it: nothing runs
    PAUSED = "paused"
    FAILED = "failed"  # the newest finished run failed
    UNKNOWN = "unknown"  # Airflow's metadata could not be read
    NO_RUNS = "no runs"
    RUNNING = "running"  # a first run under way, none finished
    SUCCESS = "success"  # the newest finished run succeeded

    @property
    def problem(self) -> bool:
        """Replication is not moving, whatever the last recorded round says."""
        return self in (Health.NOT_IN_AIRFLOW, Health.PAUSED, Health.FAILED)


@dataclass(frozen=True)
class FailedTask:
    task_id: str
    map_index: int  # -1: not a mapped task


@dataclass(frozen=True)
class Run:
    run_id: str
    state: str  # Airflow's run state: queued, running, success, failed
    run_after_us: int
    failed_tasks: tuple[FailedTask, ...] = ()


@dataclass(frozen=True)
class DagState:
    dag_id: str
    in_airflow: bool
    paused: bool
    latest: Run | None  # the newest run (by run_after), in any state
    last_finished: Run | None  # the newest run that finished

    @property
    def health(self) -> Health:
        if not self.in_airflow:
            return Health.NOT_IN_AIRFLOW
        if self.paused:
            return Health.PAUSED
        if self.last_finished is not None:
            return Health.FAILED if self.last_finished.state == FAILED else Health.SUCCESS
        return Health.NO_RUNS if self.latest is None else Health.RUNNING


def read_states(dag_ids: Collection[str]) -> dict[str, DagState] | None:
    """Each DAG's state; None (logged) when Airflow's metadata cannot be read."""
    if not dag_ids:
        return {}
    try:
        return _read(sorted(dag_ids))
    except Exception as exc:  # any failure of Airflow's database or ORM: the page shows "unknown", not an error
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        log.warning("segrep page: Airflow's DAG states cannot be read: %s: %s", type(exc).__name__, first)
        return None


def _read(dag_ids: list[str]) -> dict[str, DagState]:
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.utils.session import create_session

    with create_session() as s:
        models = {
            dag_id: (bool(paused), not stale)
            for dag_id, paused, stale in s.execute(
                select(DagModel.dag_id, DagModel.is_paused, DagModel.is_stale).where(DagModel.dag_id.in_(dag_ids))
            )
        }
        latest = _newest_runs(s, DagRun, dag_ids, None)
        finished = _newest_runs(s, DagRun, dag_ids, FINISHED)
        failed = {(r[0], r[1]) for r in [*latest.values(), *finished.values()] if r[2] == FAILED}
        tasks: dict[tuple[str, str], list[FailedTask]] = {}
        if failed:
            rows = s.execute(
                select(TI.dag_id, TI.run_id, TI.task_id, TI.map_index)
                .where(
                    TI.dag_id.in_(sorted({d for d, _ in failed})),
                    TI.run_id.in_(sorted({r for _, r in failed})),
                    TI.state == FAILED,
                )
                .order_by(TI.end_date, TI.task_id, TI.map_index)  # the first to fail first
            )
            for dag_id, run_id, task_id, map_index in rows:
                if (dag_id, run_id) in failed:
                    tasks.setdefault((dag_id, run_id), []).append(FailedTask(task_id, int(map_index)))

    def run(row: tuple[Any, ...] | None) -> Run | None:
        if row is None:
            return None
        dag_id, run_id, state, run_after = row
        return Run(run_id, str(state), _us(run_after), tuple(tasks.get((dag_id, run_id), ())))

    return {
        dag_id: DagState(
            dag_id,
            in_airflow=models.get(dag_id, (False, False))[1],
            paused=models.get(dag_id, (False, False))[0],
            latest=run(latest.get(dag_id)),
            last_finished=run(finished.get(dag_id)),
        )
        for dag_id in dag_ids
    }


def _newest_runs(s: Any, dag_run: Any, dag_ids: list[str], states: tuple[str, ...] | None) -> dict[str, Any]:
    """Per DAG its newest run (by run_after, then id) among ``states`` (None: any): one windowed query."""
    rank = func.row_number().over(partition_by=dag_run.dag_id, order_by=(dag_run.run_after.desc(), dag_run.id.desc()))
    query = select(dag_run.dag_id, dag_run.run_id, dag_run.state, dag_run.run_after, rank.label("rank")).where(
        dag_run.dag_id.in_(dag_ids)
    )
    if states is not None:
        query = query.where(dag_run.state.in_(states))
    ranked = query.subquery()
    rows = s.execute(
        select(ranked.c.dag_id, ranked.c.run_id, ranked.c.state, ranked.c.run_after).where(ranked.c.rank == 1)
    )
    return {row[0]: tuple(row) for row in rows}


def _us(when: datetime) -> int:
    return int(when.timestamp() * 1_000_000)
