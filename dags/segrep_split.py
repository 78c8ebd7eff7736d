"""
### segrep split: split a partition while writes continue (EventQL 3.8)

Trigger it from the UI with the form: `table`, `partition` (its id: `segrep table describe TABLE` lists them),
`split_keys` (one or more keys of the partition key, strictly inside the partition's range) and `async`.
Leave `split_keys` empty to **resume** the partition's split where it stopped (after a failure, a leader
change, or a parent replica that was down).

1. **start**: the partition enters SPLITTING; one LOADING child per key range, with a placement at every site
   of the parent and its leader at the parent leader's site. Writes keep going to the parent.
2. **copy_plan → copy_rewrite → copy_commit**: the parent leader offers its chain to each child; the Spark job
   (SparkSubmitOperator) rewrites every segment a child lacks for the child's key range, keeping its
   `segment_id` and `base_segment_id`. Acked segments are never rewritten again, even by a new leader.
3. **finalize** (SPLIT_FINALIZE): writes switch to the children; the parent enters UNLOAD. An `async` split is
   finalized by **start** and skips the copy.
4. **unload_plan → unload_merge → unload_commit**: every parent replica pushes what the children still lack
   (writes that arrived during the copy, forks of a replica that was away); the children merge them, last
   writer wins, so rows updated after the split keep their newer values.
5. **finish** (UNLOAD_FINAL): the parent is retired and its files removed. If a parent replica could not push
   (its site is down) the run fails here saying so; trigger it again (without keys) when the site is back.

Scheduled replication rounds then carry the children to every replica site. `segrep status` shows each
split's state and, per child, the segments acked and still lacking.
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import Param, dag, task

from segrep.config.definitions import Policy, load_definitions
from segrep_airflow.common import catalog_for, merge_job

_defs = load_definitions()


@dag(
    dag_id="segrep_split",
    description="Split a partition while writes continue (rewrite on Spark, finalize, unload, retire)",
    doc_md=__doc__,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["segrep", "split"],
    params={
        "table": Param(
            next(iter(sorted(_defs.tables)), None), type="string", enum=sorted(_defs.tables),
            description="Table whose partition splits.",
        ),
        "partition": Param(1, type="integer", minimum=1, description="Partition id (segrep table describe)."),
        "split_keys": Param(
            [], type="array", items={"type": ["string", "integer", "number"]}, uniqueItems=True,
            description="Split keys inside the partition's range; empty resumes the partition's split.",
        ),
        "async": Param(False, type="boolean", description="Finalize at once; the data follows through UNLOAD."),
    },
    default_args={"retries": 0},
)  # fmt: skip
def segrep_split() -> None:
    @task
    def start(params: dict[str, Any] | None = None) -> dict[str, Any]:
        from dataclasses import asdict

        from segrep.core import faults
        from segrep.split.workflow import find_split, start_split

        p = params or {}
        defs = load_definitions()
        catalog = catalog_for(defs)
        table, partition, keys = p["table"], int(p["partition"]), list(p.get("split_keys") or [])
        if keys:
            ref = start_split(catalog, table, partition, keys, is_async=bool(p.get("async")))
        else:
            ref = find_split(catalog, table, partition)
        faults.point("split_after_start")
        print(f"split {ref.split_id} of {table} partition {partition}: {ref.state}, children {ref.children}")
        return asdict(ref)

    def plan_task(phase: str) -> Any:
        @task(task_id=f"{phase}_plan")
        def plan(ref: dict[str, Any]) -> dict[str, Any]:
            from segrep.split.workflow import plan_pass

            defs = load_definitions()
            planned = plan_pass(catalog_for(defs), defs, ref["split_id"], phase).to_dict()
            print(planned)
            return planned

        return plan

    def choose_task(task_id: str, run: str, skip: str) -> Any:
        @task.branch(task_id=task_id)
        def choose(p: dict[str, Any]) -> str:
            return run if p["manifest"] else skip

        return choose

    def commit_task(task_id: str) -> Any:
        @task(task_id=task_id, trigger_rule="none_failed_min_one_success")
        def commit(p: dict[str, Any]) -> dict[str, Any]:
            from segrep.split.workflow import commit_pass

            summary = commit_pass(catalog_for(load_definitions()), p)
            print(summary)
            return summary.to_dict()

        return commit

    @task
    def finalize(ref: dict[str, Any], p: dict[str, Any]) -> str:
        from segrep.core import faults
        from segrep.split.workflow import finalize as run

        state = run(catalog_for(load_definitions()), ref["split_id"], p["cut_entry_id"] or None).state
        faults.point("split_after_finalize")
        return state

    @task
    def finish(ref: dict[str, Any]) -> dict[str, Any]:
        from segrep.cli.format import format_progress
        from segrep.core.states import SplitState
        from segrep.split.progress import split_progress
        from segrep.split.workflow import finish as run

        defs = load_definitions()
        catalog = catalog_for(defs)
        result = run(catalog, defs, ref["split_id"])
        progress = split_progress(catalog, ref["table"], include_done=True)
        print(format_progress([r for r in progress if r.split_id == ref["split_id"]]))
        if result.state != SplitState.DONE:
            raise RuntimeError(
                f"split {ref['split_id']} of {ref['table']} waits for {result.waiting}: a parent replica could "
                "not push yet (its site is down?); trigger this DAG again without split keys to resume"
            )
        return result.to_dict()

    policy = Policy()
    ref = start()
    copy_plan = plan_task("copy")(ref)
    copy_rewrite = merge_job("copy_rewrite", "copy_plan", "segrep-split-rewrite", policy)
    copy_commit = commit_task("copy_commit")(copy_plan)
    choose_task("copy_choose", "copy_rewrite", "copy_commit")(copy_plan) >> [copy_rewrite, copy_commit]
    copy_rewrite >> copy_commit
    finalized = finalize(ref, copy_plan)
    copy_commit >> finalized
    unload_plan = plan_task("unload")(ref)
    finalized >> unload_plan
    unload_merge = merge_job("unload_merge", "unload_plan", "segrep-split-unload", policy)
    unload_commit = commit_task("unload_commit")(unload_plan)
    choose_task("unload_choose", "unload_merge", "unload_commit")(unload_plan) >> [unload_merge, unload_commit]
    unload_merge >> unload_commit
    unload_commit >> finish(ref)


segrep_split()
