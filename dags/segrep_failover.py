"""
### segrep failover: move tables' leadership to another site (DESIGN section 11)

Manual. Trigger it from the UI with the form: `tables` (one or more), `site` (empty: the most advanced live
replica, for a failover), `action` (`failover`: unplanned, works while the leader's site is down; or
`switchover`: planned, nothing lost), `at` (`latest`: the new leader keeps everything it holds) and
`dry_run` (**true by default**: only the assessment runs).

1. **assess**: the site chosen and why, every candidate, and the loss partition by partition (segments,
   rows, bytes, row-version range: the RPO, exact), printed in the task log, returned as its XCom, and set
   as the run's note through Airflow's REST API (connection `segrep_airflow_api`, see docs/airflow.md).
2. **choose**: a dry run stops here (report); otherwise **failover** or **switchover**.
3. **failover**: per table one transaction moves every leader and raises its epoch (a writer or round of
   the old epoch cannot commit any more). **switchover**: writes pause (writers get a retryable error),
   rounds drain the new leader, the leaders move, writes resume there; on timeout nothing changes.
4. **verify**: each table is read at its new leader, and one round replicates from it (replicas take the
   new epoch; a site that is down is reported, not waited for).
5. **report**: what was done, in the task log.

Writers and the replication DAGs follow the catalog's leaders: no definitions change is needed. When the
old leader's site returns, rounds handle what it alone held by the table's `policy.on_return`.
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import Param, dag, task

from segrep_airflow import lineage
from segrep_airflow.common import dag_definitions, segrep_context
from segrep_airflow.forms import duration, every_or_one, flag, form


def build_failover_dag(tables: list[str], sites: list[str]):  # type: ignore[no-untyped-def]
    @dag(
        dag_id="segrep_failover",
        description="Fail over or switch over tables' leadership to another site (assess first: dry run)",
        doc_md=__doc__,
        schedule=None,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        tags=["segrep", "failover"],
        params={
            "tables": Param(
                tables,
                type="array",
                items={"type": "string", "enum": tables},
                minItems=1,
                uniqueItems=True,
                description="The tables whose leadership moves (together, to one site). Default: all.",
            ),
            "site": every_or_one(
                sites,
                every="the most advanced live replica",
                description="The new leader. Empty: the most advanced live replica (failover only).",
            ),
            "action": Param(
                "failover",
                type="string",
                enum=["failover", "switchover"],
                description="failover: unplanned, works while the leader is down; switchover: planned, nothing lost.",
            ),
            "at": Param(
                "latest",
                type="string",
                enum=["latest", "safe-time"],
                description="latest: keep all the new leader holds; safe-time: the rows as of the tables' safe time",
            ),
            "dry_run": flag(True, "Only assess (the loss, per partition)."),
            "timeout": duration("10m", "Switchover: give up (and resume writes) after this long, e.g. 90s, 10m, 1h."),
        },
        default_args={"retries": 0},
    )
    def failover_dag() -> None:
        @task
        def assess(dag_run: Any = None) -> dict[str, Any]:
            from segrep.core.errors import SegrepError
            from segrep.failover.promote import Cut, failover
            from segrep_airflow.run_note import api_access, set_run_note

            p = form()
            if p["action"] == "switchover" and not p["site"]:
                raise SegrepError("a switchover needs the site that takes the lead")
            with segrep_context() as (defs, catalog):
                report = failover(catalog, defs, p["tables"], to=p["site"] or None, cut=Cut(p["at"]), dry_run=True)
                lineage.failover(catalog, report)
            text = str(report)
            print(text)
            if dag_run is not None:  # the loss, where the run's page shows it first
                print(set_run_note(api_access(), dag_run.dag_id, dag_run.run_id, text).detail)
            return {**p, "site": report.to_site, "assessment": report.to_dict()}

        @task.branch
        def choose(plan: dict[str, Any]) -> list[str]:
            # "report" stays chosen either way: it waits for verify (a failed move fails the run there)
            return ["report"] if plan["dry_run"] else [str(plan["action"]), "report"]

        @task(task_id="failover")
        def promote(plan: dict[str, Any]) -> dict[str, Any]:
            from segrep.failover.promote import Cut, failover
            from segrep_airflow.common import hook_submit

            with segrep_context() as (defs, catalog):
                report = failover(
                    catalog, defs, plan["tables"], to=plan["site"], cut=Cut(plan["at"]), submit=hook_submit
                )
                lineage.failover(catalog, report)
            print(report)
            return report.to_dict()

        @task(task_id="switchover")
        def switch(plan: dict[str, Any]) -> dict[str, Any]:
            from segrep.config.policy import parse_duration_s
            from segrep.failover.switchover import switchover
            from segrep_airflow.common import hook_submit

            seconds = parse_duration_s(plan["timeout"], "timeout")
            with segrep_context() as (defs, catalog):
                report, drained = switchover(
                    catalog, defs, plan["tables"], plan["site"], timeout_s=seconds, submit=hook_submit
                )
                lineage.failover(catalog, report)
            for d in drained:
                print(d)
            print(report)
            return report.to_dict()

        @task(trigger_rule="none_failed_min_one_success")
        def verify(plan: dict[str, Any]) -> list[str]:
            from airflow.sdk.exceptions import AirflowSkipException

            from segrep.data.reader import read_table
            from segrep.replication.orchestrator import run_round
            from segrep_airflow.common import hook_submit

            if plan["dry_run"]:  # `assess` is upstream too (its XCom): the branch alone would not skip this
                raise AirflowSkipException("a dry run moves nothing")
            lines = []
            with segrep_context() as (defs, catalog):
                for table in plan["tables"]:
                    rows = read_table(catalog, table).num_rows  # every file at the new leader checked on the way
                    report = run_round(catalog, defs, table, submit=hook_submit)
                    lineage.rounds(catalog, [report])
                    print(str(report))
                    failed = ", ".join(report.failed) or "none"
                    lines.append(f"{table}: {rows:,} rows at {plan['site']}; round {report.status}, failed: {failed}")
            print("\n".join(lines))
            return lines

        @task(trigger_rule="none_failed_min_one_success")
        def report(plan: dict[str, Any]) -> str:
            action = "assessed (dry run)" if plan["dry_run"] else f"{plan['action']} done"
            text = f"{', '.join(plan['tables'])} -> {plan['site']}: {action}"
            print(text)
            return text

        plan = assess()
        branch = choose(plan)
        moved = [promote(plan), switch(plan)]
        checked = verify(plan)
        done = report(plan)
        branch >> moved
        branch >> done
        moved >> checked >> done

    return failover_dag()


_defs = dag_definitions()
if _defs is not None and _defs.tables:
    segrep_failover = build_failover_dag(sorted(_defs.tables), sorted(_defs.sites))
