"""The merge on a real Spark cluster: the path of a user whose Spark is a standalone cluster, not ``local[*]``.

A master and one worker run on loopback (``tests/support/spark_cluster.py``); the Airflow Spark connection
points at the master (client mode); the segrep package is shipped as ``--py-files`` (the zip ``make spark-zip``
builds, named by SEGREP_SPARK_PY_FILES). The driver and the executors run an interpreter that has every library
but not segrep (``python_without_segrep``): like a cluster node without the package, segrep is importable there
only from the shipped zip. A table with a forked partition goes through the replication DAG (``dag.test``):
the plan task writes the merge manifest, the merge task (the DAG's SparkSubmitOperator) runs the merge job on
the cluster, the commit task registers its output; the leader then reads what a last-writer-wins replay of
the writes gives, and the master, the worker's directories and the interpreter's log show where it ran.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

import pytest

from segrep.spark import launch
from tests.support.airflow import (
    EVENTS_DAG,
    events_batch,
    load_dag,
    read_sorted,
    replay_rows,
    rounds,
    rows_of,
    set_leader,
    ti_states,
)
from tests.support.spark_cluster import SparkCluster, build_segrep_zip, python_without_segrep

pytestmark = pytest.mark.spark

# dag.test(logical_date=now) covers [now - 5 min, now): everything written so far is due. No retry: a failing
# merge fails the run at once (with spark-submit's log in the task's).
POLICY = {"schedule": "5m", "start_date": "2026-11-01", "retries": 0, "retry_delay_s": 0, "merge_engine": "spark"}
PYTHON_ENV = "SEGREP_SPARK_PYTHON"  # launch.python(): the interpreter of Spark's driver and executors


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_merge_task_runs_on_a_standalone_cluster_with_segrep_shipped_as_py_files(
    segrep_env: Any, spark_cluster: SparkCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pendulum

    from segrep.data.writer import write_batch
    from segrep_airflow.common import SPARK_CONN_ID

    env = segrep_env(POLICY)  # (clears SEGREP_SPARK_*: set them after)
    package = build_segrep_zip(tmp_path / "build")
    python, starts = python_without_segrep(tmp_path / "node")
    monkeypatch.setenv(launch.PY_FILES_ENV, str(package))
    monkeypatch.setenv(PYTHON_ENV, str(python))
    monkeypatch.setenv(f"AIRFLOW_CONN_{SPARK_CONN_ID.upper()}", spark_cluster.airflow_connection("client"))
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")  # the client-mode driver listens on loopback too

    # The node's interpreter has no segrep of its own; with the zip on its path it imports the zip's.
    bare = subprocess.run([python, "-c", "import segrep"], capture_output=True, text=True)
    assert bare.returncode != 0 and "No module named 'segrep'" in bare.stderr, bare.stderr
    shipped = subprocess.run(
        [python, "-c", "import pyarrow, pyspark, segrep.spark.jobs; print(segrep.__file__)"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(package)},
    )
    assert shipped.stdout.strip() == f"{package}/segrep/__init__.py", shipped.stderr
    starts.unlink()

    # A fork: dr led for a while and took writes the primary never saw, then the primary led again.
    written = [(range(0, 100), "a"), (range(90, 120), "dr"), (range(95, 130), "p")]
    write_batch(env.catalog, "events", events_batch(list(written[0][0]), written[0][1]))
    set_leader(env, "dr")
    write_batch(env.catalog, "events", events_batch(list(written[1][0]), written[1][1]))
    set_leader(env, "primary")
    write_batch(env.catalog, "events", events_batch(list(written[2][0]), written[2][1]))
    apps_before = {app["id"] for app in spark_cluster.state()["completedapps"]}

    dag = load_dag(EVENTS_DAG)  # parsed now: the merge task takes SEGREP_SPARK_PY_FILES and the interpreter
    merge = dag.get_task("merge")
    assert merge.py_files == str(package)
    assert merge.conf["spark.pyspark.python"] == str(python) == merge.conf["spark.pyspark.driver.python"]

    run = dag.test(logical_date=pendulum.now("UTC"))

    states = ti_states(run)
    assert run.state == "success", f"{states}\n{spark_cluster.log_tails()}"
    assert {states[(t, -1)] for t in ("round", "choose", "merge", "commit", "report")} == {"success"}
    report = rounds(env)[-1].report
    assert report["spark_apps"] == 1
    assert report["merges"]["items"] >= 1 and report["merges"]["committed"] == report["merges"]["items"]
    assert rows_of(read_sorted(env)) == replay_rows(written)  # last writer wins, dr's surviving writes included

    # It ran on the cluster: the master has one new application, finished, with its executor on the worker.
    state = spark_cluster.state()
    apps = [app for app in state["completedapps"] if app["id"] not in apps_before]
    assert [(app["name"].startswith("segrep-merge-events"), app["state"]) for app in apps] == [(True, "FINISHED")]
    assert state["activeapps"] == []
    executors = spark_cluster.executor_dirs(apps[0]["id"])
    assert executors, f"no executor directory of {apps[0]['id']} in {spark_cluster.work_dir}"

    # The package was shipped: the executor fetched the very zip the task was given ...
    for executor in executors:
        assert (executor / "segrep.zip").is_file(), sorted(p.name for p in executor.iterdir())
        assert _sha256(executor / "segrep.zip") == _sha256(package)
    # ... the driver and the executors' Python workers ran the interpreter without segrep ...
    started = starts.read_text().splitlines()
    merge_py = str(launch.jobs_dir() / "merge.py")
    assert any(line.startswith(merge_py) for line in started), started  # the driver (client mode: here)
    assert any(line.startswith("-m pyspark.daemon") for line in started), started  # the executors' workers
    # ... and the executors imported segrep there (reading the segment files), from the zip: nothing else has it.
    stderr = "".join((executor / "stderr").read_text(errors="replace") for executor in executors)
    imported = {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}
    assert "segrep" in imported, f"the executors imported no segrep module:\n{stderr[-3000:]}"
