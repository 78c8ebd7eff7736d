"""Shared wiring for segrep's DAG files.

Only Airflow glue lives here: the catalog for a task, timetables from a policy, and Spark submission through
the `spark_default` connection with the same configuration as `segrep.spark.launch` (which says why each
setting is there). Nothing here runs at import time beyond reading environment variables.
"""

from __future__ import annotations

import os
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import CronDataIntervalTimetable, DeltaDataIntervalTimetable

from segrep.config.definitions import Definitions, Policy, schedule_interval_s
from segrep.spark import launch

SPARK_CONN_ID = os.environ.get("SEGREP_SPARK_CONN_ID", "spark_default")


def catalog_for(defs: Definitions):  # type: ignore[no-untyped-def]
    """The segrep catalog (never Airflow's metadata database): SEGREP_CATALOG_URL or the definitions file's."""
    from segrep.catalog import Catalog
    from segrep.catalog.engine import resolve_url

    return Catalog(resolve_url(None, defs.catalog_url, defs.data_dir))


def to_us(when: Any) -> int | None:
    return None if when is None else int(pendulum.instance(when).timestamp() * 1_000_000)


def utc(when: date | datetime | None) -> pendulum.DateTime | None:
    if when is None:
        return None
    if not isinstance(when, datetime):
        return pendulum.datetime(when.year, when.month, when.day, tz="UTC")
    return pendulum.instance(when if when.tzinfo else when.replace(tzinfo=UTC))


def timetable(schedule: str | None) -> Any:
    """Real [start, end) data intervals: a fixed interval ("10m") or a cron expression/preset; None: manual."""
    interval_s = schedule_interval_s(schedule)
    if interval_s:
        return DeltaDataIntervalTimetable(timedelta(seconds=interval_s))
    return CronDataIntervalTimetable(schedule, timezone="UTC") if schedule else None


def retry_args(policy: Policy) -> dict[str, Any]:
    return {
        "retries": policy.retries,
        "retry_delay": timedelta(seconds=policy.retry_delay_s),
        "retry_exponential_backoff": 2.0 if policy.retry_delay_s else 0,
        "max_retry_delay": timedelta(hours=1),
    }


def spark_conf() -> dict[str, str]:
    # launch.SPARK_CONF says why each entry is set; the interpreter is ours so driver and executors import segrep.
    return {**launch.SPARK_CONF, "spark.pyspark.python": launch.python(),
            "spark.pyspark.driver.python": launch.python()}  # fmt: skip


def spark_env() -> dict[str, str]:
    env = launch.spark_env()
    return {k: env[k] for k in ("SPARK_HOME", "PYSPARK_PYTHON", "PATH") if k in env}


def hook_submit(app: str, args: list[str], *, name: str, master: str | None = None) -> None:
    """Run a Spark job from inside a task through the Airflow connection (the distributed copy)."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    hook = SparkSubmitHook(conn_id=SPARK_CONN_ID, conf=spark_conf(), name=name, application_args=args,
                           env_vars=spark_env(), spark_binary=launch.spark_submit_binary())  # fmt: skip
    hook.submit(application=str(launch.application(app)))


def merge_job(task_id: str, upstream_task: str, name: str, policy: Policy) -> SparkSubmitOperator:
    """The Spark merge job (spark_jobs/merge.py) on the manifest and result paths in ``upstream_task``'s XCom."""
    pull = f"ti.xcom_pull(task_ids='{upstream_task}')"
    return SparkSubmitOperator(
        task_id=task_id,
        conn_id=SPARK_CONN_ID,
        application=str(launch.jobs_dir() / "merge.py"),
        application_args=["--manifest", "{{ " + pull + "['manifest'] }}", "--result", "{{ " + pull + "['result'] }}"],
        conf=spark_conf(),
        env_vars=spark_env(),
        spark_binary=launch.spark_submit_binary(),
        py_files=os.environ.get(launch.PY_FILES_ENV) or None,
        name=name,
        **retry_args(policy),
    )
