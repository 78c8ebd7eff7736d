"""The DAG folder parses cleanly and the replication DAG is wired as designed (no Spark, no scheduler)."""

from __future__ import annotations

import copy
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import DAGS, EVENTS_DAG, REPO, load_dag

DEFAULT_CONFIG = REPO / "include" / "segrep.yaml"
EXPECTED = Path(__file__).parent / "expected"
TASKS = {"plan", "targets_of", "fast_forward", "choose", "merge", "commit", "report"}
UPSTREAM = {
    "plan": set(),
    "targets_of": {"plan"},
    "fast_forward": {"plan", "targets_of"},
    "choose": {"plan", "fast_forward"},
    "merge": {"choose"},
    "commit": {"plan", "choose", "merge"},
    "report": {"commit", "fast_forward"},
}
TRIGGER_RULES = {
    "plan": "all_success",
    "targets_of": "all_success",
    "fast_forward": "all_success",
    "choose": "all_done",  # decides even when a target failed
    "merge": "all_success",
    "commit": "none_failed_min_one_success",  # runs after merge, or after choose skipped merge
    "report": "all_done",  # always reports; fails the run if a target failed
}


@pytest.fixture
def default_definitions(airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SEGREP_CONFIG", str(DEFAULT_CONFIG))
    monkeypatch.delenv("SEGREP_CATALOG_URL", raising=False)  # parsing must not need a catalog
    return DEFAULT_CONFIG


def test_default_definitions_parse_fast_and_clean(default_definitions: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag  # imported first so the timing measures the parse only

    started = time.perf_counter()
    bag = DagBag(dag_folder=str(DAGS))
    elapsed = time.perf_counter() - started

    assert bag.import_errors == {}
    assert [d for d in bag.dag_ids if d.startswith("segrep_replicate_")] == ["segrep_replicate_orders"]
    assert elapsed < 5, f"parsing {DAGS} took {elapsed:.1f} s"
    stats = [s for s in bag.dagbag_stats if s.file.endswith("segrep_replication.py")]
    assert len(stats) == 1 and stats[0].dag_num == 1 and stats[0].duration.total_seconds() < 5


def test_replication_dag_structure(default_definitions: Path) -> None:
    import pendulum
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from airflow.sdk import CronDataIntervalTimetable

    dag = load_dag("segrep_replicate_orders")

    assert set(dag.task_ids) == TASKS
    assert {t: set(dag.get_task(t).upstream_task_ids) for t in TASKS} == UPSTREAM
    assert {t: getattr(dag.get_task(t).trigger_rule, "value", None) for t in TASKS} == TRIGGER_RULES
    assert dag.get_task("fast_forward").is_mapped
    assert not any(dag.get_task(t).is_mapped for t in TASKS - {"fast_forward"})
    assert isinstance(dag.get_task("merge"), SparkSubmitOperator)
    # Policy defaults (include/segrep.yaml sets none): 3 retries; the report never retries.
    assert dag.get_task("fast_forward").partial_kwargs["retries"] == 3
    assert dag.get_task("merge").retries == 3
    assert dag.get_task("report").retries == 0
    assert dag.get_task("plan").retries == 0

    assert dag.catchup is True
    assert dag.max_active_runs == 1
    assert dag.doc_md and "fast_forward" in dag.doc_md
    assert "--reprocess-behavior failed --max-active-runs 1" in dag.doc_md  # a backfill replays in order
    assert dag.description == "Replicate orders from primary to dr"
    assert set(dag.tags) == {"segrep", "replication", "orders"}
    assert isinstance(dag.timetable, CronDataIntervalTimetable)
    assert (dag.timetable.expression, str(dag.timetable.timezone)) == ("0 * * * *", "UTC")  # @hourly
    assert dag.start_date == pendulum.datetime(2026, 11, 1, tz="UTC")
    assert dag.end_date is None

    params = dag.params
    assert set(params.keys()) == {"target", "reoffer"}
    target = params.get_param("target")
    assert target.value is None
    assert target.schema["type"] == ["null", "string"]
    assert target.schema["enum"] == [None, "dr"]
    reoffer = params.get_param("reoffer")
    assert reoffer.value is False
    assert reoffer.schema["type"] == "boolean"


def test_fixed_interval_policy_with_date_times(segrep_env: Any) -> None:
    import pendulum
    from airflow.sdk import DeltaDataIntervalTimetable

    segrep_env({"schedule": "10s", "start_date": "2026-11-22T08:00:00+00:00",
                "end_date": "2026-11-22T08:01:00", "retries": 1, "retry_delay_s": 0})  # fmt: skip
    dag = load_dag(EVENTS_DAG)

    assert isinstance(dag.timetable, DeltaDataIntervalTimetable)
    assert dag.timetable.delta == timedelta(seconds=10)
    assert dag.start_date == pendulum.datetime(2026, 11, 22, 8, 0, tz="UTC")
    assert dag.end_date == pendulum.datetime(2026, 11, 22, 8, 1, tz="UTC")  # naive date-times are UTC
    assert dag.params.get_param("target").schema["enum"] == [None, "dr", "edge"]
    assert dag.get_task("fast_forward").partial_kwargs["retries"] == 1
    assert dag.description == "Replicate events from primary to dr, edge"


def _catalog_dump(env: Any) -> dict[str, list[tuple[Any, ...]]]:
    from sqlalchemy import select

    from segrep.catalog import models as m

    with env.catalog.read() as s:
        return {t.name: sorted(map(tuple, s.execute(select(t)).all()), key=repr) for t in m.Base.metadata.sorted_tables}


def _files(root: Path) -> list[str]:
    """Every file under the environment but the catalog database itself (compared row by row instead)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "catalog.db" not in p.name)


def _airflow_rows(dag_id: str) -> tuple[int, int]:
    """How many DAG runs and task instances of ``dag_id`` Airflow's metadata database holds."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    with create_session() as session:
        runs = session.scalar(select(func.count()).select_from(DagRun).where(DagRun.dag_id == dag_id))
        tis = session.scalar(select(func.count()).select_from(TaskInstance).where(TaskInstance.dag_id == dag_id))
    return int(runs or 0), int(tis or 0)


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"target": "nowhere"}, "target"),
        ({"target": "primary"}, "target"),  # a site, but not a replica of the table
        ({"reoffer": "yes"}, "reoffer"),
    ],
)
def test_malformed_params_are_rejected_before_any_task(segrep_env: Any, conf: dict[str, Any], message: str) -> None:
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.exceptions import ParamValidationError
    from airflow.utils.types import DagRunTriggeredByType

    env = segrep_env({"schedule": "@hourly", "start_date": "2026-11-01"})
    dag = load_dag(EVENTS_DAG)
    catalog_before, files_before = _catalog_dump(env), _files(env.root)
    runs_before, tis_before = _airflow_rows(dag.dag_id)

    with pytest.raises(ParamValidationError, match=message):
        dag.test(logical_date=None, run_conf=conf)
    with pytest.raises(ParamValidationError, match=message):  # what `airflow dags trigger -c` and the API call
        trigger_dag(dag.dag_id, conf=conf, triggered_by=DagRunTriggeredByType.CLI)

    assert _airflow_rows(dag.dag_id) == (runs_before, tis_before)  # no run was created, no task ran
    assert _catalog_dump(env) == catalog_before
    assert _files(env.root) == files_before


def _normalise(args: list[str], replacements: dict[str, str]) -> list[str]:
    out = []
    for arg in args:
        for real, placeholder in replacements.items():
            arg = arg.replace(real, placeholder)
        out.append(arg)
    return out


def test_merge_spark_submit_command_matches_expectation(segrep_env: Any, tmp_path: Path) -> None:
    """Render the merge task's templates for a sample plan XCom and build the command line the hook would run."""
    env = segrep_env({"schedule": "@hourly", "start_date": "2026-11-01"})
    dag = load_dag(EVENTS_DAG)
    round_dir = env.root / "data" / "work" / "rounds" / "events" / "1795334400000000"
    plan_xcom = {"manifest": str(round_dir / "merge-manifest.json"), "result": str(round_dir / "merge-result.json")}

    class _TI:
        def xcom_pull(self, task_ids: str, **_: Any) -> Any:
            assert task_ids == "plan"
            return plan_xcom

    merge = copy.copy(dag.get_task("merge"))
    merge.render_template_fields({"ti": _TI(), "params": dict(dag.params)})
    hook = merge._get_hook()
    command = hook._build_spark_submit_command(merge.application)

    assert hook._connection["master"] == "local[*]"  # from AIRFLOW_CONN_SPARK_DEFAULT
    assert set(hook._env or {}) >= {"SPARK_HOME", "PYSPARK_PYTHON", "PATH"}
    assert hook._env["PYSPARK_PYTHON"] == sys.executable
    venv_bin = Path(sys.executable).parent
    got = _normalise(
        command,
        {
            sys.executable: "{PYTHON}",
            str(venv_bin): "{VENV_BIN}",
            str(env.root): "{ENV_ROOT}",
            str(REPO): "{REPO}",
        },
    )
    expected_file = EXPECTED / "merge_spark_submit.txt"
    header = [line for line in expected_file.read_text().splitlines() if line.startswith("#")]
    if os.environ.get("SEGREP_UPDATE_EXPECTED") == "1":  # a deliberate change: rewrite the expectation
        expected_file.write_text("\n".join([*header, *got]) + "\n")
    expected = [line for line in expected_file.read_text().splitlines() if line and not line.startswith("#")]
    assert got == expected, "the merge task's command line changed (SEGREP_UPDATE_EXPECTED=1 rewrites " + str(
        expected_file.relative_to(REPO)) + "):\n" + "\n".join(got)  # fmt: skip
