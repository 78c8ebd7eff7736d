"""
### segrep replication: one DAG per table policy

Each run replicates to every replica site the segments its table's leaders committed before the round's end:
a **scheduled** run ends at its data interval's end; a **manual** run (Trigger) ends at the moment it was
triggered, not at the end of the last whole interval before it. Steps (DESIGN section 6):

1. **plan**: reads the catalog, predicts every offer per target, leases the segments followers must push, and
   writes the merge manifest when a chain has forked (retried as the policy says).
2. **fast_forward** (mapped, one instance per target site): copies each new segment file, verifies its sha256,
   registers it and moves the replica's root. No row is read. A target that is down fails only its own instance,
   after retries with exponential back-off; the other targets proceed.
3. **merge** (SparkSubmitOperator, one Spark application for the whole round): last-writer-wins merge of
   pushed segments; skipped when nothing forked.
4. **commit**: records the merge results, checkpoints and safe time; emits an asset event on
   `segrep://<site>/<table>` for each site whose safe time advanced.
5. **report**: commits again from the catalog (idempotent: after "Clear only failed tasks" it counts the
   re-run copies), logs one line per target (copied, safe time, lag, still pending), sends the metrics, and
   fails the run if a target failed, a copied file failed verification, or a target ends behind the table's
   RPO (`policy: {rpo: 15m}`), naming the table, site and lag.

No catch-up: a round copies everything committed before its end, so the intervals missed while the DAG was
paused need no replay. To re-run failed intervals in order: `airflow backfill create --dag-id DAG
--from-date ... --to-date ... --reprocess-behavior failed --max-active-runs 1` (a backfill ignores the
DAG's max_active_runs and runs up to 10 intervals at once unless told otherwise).

Trigger form: narrow a manual run to one `target` site, or `reoffer` every segment (repairs lost acks; the
receiver answers SEGMENT_EXISTS for what it holds). Scheduled runs use the defaults.

Definitions come from the YAML file in the repository (`SEGREP_CONFIG`); this file only wires tasks. It reads
that file at parse time and never touches a database or the network.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import dag, task

from segrep.config.definitions import TableDef
from segrep_airflow import assets
from segrep_airflow.common import (
    dag_definitions,
    hook_submit,
    retry_args,
    segrep_context,
    spark_step,
    tables_to_build,
    to_us,
    utc,
)
from segrep_airflow.forms import every_or_one, flag, form
from segrep_airflow.schedules import replication_schedule


def build_replication_dag(table: TableDef):  # type: ignore[no-untyped-def]
    policy = table.policy
    name = table.name
    retry = retry_args(policy)
    alias = assets.alias(name)

    @dag(
        dag_id=f"segrep_replicate_{name}",
        description=f"Replicate {name} from {table.leader} to {', '.join(table.replicas) or 'no replica'}",
        doc_md=__doc__,
        schedule=replication_schedule(policy, name),
        start_date=utc(policy.start_date),
        end_date=utc(policy.end_date),
        catchup=False,
        max_active_runs=1,
        tags=["segrep", "replication", name],
        params={
            "target": every_or_one(
                list(table.replicas),
                every="every replica site",
                description="Only replicate to this site (empty: every replica site).",
            ),
            "reoffer": flag(False, "Offer every segment again, ignoring acks and back-off."),
        },
        default_args={"retries": 0},
    )
    def replication() -> None:
        @task(**retry)
        def plan(data_interval_start: Any = None, data_interval_end: Any = None, dag_run: Any = None) -> dict[str, Any]:
            from segrep.replication.plan import plan_round
            from segrep.replication.round import round_key
            from segrep.storage.workdir import result_path
            from segrep_airflow.rounds import round_end

            p = form()
            run_type = getattr(dag_run, "run_type", None)
            end = round_end(run_type, getattr(dag_run, "run_after", None), data_interval_end)
            with segrep_context() as (defs, catalog):
                res = plan_round(
                    catalog,
                    defs,
                    name,
                    to_us(end),
                    start_us=to_us(data_interval_start),
                    target=p["target"],
                    reoffer=p["reoffer"],
                )
                result = result_path(defs, name, res.end_us)
            # lease_holder: the merge task keeps the round's leases alive under this key while Spark runs
            return {
                **res.to_dict(),
                "result": str(result),
                "reoffer": p["reoffer"],
                "lease_holder": round_key(name, res.end_us),
            }

        @task
        def targets_of(p: dict[str, Any]) -> list[str]:
            return list(p["targets"])

        @task(**retry)
        def fast_forward(target: str, p: dict[str, Any]) -> dict[str, Any]:
            from segrep.replication.fast_forward import fast_forward_target
            from segrep.replication.run import spark_copier

            with segrep_context() as (defs, catalog):
                copier = spark_copier(defs, name, p["end_us"], target, hook_submit)
                report = fast_forward_target(
                    catalog, defs, name, target, p["end_us"], reoffer=p["reoffer"], big_copier=copier
                )
            return report.to_dict()

        def commit(p: dict[str, Any], outlet_events: Any = None) -> dict[str, Any]:
            from segrep.split.run import finish_unloaded
            from segrep_airflow.rounds import advanced, recommit, safe_times

            with segrep_context() as (defs, catalog):
                before = safe_times(catalog, name)
                report = recommit(catalog, defs, name, p["end_us"], merge_ran=bool(p["manifest"]))
                finish_unloaded(catalog, defs, name)  # a split parent goes once every replica holds its children
            if outlet_events is not None:
                assets.emit(outlet_events, report, advanced(before, report.safe_time_us))
            return report.to_dict()

        @task(trigger_rule="all_done", retries=0, outlets=[alias])
        def report(ti: Any = None, outlet_events: Any = None) -> dict[str, Any]:
            import structlog

            from segrep_airflow.metrics import emit_round
            from segrep_airflow.rounds import advanced, recommit, report_lines, round_view, safe_times

            planned = ti.xcom_pull(task_ids="plan") if ti is not None else None
            if not planned:
                raise RuntimeError(
                    f"round of {name}: the plan task did not finish, so there is no round to report "
                    "(see the plan task's log; clear it to run the round again)"
                )
            with segrep_context() as (defs, catalog):
                before = safe_times(catalog, name)
                result = recommit(catalog, defs, name, planned["end_us"], merge_ran=bool(planned["manifest"]))
                view = round_view(catalog, result, defs.policy(name).rpo_s)
            # Logged, not printed: a task's stdout reaches its log through a pipe and is stamped when read,
            # after the task runner has opened its collapsed "Post Execute" group; a log record is stamped now.
            # Through structlog, as Airflow's own task lines are (a stdlib logger's INFO may be filtered out).
            log = structlog.get_logger("segrep.round")
            for line in report_lines(view):
                log.info(line)
            emit_round(view)
            if outlet_events is not None:
                assets.emit(outlet_events, result, advanced(before, result.safe_time_us))
            failure = view.failure()
            if failure:  # a failed target, a file that failed verification, or a target behind its RPO
                raise RuntimeError(failure)
            return view.to_xcom()

        planned = plan()
        copied = fast_forward.partial(p=planned).expand(target=targets_of(planned))
        # choose decides even when a target failed (all_done): the merge and commit concern the leader only.
        merged = spark_step(
            planned,
            commit,
            group_id="merge_step",
            choose_id="choose",
            spark_id="merge",
            commit_id="commit",
            name=f"segrep-merge-{name}",
            policy=policy,
            choose_trigger_rule="all_done",
            commit_outlets=[alias],
        )
        copied >> merged
        [merged, copied] >> report()

    return replication()


_defs = dag_definitions()  # invalid tables left out: dags/segrep_definitions.py reports them
for _table in tables_to_build(_defs, "segrep_replicate_"):  # a task builds only its own DAG
    globals()[f"segrep_replicate_{_table.name}"] = build_replication_dag(_table)
