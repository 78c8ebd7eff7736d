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

from segrep.config.definitions import load_definitions
from segrep_airflow.common import catalog_for, hook_submit

_defs = load_definitions()
CATCH_UP_ROUNDS = 5


@dag(
    dag_id="segrep_bootstrap",
    description="Join a replica site to a table (decision tree, then catch-up rounds)",
    doc_md=__doc__,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["segrep", "bootstrap"],
    params={
        "table": Param(
            next(iter(sorted(_defs.tables)), None),
            type="string",
            enum=sorted(_defs.tables),
            description="Table to join.",
        ),
        "site": Param(
            next(iter(sorted(_defs.sites)), None),
            type="string",
            enum=sorted(_defs.sites),
            description="Replica site to bring in.",
        ),
        "mode": Param(
            "auto",
            type="string",
            enum=["auto", "adopt", "replace"],
            description="What to do with data the site already holds.",
        ),
    },
    default_args={"retries": 0},
)
def segrep_bootstrap() -> None:
    @task
    def bootstrap(params: dict[str, Any] | None = None) -> dict[str, Any]:
        from segrep.maintenance.bootstrap import bootstrap as run

        p = params or {}
        defs = load_definitions()
        report = run(catalog_for(defs), defs, p["table"], p["site"], p["mode"])
        print("\n".join(report.lines()))
        return {"table": p["table"], "site": p["site"], "joining": report.joining}

    @task
    def catch_up(b: dict[str, Any]) -> list[dict[str, Any]]:
        from segrep.replication.run import format_report, run_round
        from segrep.replication.status import status_rows

        defs = load_definitions()
        catalog = catalog_for(defs)
        reports = []
        for _ in range(CATCH_UP_ROUNDS):
            report = run_round(catalog, defs, b["table"], target=b["site"], submit=hook_submit)
            print(format_report(report))
            reports.append({"status": report["status"], "targets": report.get("targets", {})})
            row = next(r for r in status_rows(catalog, b["table"]) if r["target"] == b["site"])
            if row["pending_segments"] == 0 and "joining" not in row["note"]:
                break
        return reports

    @task
    def report(b: dict[str, Any]) -> dict[str, Any]:
        from segrep.replication.status import status_rows

        defs = load_definitions()
        row = next(r for r in status_rows(catalog_for(defs), b["table"]) if r["target"] == b["site"])
        print(row)
        if "joining" in row["note"] or "NEEDS BOOTSTRAP" in row["note"]:
            raise RuntimeError(f"{b['site']} has not finished joining {b['table']}: {row['note']} (re-run)")
        return row

    joined = bootstrap()
    catch_up(joined) >> report(joined)


segrep_bootstrap()
