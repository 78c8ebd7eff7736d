"""
### segrep maintenance: compaction and garbage collection, one DAG per table

1. **plan_compaction** picks the partitions whose minor chain at the leader reached the table's thresholds
   (`compact_min_segments`, `compact_min_bytes`) and writes the manifest of their major items.
2. **compact** (SparkSubmitOperator, one application for all of them) folds each chain into a major segment,
   last writer wins, dropping tombstones only past the table's `tombstone_grace_s`; skipped when none is due.
3. **commit_compaction** registers the majors (only where the leader's root did not move meanwhile).
4. **gc** deletes what no chain needs any more, holds what a LIVE or JOINING replica still needs up to
   `max_retention_s` (then marks that replica as needing a bootstrap and says so), removes old orphans.
5. **continue_splits** resumes every split of the table that has not finished (one whose parent replica was
   down, say): the same steps as the split DAG, Spark through the `spark_default` connection. A split that
   still waits is reported in the log and by `segrep status`.

Replicas take the new majors by fast-forward in the next replication round. Trigger form: `force` compacts
every partition with a minor segment; `gc_dry_run` lists what GC would delete, and why, without deleting.
Schedule: the table policy's `maintenance_schedule` (default daily), no catch-up. A scheduled run that starts
more than 15 minutes after its time (the one Airflow creates the moment the DAG is unpaused, e.g. by the
Trigger form's "unpause") does nothing and says so, so a requested dry run is never preceded by a real GC.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import dag, task

from segrep.config.definitions import TableDef
from segrep_airflow.common import (
    dag_definitions,
    hook_submit,
    segrep_context,
    spark_step,
    tables_to_build,
    timetable,
    utc,
)
from segrep_airflow.forms import flag, form


def build_maintenance_dag(table: TableDef):  # type: ignore[no-untyped-def]
    name, policy = table.name, table.policy

    @dag(
        dag_id=f"segrep_maintain_{name}",
        description=f"Compaction and GC of {name}",
        doc_md=__doc__,
        schedule=timetable(policy.maintenance_schedule),
        start_date=utc(policy.start_date),
        catchup=False,
        max_active_runs=1,
        tags=["segrep", "maintenance", name],
        params={
            "force": flag(False, "Compact every partition that has a minor segment."),
            "gc_dry_run": flag(False, "List what GC would delete; delete nothing."),
        },
        default_args={"retries": 0},
    )
    def maintenance() -> None:
        def skip_if_late(dag_run: Any) -> None:
            """A scheduled run that started long after its time does nothing (see segrep_airflow.runs)."""
            import pendulum
            from airflow.sdk.exceptions import AirflowSkipException

            from segrep_airflow.runs import late_scheduled_run

            why = late_scheduled_run(dag_run.run_type, dag_run.run_after, pendulum.now("UTC"))
            if why:
                raise AirflowSkipException(why)

        @task
        def plan_compaction(dag_run: Any = None) -> dict[str, Any]:
            from dataclasses import asdict

            from segrep.maintenance.compaction import plan_compaction as plan

            force = form()["force"]
            skip_if_late(dag_run)
            with segrep_context() as (defs, catalog):
                planned = plan(catalog, defs, name, force=force)
            for c in planned.candidates:
                print(f"partition {c.partition_id}: {c.reason}")
            for line in planned.needs_bootstrap:
                print(f"ALERT: {line}")
            return asdict(planned)

        def commit_compaction(p: dict[str, Any]) -> dict[str, Any]:
            from pathlib import Path

            from segrep.replication.publication import publish
            from segrep.spark.results import CommitSummary, commit_results

            if not p["manifest"]:
                return CommitSummary().to_dict()
            with segrep_context() as (defs, catalog):
                summary = commit_results(catalog, Path(p["manifest"]), Path(p["result"]))
                for pub in publish(catalog, defs, name).sites:  # a major starts a clean snapshot
                    print(pub.line())
                return summary.to_dict()

        @task(trigger_rule="none_failed_min_one_success")
        def gc(dag_run: Any = None) -> dict[str, Any]:
            from segrep.maintenance.gc import collect

            dry_run = form()["gc_dry_run"]
            skip_if_late(dag_run)
            with segrep_context() as (defs, catalog):
                report = collect(catalog, defs, name, dry_run=dry_run)
            verb = "would delete" if dry_run else "deleted"
            for d in report.deletions:
                print(f"{verb} {d.site}:{d.relpath} ({d.reason})")
            for line in report.needs_bootstrap:
                print(f"ALERT: {line}")
            return {
                "deleted": len(report.deletions),
                "files_removed": report.files_removed,
                "needs_bootstrap": report.needs_bootstrap,
                "held": report.held,
            }

        @task(trigger_rule="all_done")
        def continue_splits(dag_run: Any = None) -> list[dict[str, Any]]:
            from segrep.split.run import resume_splits

            form()  # runs whatever compaction did (all_done), so it checks the run's conf itself
            skip_if_late(dag_run)
            out = []
            with segrep_context() as (defs, catalog):
                reports = resume_splits(catalog, defs, name, submit=hook_submit)
            for report in reports:
                print(f"split {report.split_id} of {name}: {report.state} {report.waiting or ''}")
                out.append({"split_id": report.split_id, "state": str(report.state), "waiting": report.waiting})
            return out

        planned = plan_compaction()
        compaction = spark_step(
            planned,
            commit_compaction,
            group_id="compact_step",
            choose_id="choose",
            spark_id="compact",
            commit_id="commit_compaction",
            name=f"segrep-compact-{name}",
            policy=policy,
        )
        compaction >> gc() >> continue_splits()

    return maintenance()


_defs = dag_definitions()  # invalid tables left out: dags/segrep_definitions.py reports them
for _table in tables_to_build(_defs, "segrep_maintain_"):  # a task builds only its own DAG
    globals()[f"segrep_maintain_{_table.name}"] = build_maintenance_dag(_table)
