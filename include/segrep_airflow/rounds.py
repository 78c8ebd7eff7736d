"""What the replication DAG's tasks take from Airflow's context: where a run's round ends, and the planned
round passed between its tasks as a typed XCom.

The round itself is the package's (``segrep.replication.orchestrator``): a task runs its step, logs the typed
result and raises on its problems. Nothing here imports Airflow: the tasks hand in what they read from their
context (the task instance, for :func:`planned_round`).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the DAG file imports this module at parse time: the package is imported by the tasks
    from segrep.replication.orchestrator import PlannedRound

MANUAL = "manual"
ASSET_TRIGGERED = "asset_triggered"
ROUND_TASK = "round"  # plans the round; runs a small one whole, or branches to the mapped path
PLAN_KEY = "planned_round"  # the round task's XComs (its return value is the branch it chose)
VIEW_KEY = "round_view"  # a small round's view (RoundView.to_xcom), pushed when it ran whole in the task


class XComReader(Protocol):
    """The part of Airflow's task instance :func:`planned_round` uses."""

    def xcom_pull(self, task_ids: str, key: str = ...) -> Any: ...


def planned_round(ti: XComReader) -> PlannedRound | None:
    """The round task's planned round, or None if it did not get as far as planning."""
    from segrep.replication.orchestrator import PlannedRound

    doc = ti.xcom_pull(task_ids=ROUND_TASK, key=PLAN_KEY)
    return None if not doc else PlannedRound.from_dict(doc)


def required_plan(ti: XComReader, table: str) -> PlannedRound:
    """The planned round, or the error a task raises when the round task did not plan."""
    planned = planned_round(ti)
    if planned is None:
        raise RuntimeError(
            f"round of {table}: the task round did not plan, so there is no round to run or report "
            "(see its log; clear it to run the round again)"
        )
    return planned


def retried(ti: object) -> bool:
    """Whether this task attempt is a retry: Airflow's after a failure, or an operator's "Clear" of the failed
    task. A retry is the attempt someone asked for, so a target's back-off does not hold it back (the acks
    still count: only what the target lacks is copied)."""
    return int(getattr(ti, "try_number", None) or 1) > 1


def run_kind(run_type: object) -> str:
    """A run type as its value ("manual", "scheduled", ...): the task context's DagRunType is a plain
    ``(str, Enum)``, whose ``str()`` is "DagRunType.MANUAL"."""
    return str(getattr(run_type, "value", run_type or ""))


def round_end(run_type: object, run_after: datetime | None, interval_end: datetime | None) -> datetime | None:
    """Where a run's round ends: a manual run (the Trigger button, ``airflow dags trigger``, the REST API,
    ``dag.test``) replicates up to the moment it was triggered (its ``run_after``), not to the end of the
    last whole interval before it; an asset-triggered run (``schedule: on_write``) at the moment it plans, after
    its spacing wait, so it covers every write committed until then; scheduled and backfill runs end at their
    data interval's end. None: now (``plan_round`` never looks past the present either way)."""
    kind = run_kind(run_type)
    if kind == ASSET_TRIGGERED:
        return None
    if kind == MANUAL and run_after is not None:
        return run_after
    return interval_end
