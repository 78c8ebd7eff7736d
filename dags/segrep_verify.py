"""
### segrep verify: every replica's rows and every file checked, one DAG per table

**verify** compares each replica placement's rows with its leader's as of the replica site's safe time
(digests, then the differing keys), and hashes every segment file against the catalog, paced
(`max_bytes_per_second`; default `$SEGREP_SCRUB_BYTES_PER_S` or 64 MiB/s). Partitions whose files reach the
policy's `verify_spark_threshold_bytes` are digested by one Spark application (`spark_jobs/verify.py`, through
the `spark_default` connection); the others in the task. The outcome is recorded per site in segrep's
catalog (`segrep status` shows it). The task **fails** when anything differs, naming each partition and site,
or file, in its log; `segrep repair <table>` mends it.

Trigger form: `files` (also scrub the files; default on), `max_bytes_per_second` (0: unpaced).
Schedule: the table policy's `verify_schedule` (default daily).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param, dag, task

from segrep.config.definitions import TableDef
from segrep.core.settings import MAX_SCRUB_BYTES_PER_S
from segrep_airflow.common import dag_definitions, hook_submit, segrep_context, tables_to_build, timetable, utc
from segrep_airflow.forms import flag, form


def build_verify_dag(table: TableDef):  # type: ignore[no-untyped-def]
    name, policy = table.name, table.policy

    @dag(
        dag_id=f"segrep_verify_{name}",
        description=f"Verify the replicas and files of {name}",
        doc_md=__doc__,
        schedule=timetable(policy.verify_schedule),
        start_date=utc(policy.start_date),
        catchup=False,
        max_active_runs=1,
        tags=["segrep", "verify", name],
        params={
            "files": flag(True, "Also hash every segment file against the catalog."),
            "max_bytes_per_second": Param(
                None,
                type=["null", "integer"],
                minimum=0,
                maximum=MAX_SCRUB_BYTES_PER_S,
                description="Pace the file scrub (0: unpaced). Empty: $SEGREP_SCRUB_BYTES_PER_S or 64 MiB/s.",
            ),
        },
        default_args={"retries": 0},
    )
    def verification() -> None:
        @task
        def verify() -> dict[str, Any]:
            from segrep.catalog.link_limits import definitions_limits, reader_site
            from segrep.maintenance.verify import verify as run
            from segrep.maintenance.verify_spark import SparkDigests
            from segrep.storage.pacing import scrub_rate

            params = form()
            rate = scrub_rate(params["max_bytes_per_second"])
            with segrep_context() as (defs, catalog):
                spark = SparkDigests.for_table(defs, name, hook_submit)
                links, reader = definitions_limits(defs), reader_site(defs)  # capped links: a scrub's share
                report = run(catalog, name, files=params["files"], rate=rate, spark=spark, reader=reader, links=links)
            print(report)
            if report.differences:
                problems = report.problems()
                raise RuntimeError(
                    f"verify of {name}: {report.differences} difference(s): {'; '.join(problems)}; "
                    f"run segrep repair {name}"
                )
            return {"differences": 0, "sites": report.sites, "spark_apps": report.spark_apps}

        verify()

    return verification()


_defs = dag_definitions()  # invalid tables left out: dags/segrep_definitions.py reports them
for _table in tables_to_build(_defs, "segrep_verify_"):  # a task builds only its own DAG
    globals()[f"segrep_verify_{_table.name}"] = build_verify_dag(_table)
