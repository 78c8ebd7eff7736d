"""The spark-submit command lines of the Spark jobs a task starts itself, through the Airflow connection
(``segrep_airflow.common.hook_submit``), compared with their expected files in tests/dags/expected/hook_submit/
as test_dag_integrity.py compares the SparkSubmitOperator tasks': the distributed copy of the replication DAG's
``fast_forward`` task, the digests of ``segrep_verify_<table>``, and the distributed copy of the bootstrap
DAG's ``catch_up`` task (``segrep.replication.join``).

Each test runs what the task runs, with SparkSubmitHook's ``submit`` replaced (tests/support/spark_hook.py):
the command the hook built is recorded, a copy is done in this process, the digests are not (no Spark here).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from segrep.catalog.apply import apply_definitions
from segrep.data.writer import write_batch
from segrep.maintenance.bootstrap import bootstrap
from segrep.maintenance.verify import verify
from segrep.maintenance.verify_spark import SparkDigests
from segrep.replication.fast_forward import fast_forward_target
from segrep.replication.join import catch_up, target_state
from segrep.replication.orchestrator import run_round
from segrep.replication.plan import plan_round
from segrep.replication.run import spark_copier
from tests.support.airflow import events_yaml
from tests.support.env import Env
from tests.support.golden import EXPECTED, PLACEHOLDERS, assert_matches_expected, machine_paths, normalise
from tests.support.rounds import no_spark
from tests.support.spark_hook import HookCall, SparkNotRun, capture_hook_submits
from tests.support.tables import batch

TABLE = "events"
SCHEDULE = {"schedule": "@hourly", "start_date": "2026-11-01"}
POLICY = {**SCHEDULE, "spark_copy_threshold_bytes": 1}  # every batch goes to Spark (the threshold is >= 1 byte)
JOBS = {
    "distributed_copy": "the replication DAG's fast_forward task: the distributed copy of a batch to `dr`",
    "verify_digests": "segrep_verify_events's verify task: the digests of the large partitions",
    "catch_up": "the bootstrap DAG's catch_up task: the distributed copy of a batch to `edge`, which joins",
}
UPDATE_HINT = "SEGREP_UPDATE_EXPECTED=1 pytest tests/dags/test_hook_commands.py"


def _expected_file(job: str) -> Path:
    return EXPECTED / "hook_submit" / f"{job}.txt"


def _compare(env: Env, call: HookCall, job: str, run_values: dict[str, str]) -> None:
    """The call's command, the run's own values (a round's end, a verify's key) and then this machine's paths
    replaced by placeholders, against the job's expected file; the hook's master and environment too."""
    assert call.master == "local[*]"  # from AIRFLOW_CONN_SPARK_DEFAULT
    assert set(call.env) >= {"SPARK_HOME", "PYSPARK_PYTHON", "PATH"} and call.env["PYSPARK_PYTHON"] == sys.executable
    got = normalise(normalise(call.command, run_values), machine_paths(env.root))
    header = [
        "# The spark-submit command line segrep_airflow.common.hook_submit has SparkSubmitHook build for",
        f"# {JOBS[job]}; one argument per line.",
        f"# Run-specific values: {', '.join(sorted(run_values.values()))}.",
        *PLACEHOLDERS,
        f"# If the command changes on purpose, rewrite the files: {UPDATE_HINT}",
    ]
    assert_matches_expected(got, _expected_file(job), header, UPDATE_HINT)


def first_copy(calls: list[HookCall], site: str) -> HookCall:
    """The first distributed copy of a round to ``site`` (the partitions of a target copy at once, so the
    hook's calls come in any order; the copier numbers them)."""
    return next(c for c in calls if c.command[-3].endswith(f"/copy-{site}-1.json"))


def test_every_hook_job_has_an_expected_command() -> None:
    assert {p.stem for p in (EXPECTED / "hook_submit").glob("*.txt")} == set(JOBS)  # no stale expectation


def test_the_distributed_copy_of_a_round(segrep_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from segrep_airflow.common import hook_submit

    env = segrep_env(POLICY, tables=(TABLE,))
    calls = capture_hook_submits(monkeypatch)
    write_batch(env.catalog, TABLE, batch(range(20), "a"))
    end = plan_round(env.catalog, env.defs, TABLE).end_us
    copier = spark_copier(env.defs, TABLE, end, "dr", hook_submit)  # as the fast_forward task does
    report = fast_forward_target(env.catalog, env.defs, TABLE, "dr", end, big_copier=copier)
    assert report.status == "ok" and report.segments_copied == 2, report
    assert report.spark_apps == len(calls) >= 1  # every batch went to the hook (and was copied)
    _compare(env, first_copy(calls, "dr"), "distributed_copy", {str(end): "{END_US}"})


def test_the_digests_of_a_verify(segrep_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from segrep_airflow.common import hook_submit

    env = segrep_env({**SCHEDULE, "verify_spark_threshold_bytes": 1}, tables=(TABLE,))
    write_batch(env.catalog, TABLE, batch(range(20), "a"))
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).status == "ok"
    calls = capture_hook_submits(monkeypatch)
    spark = SparkDigests.for_table(env.defs, TABLE, hook_submit)  # as the verify task does
    with pytest.raises(SparkNotRun):
        verify(env.catalog, TABLE, spark=spark)
    assert len(calls) == 1 and spark.manifest.is_file()  # one application for every large partition
    _compare(env, calls[0], "verify_digests", {spark.key: "{VERIFY_KEY}"})


def test_the_catch_up_of_a_joining_site(segrep_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from segrep_airflow.common import hook_submit

    doc = yaml.safe_load(events_yaml(SCHEDULE, tables=(TABLE,)))
    doc["tables"][TABLE]["replicas"] = ["dr"]
    env = segrep_env(yaml_text=yaml.safe_dump(doc, sort_keys=False))
    write_batch(env.catalog, TABLE, batch(range(20), "a"))
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).status == "ok"
    env.config.write_text(events_yaml(POLICY, tables=(TABLE,)))  # edge added; its copies go to Spark
    apply_definitions(env.catalog, env.defs)
    assert bootstrap(env.catalog, env.defs, TABLE, "edge", "auto").joining
    calls = capture_hook_submits(monkeypatch)
    reports = catch_up(env.catalog, env.defs, TABLE, "edge", submit=hook_submit)  # as the catch_up task does
    assert target_state(env.catalog, TABLE, "edge").caught_up, [r.to_dict() for r in reports]
    assert calls and all(Path(c.command[-5]).name == "distributed_copy.py" for c in calls)
    _compare(env, first_copy(calls, "edge"), "catch_up", {str(reports[0].end_us): "{END_US}"})
