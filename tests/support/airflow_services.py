"""Airflow's own servers for end-to-end tests: the api-server and the scheduler as subprocesses of the test.

Each runs in its own process group (so stopping it stops its workers) with the session's AIRFLOW_HOME and
database and the test's segrep environment, and logs to a file the failures quote.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.airflow import AIRFLOW


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Services:
    """The api-server and the scheduler, as subprocesses in their own process groups; ``extra_env`` is added
    to their environment (auth manager settings, say)."""

    def __init__(self, log_dir: Path, extra_env: dict[str, str] | None = None) -> None:
        self.api_port, self.log_port = free_port(), free_port()
        self.log_dir = log_dir
        self.extra_env = extra_env or {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,  # the session's AIRFLOW_HOME and database, this test's SEGREP_CONFIG / catalog (now)
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.api_port}/execution/",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.log_port),  # the scheduler's log server, not :8793
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
            # The DAG does not catch up, so on start the scheduler would add a run of the interval ending now
            # (after the outage): no scheduled runs here, only the backfill's.
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
            **self.extra_env,
        }

    def start(self, name: str, *args: str) -> None:
        log = (self.log_dir / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            [AIRFLOW, *args], env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def start_api_server(self, apps: str = "execution") -> None:
        """``apps``: "execution" (what task runners call) or "all" (the public REST API and the UI too)."""
        self.start("api-server", "api-server", "--apps", apps, "-H", "127.0.0.1", "-p", str(self.api_port), "-w", "1")

    def wait_api_healthy(self, timeout_s: float = 240) -> None:
        """Until the api-server answers: ~15 s on an idle machine, past 90 s seen on a busy one (2 cores)."""
        deadline = time.time() + timeout_s
        url = f"http://127.0.0.1:{self.api_port}/execution/health"
        while time.time() < deadline:
            proc = self.procs["api-server"]
            assert proc.poll() is None, f"api-server exited with {proc.returncode}:\n{self.tail('api-server')}"
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        pytest.fail(f"api-server not healthy after {timeout_s} s:\n{self.tail('api-server')}")

    def cli(self, *args: str) -> str:
        proc = subprocess.run([AIRFLOW, *args], env=self.env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"airflow {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc.stdout

    def tail(self, name: str, lines: int = 60) -> str:
        path = self.log_dir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        """SIGTERM to each process group we created (the server or scheduler and its workers), then SIGKILL."""
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=10)
            _signal_group(proc, signal.SIGKILL)  # workers left behind by a leader that already exited


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)  # the group is the one start_new_session gave this child


def stop_group(proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    """Stop a child started with ``start_new_session``: SIGTERM to its process group, SIGKILL after
    ``timeout_s``, then SIGKILL to what its leader left behind."""
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait(timeout=10)
    _signal_group(proc, signal.SIGKILL)


def script_env(home: Path, port: int, **settings: str) -> dict[str, str]:
    """The environment of scripts/airflow.sh (`make airflow`) in a test: this process's environment without
    its Airflow and segrep settings, a throw-away AIRFLOW_HOME, the port, log-server ports of its own (not
    :8793, which another Airflow may hold) and ``settings`` (SEGREP_CONFIG, SEGREP_CATALOG_URL...)."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "SEGREP_")) and k != "AIRFLOW_HOME"}
    return kept | {
        "AIRFLOW_HOME": str(home),
        "SEGREP_AIRFLOW_PORT": str(port),
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        **settings,
    }
