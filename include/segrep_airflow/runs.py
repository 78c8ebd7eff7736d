"""What kind of DAG run a task is in, where that changes what the task may do.

Why: with ``catchup=False`` Airflow still creates, the moment a DAG is unpaused, the run of the most recent
schedule point that has passed (for ``@daily``, today's midnight run at 15:48). The Trigger button's "unpause
on trigger" therefore starts a real compaction and GC just before the dry run the user asked for. A
scheduled maintenance run that starts long after its schedule point is that run (or one a stopped scheduler
left behind): it does nothing and says so; the next scheduled run, or a triggered one, does the work.
"""

from __future__ import annotations

from datetime import datetime, timedelta

SCHEDULED = "scheduled"
LATE_AFTER = timedelta(minutes=15)


def late_scheduled_run(run_type: object, run_after: datetime | None, now: datetime) -> str | None:
    """Why a scheduled run should not act (it started more than :data:`LATE_AFTER` after its schedule point),
    or None for any run that should (manual runs, backfills, scheduled runs on time)."""
    kind = str(getattr(run_type, "value", run_type or ""))  # the context's DagRunType is a (str, Enum)
    if kind != SCHEDULED or run_after is None:
        return None
    late = now - run_after
    if late <= LATE_AFTER:
        return None
    return (
        f"this scheduled run was due at {run_after.isoformat()} and started {int(late.total_seconds() // 60)} min "
        "late (the DAG was just unpaused, or the scheduler was down): it does nothing; the next scheduled run "
        "does the work, or trigger the DAG to run now (its form offers a dry run)"
    )
