"""Shared wiring for segrep's DAG files.

Only Airflow glue lives here: the definitions the DAG files build from and their problems
(:func:`dag_definitions`, :func:`definitions_problems`: a bad table is left out, never the whole folder), the
definitions and catalog of a task (:func:`segrep_context`), timetables from a policy (the schedule parser
``segrep apply`` validates with), and Spark submission through the `spark_default` connection with the same
configuration as `segrep.spark.launch` (which says why each setting is there), including the one "branch,
Spark, commit" task group every DAG uses (:func:`spark_step`). Nothing here runs at import time beyond
reading environment variables; nothing builds a catalog engine outside a running task.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import CronDataIntervalTimetable, DeltaDataIntervalTimetable, TaskGroup, task

from segrep.config.definitions import Definitions, Policy, TableDef, load_definitions
from segrep.config.schedule import parse_schedule
from segrep.core.errors import SegrepError
from segrep.spark import launch
from segrep_airflow.credentials import connection_env, connection_ids, use_airflow_connections

if TYPE_CHECKING:
    from segrep.catalog import Catalog

SPARK_CONN_ID = os.environ.get("SEGREP_SPARK_CONN_ID", "spark_default")
COMMIT_TRIGGER_RULE = "none_failed_min_one_success"  # after the Spark task, or after the branch skipped it


def catalog_for(defs: Definitions) -> Catalog:
    """The segrep catalog (never Airflow's metadata database): SEGREP_CATALOG_URL or the definitions file's.
    Tasks use :func:`segrep_context`, which also disposes of it."""
    from segrep.catalog import Catalog
    from segrep.catalog.engine import resolve_url

    return Catalog(resolve_url(None, defs.catalog_url, defs.data_dir))


@contextmanager
def segrep_context() -> Iterator[tuple[Definitions, Catalog]]:
    """What a task works with: the definitions, read when the task runs (the file as deployed now, not as it
    was parsed; an invalid table left out, as at parse time, so another table's bad policy does not fail this
    table's tasks), and segrep's catalog, checked as every CLI command checks it (initialized, at this
    segrep's schema, every table there: a round must not copy and then fail at the table it writes last).
    The catalog's engine, with its connection pool, is disposed of when the block ends, however it ends, so a
    task leaves no connection open behind it::

        with segrep_context() as (defs, catalog):
            return plan_round(catalog, defs, ...).to_dict()
    """
    from segrep.catalog.request_slots import shared_site_requests

    use_airflow_connections()  # sites' ``airflow_conn_id`` credentials resolve through Airflow in this task
    defs = load_definitions(isolate_tables=True)
    catalog = catalog_for(defs)
    try:
        catalog.require_initialized()
        with shared_site_requests(catalog):  # the task's S3 requests share each site's rate with the deployment
            yield defs, catalog
    finally:
        catalog.dispose()


def to_us(when: Any) -> int | None:
    return None if when is None else int(pendulum.instance(when).timestamp() * 1_000_000)


def utc(when: date | datetime | None) -> pendulum.DateTime | None:
    if when is None:
        return None
    if not isinstance(when, datetime):
        return pendulum.datetime(when.year, when.month, when.day, tz="UTC")
    return pendulum.instance(when if when.tzinfo else when.replace(tzinfo=UTC))


def dag_definitions() -> Definitions | None:
    """The definitions the DAG files build from at parse time, each invalid table left out (its DAGs are not
    built; ``dags/segrep_definitions.py`` reports it as the one import error). None when the file as a whole
    is unusable (unreadable, not YAML, bad sites): then no DAG file builds anything and that same file reports
    the error once, instead of every DAG file failing with it."""
    try:
        return load_definitions(isolate_tables=True)
    except SegrepError:
        return None


def tables_to_build(defs: Definitions | None, prefix: str) -> list[TableDef]:
    """The tables whose DAG (``prefix + table``) a DAG file builds: all of them when the dag-processor parses
    the file, only the one a task belongs to when a task process parses it (Airflow names that DAG in the
    parsing context), so a task of one table does not pay for building every other table's DAG."""
    from airflow.sdk import get_parsing_context

    tables = list(defs.tables.values()) if defs is not None else []
    wanted = get_parsing_context().dag_id
    if wanted and wanted.startswith(prefix):
        return [t for t in tables if prefix + t.name == wanted]
    return tables


def definitions_problems() -> str | None:
    """Everything wrong with the definitions file, in one message naming each invalid table (whose DAGs are
    not built) and its problem; None if every table is valid."""
    try:
        defs = load_definitions(isolate_tables=True)
    except SegrepError as exc:
        return f"segrep DAGs not built: {exc}"
    if not defs.table_errors:
        return None
    bad = sorted(defs.table_errors)
    return f"segrep DAGs of table(s) {', '.join(bad)} not built (the other tables' DAGs are): " + "; ".join(
        defs.table_errors[name] for name in bad
    )


def timetable(schedule: str | None) -> Any:
    """Real [start, end) data intervals: a fixed interval ("10m") or a cron expression/preset; None: manual.
    ``parse_schedule`` is the parser ``segrep apply`` validates the policy with, so what apply accepts builds."""
    parsed = parse_schedule(schedule)
    if parsed is None:
        return None
    if parsed.interval_s is not None:
        return DeltaDataIntervalTimetable(timedelta(seconds=parsed.interval_s))
    if parsed.cron is not None:
        return CronDataIntervalTimetable(parsed.cron, timezone="UTC")
    raise ValueError(f"schedule {parsed.text!r} is neither a fixed interval nor a cron expression")


def retry_args(policy: Policy) -> dict[str, Any]:
    return {
        "retries": policy.retries,
        "retry_delay": timedelta(seconds=policy.retry_delay_s),
        "retry_exponential_backoff": 2.0 if policy.retry_delay_s else 0,
        "max_retry_delay": timedelta(hours=1),
    }


def spark_conf() -> dict[str, str]:
    # launch.SPARK_CONF says why each entry is set; the interpreter is ours so driver and executors import segrep.
    return {
        **launch.SPARK_CONF,
        "spark.pyspark.python": launch.python(),
        "spark.pyspark.driver.python": launch.python(),
    }


def spark_env() -> dict[str, str]:
    env = launch.spark_env()
    return {k: env[k] for k in ("SPARK_HOME", "PYSPARK_PYTHON", "PATH") if k in env}


def spark_env_with_credentials(defs: Definitions) -> dict[str, str]:
    """:func:`spark_env` plus the secrets of the Airflow connections the sites name, resolved in this task and
    handed to the Spark application by reference (its environment: ``SEGREP_CONN_<ID>_*``), never in its
    command line, its configuration or a manifest. Called when the task runs, never at parse time."""
    return {**spark_env(), **connection_env(connection_ids(defs))}


def hook_submit(app: str, args: list[str], *, name: str, master: str | None = None) -> None:
    """Run a Spark job from inside a task through the Airflow connection (the distributed copy)."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    use_airflow_connections()
    hook = SparkSubmitHook(
        conn_id=SPARK_CONN_ID,
        conf=spark_conf(),
        name=name,
        application_args=args,
        env_vars=spark_env_with_credentials(load_definitions(isolate_tables=True)),
        spark_binary=launch.spark_submit_binary(),
    )
    hook.submit(application=str(launch.application(app)))


class LeasedSparkSubmitOperator(SparkSubmitOperator):
    """SparkSubmitOperator that keeps a round's leases alive while its Spark application runs.

    The round's leases are short and renewed only by processes working for the round (see
    ``segrep.replication.heartbeat``); this task is one of them while the merge runs. ``lease_holder`` is
    templated (the round's key, from the planning task's XCom); empty means there is nothing to keep alive."""

    template_fields = (*SparkSubmitOperator.template_fields, "lease_holder")

    def __init__(self, *, lease_holder: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lease_holder = lease_holder

    def execute(self, context: Any) -> None:
        from segrep.replication.heartbeat import heartbeat  # imported by the task, not at parse time

        with segrep_context() as (defs, catalog):
            # After rendering: the secrets never reach the rendered fields Airflow keeps.
            self.env_vars = {**(self.env_vars or {}), **spark_env_with_credentials(defs)}
            if not self.lease_holder:
                return super().execute(context)
            with heartbeat(catalog, self.lease_holder):
                return super().execute(context)


def merge_job(
    task_id: str, upstream_task: str, name: str, policy: Policy, key: str = "return_value"
) -> SparkSubmitOperator:
    """The Spark merge job (spark_jobs/merge.py) on the manifest and result paths in ``upstream_task``'s XCom
    ``key``; the round's leases (``lease_holder`` in that XCom, when there is one) stay alive while it runs."""
    pull = f"ti.xcom_pull(task_ids='{upstream_task}', key='{key}')"
    return LeasedSparkSubmitOperator(
        task_id=task_id,
        lease_holder="{{ " + pull + ".get('lease_holder', '') }}",
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


def merged_in_process(p: dict[str, Any], policy: Policy, name: str) -> bool:
    """Run the manifest in ``p`` (its ``manifest`` and ``result`` paths) here when ``spark.merge_runner`` says it
    is small enough, keeping the round's leases (``lease_holder``) alive meanwhile; False: it needs Spark."""
    from segrep.replication.heartbeat import heartbeat
    from segrep.spark.manifest import Manifest
    from segrep.spark.merge_items import MergeEngine
    from segrep.spark.merge_runner import MergeLimits, choose_engine, run_merge_manifest

    limits = MergeLimits.of(policy)
    if choose_engine(Manifest.load(p["manifest"]), limits).engine == MergeEngine.SPARK:
        return False
    with segrep_context() as (_defs, catalog):
        holder = p.get("lease_holder") or ""
        with heartbeat(catalog, holder) if holder else contextlib.nullcontext():
            run_merge_manifest(
                p["manifest"], p["result"], submit=hook_submit, limits=limits, name=name, force="in_process"
            )
    return True


def spark_step(
    plan: Any,
    commit: Callable[[dict[str, Any]], Any],
    *,
    group_id: str,
    choose_id: str,
    spark_id: str,
    commit_id: str,
    name: str,
    policy: Policy,
    choose_trigger_rule: str = "all_success",
    commit_outlets: list[Any] | None = None,
) -> TaskGroup:
    """The "branch, Spark, commit" step of every DAG, as one task group: ``choose_id`` (a branch) runs the
    SparkSubmitOperator ``spark_id`` (spark_jobs/merge.py, :func:`merge_job`) when the ``plan`` task's XCom
    names a manifest too big to merge in process (:func:`merged_in_process` merges a small one in the branch
    task itself), else goes straight to ``commit_id``, which runs ``commit(plan's XCom)`` either way.

    ``plan`` is the XComArg of the task that wrote the manifest (a dict with ``manifest`` and ``result``).
    The group does not prefix its task ids: they are exactly ``choose_id``, ``spark_id`` and ``commit_id``.
    ``upstream >> group`` makes ``choose_id`` wait for ``upstream``; ``group >> downstream`` waits for
    ``commit_id``. The Spark task takes the table's ``policy`` retries; ``name`` is its Spark application name.
    ``commit_outlets``: the commit task's outlets (the replication DAG's asset alias).

    With ``choose_trigger_rule="all_done"`` the branch also runs when the plan task failed; it then skips the
    group with a message (rather than failing on the missing XCom), so the error shown is the plan's own.
    """
    plan_task_id = plan.operator.task_id
    plan_key = getattr(plan, "key", "return_value")

    def choose(p: dict[str, Any] | None) -> str:
        if p is None:
            from airflow.sdk.exceptions import AirflowSkipException

            raise AirflowSkipException(f"{plan_task_id} did not finish: nothing to merge or commit (see its log)")
        if not p["manifest"]:
            return commit_id
        return spark_id if not merged_in_process(p, policy, name) else commit_id

    with TaskGroup(
        group_id, prefix_group_id=False, tooltip=f"{choose_id} -> {spark_id} (Spark) -> {commit_id}"
    ) as group:
        branch = task.branch(task_id=choose_id, trigger_rule=choose_trigger_rule)(choose)(plan)
        spark = merge_job(spark_id, plan_task_id, name, policy, plan_key)
        committed = task(task_id=commit_id, trigger_rule=COMMIT_TRIGGER_RULE, outlets=commit_outlets or [])(commit)(
            plan
        )
        branch >> [spark, committed]
        spark >> committed
    return group
