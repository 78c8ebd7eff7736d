"""
### segrep watchdog: every replica against its RPO, every minute, whether rounds run or not

One task, **check**, reads every table's replicas from segrep's catalog (`segrep status`'s numbers: the lag
measured from now; a replica that never had a round is behind from its start) and **fails** when any is past
its table's `policy.rpo`, naming each table and site with its lag, objective and why (no round finished for
longer than the objective: the replication DAG paused, its runs failing, the scheduler down; never
replicated; backing off; what it lacks). Otherwise it succeeds and logs every replica it checked.

It does not depend on the replication DAGs: a paused `segrep_replicate_<table>` stops the rounds, not this
check. On failure the task calls the alert hook: the callables named by `SEGREP_ALERT_CALLBACK` (the
workers' environment) or the Airflow Variable `segrep_alert_callback`, e.g. a Slack or SMTP notifier
(docs/airflow.md, "Alerts"). A hook that does not import fails the run, naming it.

Every minute, no catch-up, one run at a time; a run that takes over 2 minutes is failed. Like every DAG it
starts paused: unpause it once. It reads nothing at parse time.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import dag, task

from segrep_airflow.watchdog import alert


@dag(
    dag_id="segrep_watchdog",
    description="Fail, and alert, when any replica is past its table's RPO (rounds running or not)",
    doc_md=__doc__,
    schedule=timedelta(minutes=1),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=2),
    tags=["segrep", "watchdog"],
    default_args={"retries": 0},
)
def segrep_watchdog() -> None:
    @task(task_id="check", execution_timeout=timedelta(seconds=90), on_failure_callback=alert)
    def check() -> dict[str, Any]:
        from segrep_airflow.watchdog import check as run

        return run()

    check()


segrep_watchdog()
