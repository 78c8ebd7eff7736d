"""
### segrep split: split a partition of one table while writes continue (EventQL 3.8)

One DAG per table (`segrep_split_<table>`), so its Spark steps retry as the table's policy says. Trigger it
from the UI with the form: `partition` (its id: this DAG's **Replication** tab lists the live partitions with
their key ranges, as does `segrep table describe TABLE`; left empty, the run fails at once listing them),
`split_keys` (one or more keys of the partition key, strictly inside the partition's range) and `async`.
Leave `split_keys` empty to **resume** the partition's split where it stopped (after a failure, a leader
change, or a parent replica that was down).

1. **start**: the partition enters SPLITTING; one LOADING child per key range, with a placement at every site
   of the parent and its leader at the parent leader's site. Writes keep going to the parent.
2. **copy_plan → copy_choose → copy_rewrite → copy_commit**: the parent leader offers its chain to each child;
   the Spark job (SparkSubmitOperator, skipped when there is nothing to rewrite) rewrites every segment a child
   lacks for the child's key range, keeping its `segment_id` and `base_segment_id`. Acked segments are never
   rewritten again, even by a new leader.
3. **finalize** (SPLIT_FINALIZE, up to the copy pass's cut): writes switch to the children; the parent enters
   UNLOAD. An `async` split is finalized by **start** and skips the copy.
4. **unload_plan → unload_choose → unload_merge → unload_commit**: every parent replica pushes what the
   children still lack (writes that arrived during the copy, forks of a replica that was away); the children
   merge them, last writer wins, so rows updated after the split keep their newer values.
5. **finish** (UNLOAD_FINAL): the parent is retired and its files removed, once the children's replicas hold
   the parent's rows; until then each replica site reads them from its parent placement, and the commit task
   of the next replication run retires the parent. If a parent replica could not push (its site is down)
   the run fails here saying so; trigger it again (without keys) when the site is back.

Each task calls one step of `segrep.split.run` / `segrep.split.workflow`, the steps `segrep split` runs.
Scheduled replication rounds then carry the children to every replica site. `segrep status` shows each
split's state and, per child, the segments acked and still lacking.
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import Param, dag, task

from segrep.catalog.models import MAX_PARTITION_ID
from segrep.config.definitions import TableDef
from segrep_airflow import lineage
from segrep_airflow.common import dag_definitions, segrep_context, spark_step, tables_to_build
from segrep_airflow.forms import flag, form, key_schema


def build_split_dag(table: TableDef):  # type: ignore[no-untyped-def]
    name, policy = table.name, table.policy

    @dag(
        dag_id=f"segrep_split_{name}",
        description=f"Split a partition of {name} while writes continue (rewrite on Spark, finalize, unload, retire)",
        doc_md=__doc__,
        schedule=None,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        tags=["segrep", "split", name],
        params={
            # No default: partition 1 of the definitions may be retired by a split, and the catalog (which
            # knows the live ones) is not read at parse time. Left empty, the run's first task lists them.
            "partition": Param(
                None,
                type=["null", "integer"],
                minimum=1,
                maximum=MAX_PARTITION_ID,
                description=(
                    f"Partition id (required). The live partitions of {name} with their key ranges are listed on "
                    "this DAG's Replication tab (and by `segrep table describe`); a run left empty fails at once "
                    "listing them, changing nothing."
                ),
            ),
            "split_keys": Param(
                [],
                type="array",
                items=key_schema(table.schema.field(table.partition_key).type),
                uniqueItems=True,
                description=f"Split keys ({table.partition_key}) inside the partition's range; empty: resume.",
            ),
            "async": flag(False, "Finalize at once; the data follows through UNLOAD."),
        },
        default_args={"retries": 0},
    )
    def split() -> None:
        @task
        def start() -> dict[str, Any]:
            from dataclasses import asdict

            from segrep.core.errors import SegrepError
            from segrep.split.candidates import split_candidates
            from segrep.split.run import begin_split

            p = form()
            with segrep_context() as (_defs, catalog):
                if p["partition"] is None:
                    raise SegrepError(
                        f"choose a partition of {name} to split; the live ones (id, key range, state): "
                        + "; ".join(c.line() for c in split_candidates(catalog, name))
                    )
                partition = int(p["partition"])  # the form took an integral number (JSON: 5 or 5.0) in range
                try:
                    ref = begin_split(catalog, name, partition, p["split_keys"], is_async=p["async"])
                except SegrepError as exc:
                    live = "; ".join(c.line() for c in split_candidates(catalog, name))
                    raise SegrepError(f"{exc} (live partitions of {name}: {live})") from None
            print(f"split {ref.split_id} of {name} partition {partition}: {ref.state}, children {ref.children}")
            return asdict(ref)

        def plan_task(phase: str) -> Any:
            @task(task_id=f"{phase}_plan")
            def plan(ref: dict[str, Any]) -> dict[str, Any]:
                from segrep.split.workflow import plan_pass

                with segrep_context() as (defs, catalog):
                    planned = plan_pass(catalog, defs, ref["split_id"], phase)
                print(planned)
                return planned.to_dict()

            return plan

        def commit(p: dict[str, Any]) -> dict[str, Any]:
            from segrep.split.workflow import commit_pass

            with segrep_context() as (_defs, catalog):
                summary = commit_pass(catalog, p)
                lineage.split_pass(catalog, p, summary)
            print(summary)
            return summary.to_dict()

        @task
        def finalize(ref: dict[str, Any], copy: dict[str, Any]) -> str:
            from segrep.replication.publication import publish
            from segrep.split.run import finalize_split

            with segrep_context() as (defs, catalog):
                state = str(finalize_split(catalog, ref["split_id"], copy).state)
                for pub in publish(catalog, defs, name).sites:  # the children serve now
                    print(pub.line())
                return state

        @task
        def finish(ref: dict[str, Any]) -> dict[str, Any]:
            from segrep.replication.publication import publish
            from segrep.replication.unload import finish as run
            from segrep.split.progress import progress_text, split_progress
            from segrep.split.run import require_done

            with segrep_context() as (defs, catalog):
                finished = run(catalog, defs, ref["split_id"])
                progress = split_progress(catalog, name, include_done=True)
                for pub in publish(catalog, defs, name).sites:  # the parent's rows are gone from reads
                    print(pub.line())
            print(progress_text([r for r in progress if r.split_id == ref["split_id"]]))
            return require_done(finished, name).to_dict()

        ref = start()
        copy_plan = plan_task("copy")(ref)
        copy = spark_step(
            copy_plan,
            commit,
            group_id="copy_step",
            choose_id="copy_choose",
            spark_id="copy_rewrite",
            commit_id="copy_commit",
            name=f"segrep-split-rewrite-{name}",
            policy=policy,
        )
        finalized = finalize(ref, copy_plan)
        copy >> finalized
        unload_plan = plan_task("unload")(ref)
        finalized >> unload_plan
        unload = spark_step(
            unload_plan,
            commit,
            group_id="unload_step",
            choose_id="unload_choose",
            spark_id="unload_merge",
            commit_id="unload_commit",
            name=f"segrep-split-unload-{name}",
            policy=policy,
        )
        unload >> finish(ref)

    return split()


_defs = dag_definitions()  # invalid tables left out: dags/segrep_definitions.py reports them
for _table in tables_to_build(_defs, "segrep_split_"):  # a task builds only its own DAG
    globals()[f"segrep_split_{_table.name}"] = build_split_dag(_table)
