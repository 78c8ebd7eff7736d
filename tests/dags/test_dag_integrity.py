"""The DAG folder parses cleanly and the replication DAG is wired as designed (no Spark, no scheduler)."""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from segrep.storage.workdir import compaction_paths, manifest_path, result_path, split_pass_paths
from tests.support.airflow import DAGS, EVENTS_DAG, REPO, airflow_rows, load_dag, load_dagbag, made_nothing
from tests.support.golden import EXPECTED, PLACEHOLDERS, assert_matches_expected, machine_paths, normalise

DEFAULT_CONFIG = REPO / "include" / "segrep.yaml"
# one copy task per site of the table (orders: primary -> dr; the leader's is used after a failover)
COPIES = {"fast_forward_dr", "fast_forward_primary"}
TASKS = {"round", "done_in_round", *COPIES, "copies_done", "choose", "merge", "commit", "report"}
UPSTREAM = {
    "round": set(),
    "done_in_round": {"round"},  # a small round ran whole in the task round
    **{copy: {"round"} for copy in COPIES},
    "choose": {"round", *COPIES},
    "merge": {"choose"},
    "commit": {"round", "choose", "merge"},
    "copies_done": COPIES,  # an EmptyOperator: the report waits for the copies through it
    "report": {"commit", "copies_done"},
}
TRIGGER_RULES = {
    "round": "all_success",
    "done_in_round": "all_success",
    **{copy: "all_success" for copy in COPIES},
    # skipped with all the copies (a small round), upstream_failed when one failed; not skipped by the copies
    # the branch skipped (sites not targets of the round), which would skip the report
    "copies_done": "none_failed_min_one_success",
    "choose": "all_done",  # decides even when a target failed
    "merge": "all_success",
    "commit": "none_failed_min_one_success",  # runs after merge, or after choose skipped merge
    # reports once commit ran, whatever a target did (fails the run if a target failed); skipped with the
    # mapped path when the plan chose the one-task round
    "report": "all_done_min_one_success",
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


# Every DAG the default definitions (include/segrep.yaml: one table, orders) make. A DAG file that fails to
# import makes no DAG, so the list is spelled out: a missing id fails here even if nothing else notices.
DEFAULT_DAGS = {
    "segrep_bootstrap": "segrep_bootstrap.py",
    "segrep_failover": "segrep_failover.py",
    "segrep_maintain_orders": "segrep_maintenance.py",
    "segrep_replicate_orders": "segrep_replication.py",
    "segrep_split_orders": "segrep_split.py",
    "segrep_verify_orders": "segrep_verify.py",
    "segrep_watchdog": "segrep_watchdog.py",  # one for every table: their replicas against their RPO
    "segrep_example_fresh_replica": "segrep_fresh_replica.py",  # dags/examples/: the asset consumer
}


DEFINITIONS_FILE = "segrep_definitions.py"  # builds no DAG: it reports the definitions' problems (one import error)


def test_default_definitions_make_every_expected_dag(default_definitions: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS))

    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == sorted(DEFAULT_DAGS)
    for dag_id, file in DEFAULT_DAGS.items():
        dag = bag.dags[dag_id]
        assert Path(dag.fileloc).name == file, dag_id
        assert dag.tags and "segrep" in dag.tags, f"{dag_id} has no tags"
        assert dag.doc_md and dag.doc_md.strip().startswith("###"), f"{dag_id} has no doc_md"
        assert dag.description, f"{dag_id} has no description"
    stats = {Path(s.file).name: s.dag_num for s in bag.dagbag_stats}
    assert stats == {**{file: 1 for file in DEFAULT_DAGS.values()}, DEFINITIONS_FILE: 0}


# The "branch -> SparkSubmitOperator -> commit" task groups (segrep_airflow.common.spark_step) of each DAG.
SPARK_STEPS = {
    "segrep_bootstrap": {},
    "segrep_failover": {},  # its switchover and verify tasks start rounds, whose Spark work goes by hook_submit
    "segrep_replicate_orders": {"merge_step": ("choose", "merge", "commit")},
    "segrep_maintain_orders": {"compact_step": ("choose", "compact", "commit_compaction")},
    "segrep_split_orders": {
        "copy_step": ("copy_choose", "copy_rewrite", "copy_commit"),
        "unload_step": ("unload_choose", "unload_merge", "unload_commit"),
    },
    "segrep_verify_orders": {},  # its one task starts the digest application itself (hook_submit)
    "segrep_watchdog": {},
    "segrep_example_fresh_replica": {},
}


def test_every_spark_task_sits_in_a_branch_spark_commit_group(default_definitions: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    bag = DagBag(dag_folder=str(DAGS))

    assert set(SPARK_STEPS) == set(bag.dag_ids)
    for dag_id, steps in SPARK_STEPS.items():
        dag = bag.dags[dag_id]
        groups = {gid: g for gid, g in dag.task_group.get_task_group_dict().items() if gid}
        assert set(groups) == set(steps), dag_id
        spark_tasks = {t.task_id for t in dag.tasks if isinstance(t, SparkSubmitOperator)}
        assert spark_tasks == {spark for _choose, spark, _commit in steps.values()}, dag_id
        for gid, (choose, spark, commit) in steps.items():
            assert set(groups[gid].children) == {choose, spark, commit} and not groups[gid].prefix_group_id
            assert dag.get_task(spark).upstream_task_ids == {choose}
            assert dag.get_task(commit).upstream_task_ids >= {choose, spark}
            assert dag.get_task(commit).trigger_rule == "none_failed_min_one_success"
            assert dag.get_task(spark).retries == 3  # the orders policy (include/segrep.yaml sets the default)


def test_parsing_builds_no_catalog_and_opens_no_connection(
    default_definitions: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DAG files read the definitions file and nothing else at parse time: no catalog engine, no socket, no
    subprocess (SEGREP_CATALOG_URL points at a server that must not be contacted)."""
    import socket
    import subprocess

    from airflow.dag_processing.dagbag import DagBag

    from segrep.catalog import engine

    calls: list[str] = []

    def refuse(what: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(what)
            raise AssertionError(f"{what} at parse time")

        return call

    monkeypatch.setenv("SEGREP_CATALOG_URL", "postgresql+psycopg://nobody@192.0.2.1:5432/nothing")
    monkeypatch.setattr(engine, "make_engine", refuse("a catalog engine"))
    monkeypatch.setattr(engine.Catalog, "__init__", refuse("a catalog"))
    monkeypatch.setattr(socket.socket, "connect", refuse("a network connection"))
    monkeypatch.setattr(subprocess, "Popen", refuse("a subprocess"))
    bag = DagBag(dag_folder=str(DAGS))

    assert bag.import_errors == {} and calls == []
    assert sorted(bag.dag_ids) == sorted(DEFAULT_DAGS)


def test_segrep_context_disposes_the_catalog_whatever_happens(segrep_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from segrep.catalog import Catalog
    from segrep_airflow.common import segrep_context

    env = segrep_env()
    disposed: list[Catalog] = []
    real_dispose = Catalog.dispose
    monkeypatch.setattr(Catalog, "dispose", lambda self: (disposed.append(self), real_dispose(self))[1])

    with segrep_context() as (defs, catalog):
        assert defs.path == env.config.resolve() and catalog.url == env.url
        with catalog.read() as s:
            assert s.connection() is not None
    assert disposed == [catalog]
    with pytest.raises(RuntimeError, match="task failed"), segrep_context() as (_defs, failing):
        raise RuntimeError("task failed")
    assert disposed == [catalog, failing]


def test_a_task_refuses_a_catalog_missing_a_table(segrep_env: Any) -> None:
    """As the CLI does: a round's tasks must not copy and then fail at the table the round writes last."""
    from sqlalchemy import text

    from segrep.core.errors import SegrepError
    from segrep_airflow.common import segrep_context

    env = segrep_env()
    with env.catalog.write() as s:
        s.execute(text("DROP TABLE round_targets"))
    damaged = r"is damaged: its schema lacks the table\(s\) round_targets"
    with pytest.raises(SegrepError, match=damaged), segrep_context():
        raise AssertionError("the task ran")


def test_replication_dag_structure(default_definitions: Path) -> None:
    import pendulum
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import CronDataIntervalTimetable

    dag = load_dag("segrep_replicate_orders")

    assert set(dag.task_ids) == TASKS
    assert {t: set(dag.get_task(t).upstream_task_ids) for t in TASKS} == UPSTREAM
    assert {t: getattr(dag.get_task(t).trigger_rule, "value", None) for t in TASKS} == TRIGGER_RULES
    assert not any(dag.get_task(t).is_mapped for t in TASKS)  # Airflow cannot pool a mapped instance apart
    assert {dag.get_task(t).pool for t in TASKS} == {"default_pool"}  # include/segrep.yaml defines no link
    assert isinstance(dag.get_task("merge"), SparkSubmitOperator)
    # Policy defaults (include/segrep.yaml sets none): 3 retries; the report never retries.
    assert {dag.get_task(t).retries for t in COPIES} == {3}
    assert dag.get_task("merge").retries == 3
    assert dag.get_task("report").retries == 0
    assert dag.get_task("round").retries == 3  # plan_round finds its round again, every step is idempotent
    # round is a branch: the graph shows the one-task path and the mapped path side by side; a small round
    # runs whole in it, and the branch it takes then (an EmptyOperator) costs no task process
    assert dag.get_task("round").downstream_task_ids == {"done_in_round", *COPIES, "choose", "commit"}
    assert isinstance(dag.get_task("done_in_round"), EmptyOperator)
    group = dag.task_group.get_task_group_dict()["merge_step"]  # segrep_airflow.common.spark_step
    assert set(group.children) == {"choose", "merge", "commit"} and not group.prefix_group_id

    assert dag.catchup is False  # a round copies all committed before its end: no empty intervals replayed
    assert dag.max_active_runs == 1
    assert dag.doc_md and "fast_forward" in dag.doc_md and "one_task_round_max_bytes" in dag.doc_md
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
    # the form's label for null (the UI reads values_display["null"]), not a literal "null"
    assert target.schema["values_display"]["null"] == "every replica site"
    reoffer = params.get_param("reoffer")
    assert reoffer.value is False
    # a switch that is not marked required: no "type" (the UI marks a type without null required)
    assert reoffer.schema == {"enum": [True, False]}


def test_fixed_interval_policy_with_date_times(segrep_env: Any) -> None:
    import pendulum
    from airflow.sdk import DeltaDataIntervalTimetable

    segrep_env(
        {
            "schedule": "10s",
            "start_date": "2026-11-22T08:00:00+00:00",
            "end_date": "2026-11-22T08:01:00",
            "retries": 1,
            "retry_delay_s": 0,
        }
    )
    dag = load_dag(EVENTS_DAG)

    assert isinstance(dag.timetable, DeltaDataIntervalTimetable)
    assert dag.timetable.delta == timedelta(seconds=10)
    assert dag.start_date == pendulum.datetime(2026, 11, 22, 8, 0, tz="UTC")
    assert dag.end_date == pendulum.datetime(2026, 11, 22, 8, 1, tz="UTC")  # naive date-times are UTC
    assert dag.params.get_param("target").schema["enum"] == [None, "dr", "edge"]
    assert {dag.get_task(t).retries for t in ("fast_forward_dr", "fast_forward_edge", "fast_forward_primary")} == {1}
    assert dag.description == "Replicate events from primary to dr, edge"


def _catalog_dump(env: Any) -> dict[str, list[tuple[Any, ...]]]:
    from sqlalchemy import select

    from segrep.catalog import models as m

    with env.catalog.read() as s:
        return {t.name: sorted(map(tuple, s.execute(select(t)).all()), key=repr) for t in m.Base.metadata.sorted_tables}


def _files(root: Path) -> list[str]:
    """Every file under the environment but the catalog database itself (compared row by row instead)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "catalog.db" not in p.name)


# dag.test first deletes a run without a logical date that an earlier test of this worker's Airflow database
# left; Airflow's own lazy load of that run's serialized DAG warns when those tests left several versions of it
# (its DagRun.serialized_dag relationship is uselist=False): seen only in some orders of the whole suite.
@pytest.mark.filterwarnings("ignore:Multiple rows returned with uselist=False:sqlalchemy.exc.SAWarning")
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
    rows_before = airflow_rows(dag.dag_id)

    with pytest.raises(ParamValidationError, match=message):
        dag.test(logical_date=None, run_conf=conf)
    with pytest.raises(ParamValidationError, match=message):  # what `airflow dags trigger -c` and the API call
        trigger_dag(dag.dag_id, conf=conf, triggered_by=DagRunTriggeredByType.CLI)

    assert made_nothing(rows_before, dag.dag_id)  # no run was created, no task ran
    assert _catalog_dump(env) == catalog_before
    assert _files(env.root) == files_before


# Every SparkSubmitOperator of every DAG (for a definitions file with the one table `events`), with the task
# whose XCom names its manifest and result, and where that task puts them (segrep.storage.workdir).
SAMPLE_END_US = 1795334400000000  # 2026-11-22T08:00:00Z, a round's interval end and a pass's start
SPARK_TASKS: dict[tuple[str, str], tuple[str, Callable[[Any], tuple[Path, Path]]]] = {
    ("segrep_replicate_events", "merge"): (
        "round",
        lambda defs: (manifest_path(defs, "events", SAMPLE_END_US), result_path(defs, "events", SAMPLE_END_US)),
    ),
    ("segrep_maintain_events", "compact"): (
        "plan_compaction",
        lambda defs: compaction_paths(defs, "events", f"events-compact-{SAMPLE_END_US}"),
    ),
    ("segrep_split_events", "copy_rewrite"): (
        "copy_plan",
        lambda defs: split_pass_paths(defs, "events", 1, "copy", SAMPLE_END_US),
    ),
    ("segrep_split_events", "unload_merge"): (
        "unload_plan",
        lambda defs: split_pass_paths(defs, "events", 1, "unload", SAMPLE_END_US),
    ),
}
UPDATE_HINT = "SEGREP_UPDATE_EXPECTED=1 pytest tests/dags -k spark_submit"


def _expected_file(dag_id: str, task_id: str) -> Path:
    return EXPECTED / "spark_submit" / f"{dag_id}.{task_id}.txt"


def test_every_spark_submit_operator_has_an_expected_command(segrep_env: Any) -> None:
    """The table below lists every SparkSubmitOperator of every DAG, and each has its expected command file."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from tests.support.airflow import load_dagbag

    segrep_env(tables=("events",))
    bag = load_dagbag()
    found = {
        (dag.dag_id, t.task_id) for dag in bag.dags.values() for t in dag.tasks if isinstance(t, SparkSubmitOperator)
    }
    assert found == set(SPARK_TASKS)
    files = {p.name for p in (EXPECTED / "spark_submit").glob("*.txt")}
    assert files == {_expected_file(*key).name for key in SPARK_TASKS}  # no stale expectation either


@pytest.mark.parametrize(("dag_id", "task_id"), sorted(SPARK_TASKS), ids=[".".join(k) for k in sorted(SPARK_TASKS)])
def test_spark_submit_command_matches_expectation(segrep_env: Any, dag_id: str, task_id: str) -> None:
    """Render the Spark task's templates for a sample XCom of its plan task and build the command line the hook
    would run; compare it, one argument per line, with the expected file after replacing machine paths."""
    env = segrep_env({"schedule": "@hourly", "start_date": "2026-11-01"}, tables=("events",))
    dag = load_dag(dag_id)
    plan_task, paths = SPARK_TASKS[(dag_id, task_id)]
    manifest, result = paths(env.defs)
    plan_xcom = {"manifest": str(manifest), "result": str(result)}

    class _TI:
        def xcom_pull(self, task_ids: str, **_: Any) -> Any:
            assert task_ids == plan_task
            return plan_xcom

    spark = copy.copy(dag.get_task(task_id))
    spark.render_template_fields({"ti": _TI(), "params": dict(dag.params)})
    hook = spark._get_hook()
    command = hook._build_spark_submit_command(spark.application)

    assert hook._connection["master"] == "local[*]"  # from AIRFLOW_CONN_SPARK_DEFAULT
    assert set(hook._env or {}) >= {"SPARK_HOME", "PYSPARK_PYTHON", "PATH"}
    assert hook._env["PYSPARK_PYTHON"] == sys.executable
    got = normalise(command, machine_paths(env.root))
    rel = normalise([str(manifest), str(result)], {str(env.root): "{ENV_ROOT}"})
    header = [
        f"# The spark-submit command line of the `{task_id}` task of {dag_id}, one argument per line, rendered",
        f"# for a `{plan_task}` XCom with manifest {rel[0]}",
        f"# and result {rel[1]}.",
        *PLACEHOLDERS,
        f"# If the command changes on purpose, rewrite the files: {UPDATE_HINT}",
    ]
    assert_matches_expected(got, _expected_file(dag_id, task_id), header, UPDATE_HINT)


@pytest.fixture
def linked_definitions(airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """LINKS_YAML (primary <-> dr: 4 copies at once; dr -> edge: no copy limit) as the DAGs' definitions."""
    from tests.support.env import LINKS_YAML

    path = tmp_path / "links.yaml"
    path.write_text(LINKS_YAML)
    monkeypatch.setenv("SEGREP_CONFIG", str(path))
    monkeypatch.delenv("SEGREP_CATALOG_URL", raising=False)  # parsing must not need a catalog
    return path


def test_copy_tasks_run_in_the_pool_of_the_link_they_cross(linked_definitions: Path) -> None:
    """Each copy task carries its link's pool (`segrep airflow-pools`), in the DAG and as the scheduler reads it
    (serialized); a copy over a link without a copy limit, and every other task, stay in default_pool."""
    from airflow.serialization.serialized_objects import DagSerialization

    bag = load_dagbag()
    events = bag.get_dag(EVENTS_DAG)
    want = {
        "fast_forward_dr": "segrep_link_primary_dr",
        "fast_forward_edge": "default_pool",  # primary -> edge: no link
        "fast_forward_primary": "segrep_link_dr_primary",  # the leader's, after a failover: from dr or edge
    }
    assert {t: events.get_task(t).pool for t in want} == want
    assert {t.pool for t in events.tasks if t.task_id not in want} == {"default_pool"}
    stored = DagSerialization.from_dict(DagSerialization.to_dict(events))
    assert {t: stored.get_task(t).pool for t in want} == want
    assert bag.get_dag("segrep_replicate_orders").get_task("fast_forward_dr").pool == "segrep_link_primary_dr"
    # a bootstrap's catch-up never takes a round's pool slot: the catalog's link slots pause it for rounds
    assert {t.pool for t in bag.get_dag("segrep_bootstrap").tasks} == {"default_pool"}
