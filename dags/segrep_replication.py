"""
### segrep replication: one DAG per table policy

Each run replicates to every replica site the segments its table's leaders committed before the round's end:
a **scheduled** run ends at its data interval's end; a **manual** run (Trigger) ends at the moment it was
triggered, not at the end of the last whole interval before it. Steps (DESIGN sections 6 and 15), each one of
the package's round steps (`segrep.replication.orchestrator`, the same as `segrep round`):

1. **round** (a branch): reads the catalog, predicts every offer per target, leases the segments followers
   must push, writes the merge manifest when a chain has forked, and chooses the round's path from its size
   (retried as the policy says). A small round (its copies under the policy's `one_task_round_max_bytes`, its
   merge, if any, in process) runs whole right there: every target's fast-forward, the merge, the commit and
   the report, in one task process; the branch then goes to **done_in_round** (marked done by the scheduler,
   no process). The graph shows both paths; the one not taken is skipped.
2. A big round takes the other path: **`fast_forward_<site>`** (one task per site of the table; the branch runs
   those of the round's targets and skips the others: copies each new segment file, verifies it, registers it
   and moves the replica's root; no row is read; a target that is down fails only its own task, after retries
   with exponential back-off; each task runs in the Airflow pool of the link it crosses,
   `segrep_link_<from>_<to>`, when that link has `max_concurrent_copies`, else in `default_pool`: see
   docs/airflow.md; **copies_done** joins them), **merge** (SparkSubmitOperator, one Spark application for the
   whole round; skipped when nothing forked), **commit** (merge results, checkpoints, safe time, splits whose
   parents can go), **report**.
3. **round** (small) and **report** (big) log one line per target (copied, safe time, lag, still pending), send
   the metrics, emit an Asset event on `segrep://<site>/<table>` for each site whose safe time advanced, and
   fail the run if a target failed, a copied file failed verification, or a target ends behind the table's RPO
   (`policy: {rpo: 15m}`), naming the table, site and lag. The report commits again from the catalog
   (idempotent: after "Clear only failed tasks" it counts the re-run copies).

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

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import dag, task
from airflow.sdk.definitions.xcom_arg import XComArg

from segrep.config.definitions import Definitions, TableDef
from segrep.config.link_pools import copy_pool
from segrep_airflow import assets, lineage
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
from segrep_airflow.rounds import PLAN_KEY, ROUND_TASK, VIEW_KEY
from segrep_airflow.schedules import replication_schedule

IN_ONE_TASK = "done_in_round"  # the branch a small round takes: it ran whole in the task `round`
COPY_TASK_PREFIX = "fast_forward_"  # + a site: a big round's copies to that site
COPIES_DONE = "copies_done"  # the join after the copy tasks (no process)


def copy_task_id(site: str) -> str:
    return f"{COPY_TASK_PREFIX}{site}"


def build_replication_dag(table: TableDef, defs: Definitions):  # type: ignore[no-untyped-def]
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
        @task.branch(task_id=ROUND_TASK, outlets=[alias], **retry)
        def round_(
            ti: Any = None,
            task: Any = None,
            data_interval_start: Any = None,
            data_interval_end: Any = None,
            dag_run: Any = None,
            outlet_events: Any = None,
        ) -> list[str]:
            import structlog

            from segrep.replication.orchestrator import RoundPath, RoundSteps
            from segrep.replication.spacing import wait_for_spacing
            from segrep_airflow.rounds import retried, round_end
            from segrep_airflow.schedules import spacing_s

            p = form()
            run_type = getattr(dag_run, "run_type", None)
            end = round_end(run_type, getattr(dag_run, "run_after", None), data_interval_end)
            with segrep_context() as (defs, catalog):
                # on_write: a round starts at least min_interval after the previous one (bursts fold into it)
                waited = wait_for_spacing(catalog, name, spacing_s(defs.policy(name), run_type))
                steps = RoundSteps(catalog, defs, name, submit=hook_submit)
                planned = steps.plan(
                    to_us(end), start_us=to_us(data_interval_start), target=p["target"], reoffer=p["reoffer"]
                )
                ti.xcom_push(key=PLAN_KEY, value=planned.to_dict())
                spaced = f" (after {waited:.1f} s of spacing)" if waited else ""
                structlog.get_logger("segrep.round").info(f"{planned}{spaced}")
                if planned.path == RoundPath.MAPPED:  # the big path: its first tasks, only the targets' copies
                    return _big_path(task.downstream_task_ids, planned.plan.targets)
                # a small round: the rest of it here, no other task process (a retry is not held back by a back-off)
                view = steps.finish(planned, retry=retried(ti))
                lineage.rounds(catalog, [view.report])
                schema = assets.table_schema(catalog, name)
            ti.xcom_push(key=VIEW_KEY, value=_reported(view, outlet_events, schema))
            return [IN_ONE_TASK]

        def _big_path(downstream: set[str], targets: Any) -> list[str]:
            """The big path's first tasks: every task after ``round`` but the small path's and the copies to
            sites that are not targets of this round. A target without a copy task (the definitions changed
            since this DAG was parsed) fails the round by name rather than go uncopied."""
            missing = sorted(t for t in targets if copy_task_id(t) not in downstream)
            if missing:
                raise RuntimeError(
                    f"no copy task for target(s) {', '.join(missing)} of {name}: this DAG was built from definitions "
                    "where they are not sites of the table; it is built again from the file as it is now "
                    "within the dag-processor's interval (then clear this run)"
                )
            wanted = {copy_task_id(t) for t in targets}
            return sorted(t for t in downstream - {IN_ONE_TASK} if not t.startswith(COPY_TASK_PREFIX) or t in wanted)

        def fast_forward_to(target: str) -> Any:
            """The copy task to ``target``, in the pool of the link it crosses (none: Airflow's default pool)."""
            pool = copy_pool(defs, table, target)

            @task(task_id=copy_task_id(target), **({"pool": pool.name} if pool else {}), **retry)
            def fast_forward(ti: Any = None) -> dict[str, Any]:
                from segrep.replication.orchestrator import RoundSteps
                from segrep_airflow.rounds import required_plan, retried

                planned = required_plan(ti, name)
                with segrep_context() as (defs_now, catalog):
                    steps = RoundSteps(catalog, defs_now, name, submit=hook_submit)
                    report = steps.copy(planned, target, retry=retried(ti))  # a cleared task: the operator's retry
                return report.to_dict() if report is not None else {}

            return fast_forward()

        def commit(p: dict[str, Any], outlet_events: Any = None) -> dict[str, Any]:
            from segrep.replication.orchestrator import PlannedRound, RoundSteps

            with segrep_context() as (defs, catalog):
                report = RoundSteps(catalog, defs, name).commit(PlannedRound.from_dict(p))
                schema = assets.table_schema(catalog, name)
            if outlet_events is not None:
                assets.emit(outlet_events, report, report.advanced, schema)
            return report.to_dict()

        @task(trigger_rule="all_done_min_one_success", retries=0, outlets=[alias])
        def report(ti: Any = None, outlet_events: Any = None) -> dict[str, Any]:
            from segrep.replication.orchestrator import RoundSteps
            from segrep_airflow.rounds import required_plan

            planned = required_plan(ti, name)
            with segrep_context() as (defs, catalog):
                steps = RoundSteps(catalog, defs, name)
                view = steps.report(steps.commit(planned))
                lineage.rounds(catalog, [view.report])
                schema = assets.table_schema(catalog, name)
            return _reported(view, outlet_events, schema)

        def _reported(view: Any, outlet_events: Any, schema: Any) -> dict[str, Any]:
            """Log the round's lines, send its metrics and Asset events (with the table's schema), raise on its
            problems."""
            import structlog

            from segrep_airflow.metrics import emit_round

            # Logged, not printed: a task's stdout reaches its log through a pipe and is stamped when read,
            # after the task runner has opened its collapsed "Post Execute" group; a log record is stamped now.
            # Through structlog, as Airflow's own task lines are (a stdlib logger's INFO may be filtered out).
            log = structlog.get_logger("segrep.round")
            for line in str(view).splitlines():
                log.info(line)
            emit_round(view)
            if outlet_events is not None:
                assets.emit(outlet_events, view.report, view.report.advanced, schema)
            view.raise_on_problems()  # a failed target, a file that failed verification, a target behind its RPO
            return view.to_xcom()

        planned = round_()
        plan_doc = XComArg(planned.operator, key=PLAN_KEY)
        one_task = EmptyOperator(task_id=IN_ONE_TASK, doc_md="A small round ran whole in the task `round`.")
        # one copy task per site of the table (its leader too: a replica after a failover); a task's pool is
        # fixed at parse time, and Airflow cannot give each instance of a mapped task a pool of its own
        copied = [fast_forward_to(site) for site in sorted(table.sites)]
        # choose decides even when a target failed (all_done): the merge and commit concern the leader only.
        merged = spark_step(
            plan_doc,
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
        # The report waits for the copies through one join: a copy task the branch skipped (not a target) would
        # skip the report (all_done_min_one_success skips on a skipped upstream); a failed copy makes the join
        # upstream_failed, and the report still runs (commit succeeded) and fails the run naming the target.
        copies_done = EmptyOperator(
            task_id=COPIES_DONE,
            trigger_rule="none_failed_min_one_success",
            doc_md="Joins the copy tasks: skipped with them (a small round), upstream_failed when a copy failed.",
        )
        planned >> [one_task, *copied]
        copied >> merged
        copied >> copies_done
        [merged, copies_done] >> report()

    return replication()


_defs = dag_definitions()  # invalid tables left out: dags/segrep_definitions.py reports them
for _table in tables_to_build(_defs, "segrep_replicate_"):  # a task builds only its own DAG
    globals()[f"segrep_replicate_{_table.name}"] = build_replication_dag(_table, _defs)
