"""`make airflow` (scripts/airflow.sh) on another port: one setting moves the UI and the tasks' execution API.

With only the UI moved, every task failed with a bare "Connection refused" (or reached another Airflow on
8080). Here the script runs `airflow standalone` on a free port, in a throw-away AIRFLOW_HOME, and a manual run
of a replication DAG must succeed: its task reached the execution API on that port.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.airflow import EVENTS_DAG, REPO, events_batch, read_sorted
from tests.support.airflow_services import free_port, stop_group

START_TIMEOUT_S = 300  # standalone migrates its database and starts four processes: slow on a busy machine


def _script_env(home: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__") and k != "AIRFLOW_HOME"}
    return {
        **env,
        "AIRFLOW_HOME": str(home),
        "SEGREP_AIRFLOW_PORT": str(port),
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),  # not :8793, which another Airflow may hold
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
    }


def test_a_bad_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(REPO / "scripts" / "airflow.sh")],
        env={**_script_env(tmp_path / "home", 1), "SEGREP_AIRFLOW_PORT": "80a"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "SEGREP_AIRFLOW_PORT must be a port number, not '80a'" in done.stderr
    assert not (tmp_path / "home").exists()


def test_one_port_setting_moves_the_ui_and_the_execution_api(segrep_env: Any, tmp_path: Path) -> None:
    from segrep.data.writer import write_batch

    env = segrep_env({"schedule": "@hourly", "start_date": "2026-11-01"}, tables=("events",))
    write_batch(env.catalog, "events", events_batch(list(range(20)), "a"))
    port, home = free_port(), tmp_path / "airflow-home"
    log = (tmp_path / "standalone.log").open("wb")
    proc = subprocess.Popen(
        [str(REPO / "scripts" / "airflow.sh")],
        env=_script_env(home, port),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as api:
            _wait(lambda: _ok(api, "/api/v2/monitor/health"), proc, tmp_path, "the api-server to answer")
            password = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
            token = api.post("/auth/token", json={"username": "admin", "password": password})
            assert token.status_code in (200, 201), token.text
            api.headers["Authorization"] = f"Bearer {token.json()['access_token']}"
            _wait(lambda: _ok(api, f"/api/v2/dags/{EVENTS_DAG}"), proc, tmp_path, "the DAG to be parsed")
            made = api.post(f"/api/v2/dags/{EVENTS_DAG}/dagRuns", json={"logical_date": None})
            assert made.status_code == 200, made.text
            run_id = made.json()["dag_run_id"]
            api.patch(f"/api/v2/dags/{EVENTS_DAG}", json={"is_paused": False}).raise_for_status()

            def finished() -> bool:
                return str(api.get(f"/api/v2/dags/{EVENTS_DAG}/dagRuns/{run_id}").json()["state"]) in (
                    "success",
                    "failed",
                )

            _wait(finished, proc, tmp_path, "the run to finish")
            state = api.get(f"/api/v2/dags/{EVENTS_DAG}/dagRuns/{run_id}").json()["state"]
            assert state == "success", _tail(tmp_path)
    finally:
        stop_group(proc, timeout_s=60)
        log.close()
    leader = read_sorted(env)
    assert leader.num_rows == 20 and read_sorted(env, "dr").equals(leader)


def _ok(api: httpx.Client, path: str) -> bool:
    try:
        return api.get(path).status_code == 200
    except httpx.HTTPError:
        return False


def _wait(check: Any, proc: subprocess.Popen[bytes], tmp_path: Path, what: str) -> None:
    deadline = time.time() + START_TIMEOUT_S
    while time.time() < deadline:
        if check():
            return
        if proc.poll() is not None:
            pytest.fail(f"scripts/airflow.sh exited ({proc.returncode}) waiting for {what}:\n{_tail(tmp_path)}")
        time.sleep(1)
    pytest.fail(f"waited {START_TIMEOUT_S} s for {what}, in vain:\n{_tail(tmp_path)}")


def _tail(tmp_path: Path) -> str:
    return (tmp_path / "standalone.log").read_text(errors="replace")[-4000:]
