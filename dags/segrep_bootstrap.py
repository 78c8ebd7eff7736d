"""
### segrep bootstrap: join a replica site to a table that already holds data

Trigger it from the UI with the form: `table`, `site` (a replica site of that table in the definitions
file) and `mode`:
- `auto`: a target that already holds files of the table is refused (nothing changes);
- `adopt`: such files are kept if they resolve to exactly the leader's rows, refused otherwise;
- `replace`: such files are moved aside under `.replaced/` on the site (never deleted).
A replica that fell out of retention (see `segrep status`) is re-bootstrapped under a new placement id.

Tasks: **bootstrap** (the decision tree, all or nothing) → **catch_up** (replication rounds for that site only:
the newest major segment first, then its minors; large copies go through the Spark distributed copy; writes
continue meanwhile) → **report** (fails unless every placement at the site is LIVE: JOIN_FINALIZE).
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import Param, dag, task

from segrep.config.definitions import Definitions
from segrep_airflow import lineage
from segrep_airflow.common import dag_definitions, hook_submit, segrep_context
from segrep_airflow.forms import form


def bootstrap_params(defs: Definitions) -> dict[str, Param]:
    """The form: a valid table, a site that is a replica of some table (a leader-only site never bootstraps;
    the bootstrap task refuses a site that is not a replica of the chosen table), a mode."""
    tables = sorted(defs.tables)
    replica_sites = sorted({site for table in defs.tables.values() for site in table.replicas})
    return {
        "table": Param(
            next(iter(tables), None), type="string", enum=tables, description="Table to join (a valid table)."
        ),
        "site": Param(
            next(iter(replica_sites), None),
            type="string",
            enum=replica_sites,
            description="Replica site to bring in: a replica of the table, never its leader.",
        ),
        "mode": Param(
            "auto",
            type="string",
            enum=["auto", "adopt", "replace"],
            description="What to do with data the site already holds.",
        ),
    }


_defs = dag_definitions()  # invalid tables left out: dags/segrep_definitions.py reports them


@dag(
    dag_id="segrep_bootstrap",
    description="Join a replica site to a table (decision tree, then catch-up rounds)",
    doc_md=__doc__,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["segrep", "bootstrap"],
    params=bootstrap_params(_defs) if _defs else {},
    default_args={"retries": 0},
)
def segrep_bootstrap() -> None:
    @task
    def bootstrap() -> dict[str, Any]:
        from segrep.maintenance.bootstrap import bootstrap as run

        p = form()
        with segrep_context() as (defs, catalog):
            report = run(catalog, defs, p["table"], p["site"], p["mode"])
            lineage.bootstrap(catalog, report)
        print("\n".join(report.lines()))
        return {"table": p["table"], "site": p["site"], "joining": report.joining}

    @task
    def catch_up(b: dict[str, Any]) -> list[dict[str, Any]]:
        from segrep.replication.join import catch_up as run_catch_up

        with segrep_context() as (defs, catalog):
            reports = run_catch_up(catalog, defs, b["table"], b["site"], submit=hook_submit)
            lineage.rounds(catalog, reports)
        for r in reports:
            print(str(r))
        return [r.to_dict() for r in reports]

    @task
    def report(b: dict[str, Any]) -> dict[str, Any]:
        from segrep.replication.join import target_state

        with segrep_context() as (_defs, catalog):
            state = target_state(catalog, b["table"], b["site"])
        print(state)
        if state.joining or state.needs_bootstrap:
            raise RuntimeError(f"{b['site']} has not finished joining {b['table']}: {state.note()} (re-run)")
        return state.to_dict()

    joined = bootstrap()
    catch_up(joined) >> report(joined)


if _defs is not None:
    segrep_bootstrap()
