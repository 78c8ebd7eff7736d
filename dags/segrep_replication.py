"""
### segrep replication: one DAG per table policy

Each run replicates the segments its table's leaders committed before the run's **data interval end** to every
replica site, as the EventQL protocol prescribes (DESIGN section 6):

1. **plan**: reads the catalog, predicts every offer per target, leases the segments followers must push, and
   writes the merge manifest when a chain has forked.
2. **fast_forward** (mapped, one instance per target site): copies each new segment file, verifies its sha256,
   registers it and moves the replica's root. No row is read. A target that is down fails only its own instance,
   after retries with exponential back-off; the other targets proceed.
3. **merge** (SparkSubmitOperator, one Spark application for the whole round): last-writer-wins merge of
   pushed segments; skipped when nothing forked.
4. **commit**: records the merge results, checkpoints and safe time.
5. **report**: writes the round report and fails the run if a target failed or a copied file failed
   verification (it names the file), so `airflow backfill create
   --reprocess-behavior failed --max-active-runs 1` replays exactly the intervals that need it, in order (a
   backfill ignores the DAG's max_active_runs and runs up to 10 intervals at once unless told otherwise).

Trigger form: narrow a manual run to one `target` site, or `reoffer` every segment (repairs lost acks; the
receiver answers SEGMENT_EXISTS for what it holds). Scheduled runs use the defaults.

Definitions come from the YAML file in the repository (`SEGREP_CONFIG`); this file only wires tasks. It reads
that file at parse time and never touches a database or the network.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param, dag, task

from segrep.config.definitions import TableDef
from segrep_airflow.common import (
    dag_definitions,
    hook_submit,
    retry_args,
    segrep_context,
    spark_step,
    timetable,
    to_us,
    utc,
)
from segrep_airflow.forms import form


def build_replication_dag(table: TableDef):  # type: ignore[no-untyped-def]
    policy = table.policy
    name = table.name
    retry = retry_args(policy)

    @dag(
        dag_id=f"segrep_replicate_{name}",
        description=f"Replicate {name} from {table.leader} to {', '.join(table.replicas) or 'no replica'}",
        doc_md=__doc__,
        schedule=timetable(policy.schedule),
        start_date=utc(policy.start_date),
        end_date=utc(policy.end_date),
        catchup=True,
        max_active_runs=1,
        tags=["segrep", "replication", name],
        params={
            "target": Param(
                None,
                type=["null", "string"],
                enum=[None, *table.replicas],
                description="Only replicate to this site (empty: every replica site).",
            ),
            "reoffer": Param(
                False, type="boolean", description="Offer every segment again, ignoring acks and back-off."
            ),
        },
        default_args={"retries": 0},
    )
    def replication() -> None:
        @task
        def plan(data_interval_start: Any = None, data_interval_end: Any = None) -> dict[str, Any]:
            from segrep.replication.plan import plan_round
            from segrep.replication.round import round_key
            from segrep.storage.workdir import result_path

            p = form()
            with segrep_context() as (defs, catalog):
                res = plan_round(
                    catalog,
                    defs,
                    name,
                    to_us(data_interval_end),
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

        def commit(p: dict[str, Any]) -> dict[str, Any]:
            from segrep.replication.commit import commit_round
            from segrep.split.run import finish_unloaded

            with segrep_context() as (defs, catalog):
                report = commit_round(catalog, defs, name, p["end_us"], merge_ran=bool(p["manifest"]))
                finish_unloaded(catalog, defs, name)  # a split parent goes once every replica holds its children
                return report.to_dict()

        @task(trigger_rule="all_done", retries=0)
        def report(ti: Any = None) -> dict[str, Any]:
            from segrep.cli.format import format_report
            from segrep.replication.reports import RoundReport

            raw = ti.xcom_pull(task_ids="commit") if ti is not None else None
            if not raw:
                raise RuntimeError(f"round of {name} did not commit (see the merge and commit tasks)")
            result = RoundReport.from_dict(raw)
            print(format_report(result))
            if result.has_problems:  # a failed target, or a file that failed verification
                raise RuntimeError(f"round of {name}: {'; '.join(result.problems())}")
            return {"status": str(result.status), "safe_time_us": result.safe_time_us}

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
        )
        copied >> merged
        [merged, copied] >> report()

    return replication()


_defs = dag_definitions()  # invalid tables left out: dags/segrep_definitions.py reports them
for _table in _defs.tables.values() if _defs else ():
    globals()[f"segrep_replicate_{_table.name}"] = build_replication_dag(_table)
