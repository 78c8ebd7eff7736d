"""A real Spark standalone cluster for tests: one master and one worker from the installed pyspark, on loopback.

``start_spark_cluster(root)`` (the body of a fixture) starts ``$SPARK_HOME/bin/spark-class ...Master`` and
``...Worker`` (1 core, 1 GiB unless told) on free ports, each in its own process group and with a parent-death signal,
waits until the master's JSON (``http://127.0.0.1:<webui>/json/``) lists the worker ALIVE, and at teardown
kills both process groups (the worker's executors and their Python workers are in the worker's group). The
worker's ``--work-dir`` holds one directory per application and executor (``<app id>/<executor id>/``): its
``stderr`` and the files the application shipped (``--py-files``). Never skipped: pyspark and Java 17 are
requirements of the test suite, as for the ``spark`` fixture.

Also here: the segrep zip for ``--py-files``, built as ``make spark-zip`` builds it, and
``python_without_segrep``, an interpreter like a cluster node's: this venv's libraries, but not the segrep
package it has installed (editable, through a ``.pth`` file), so ``import segrep`` works in it only from what
was shipped.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from segrep.spark import launch
from segrep.spark.lifecycle import die_with_parent

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SparkCluster:
    """A running standalone cluster: its master URL, the master's web UI (for its JSON) and the worker's
    work directory."""

    master_url: str  # spark://127.0.0.1:PORT
    host: str
    port: int
    webui_port: int
    work_dir: Path
    logs: Path

    def state(self) -> dict[str, Any]:
        """The master's view of the cluster (workers, active and completed applications)."""
        with urllib.request.urlopen(f"http://{self.host}:{self.webui_port}/json/", timeout=5) as resp:
            doc: dict[str, Any] = json.load(resp)
            return doc

    def airflow_connection(self, deploy_mode: str = "client") -> str:
        """An Airflow Spark connection (the JSON of an ``AIRFLOW_CONN_<ID>`` variable) for this master:
        SparkSubmitHook makes ``--master spark://HOST:PORT`` of a "spark" connection whose host has a scheme."""
        return json.dumps(
            {
                "conn_type": "spark",
                "host": f"spark://{self.host}",
                "port": self.port,
                "extra": {"deploy-mode": deploy_mode},
            }
        )

    def executor_dirs(self, app_id: str) -> list[Path]:
        """The worker's directory of each executor of application ``app_id``."""
        return sorted(p for p in (self.work_dir / app_id).iterdir() if p.is_dir())

    def log_tails(self, chars: int = 3000) -> str:
        return "\n".join(
            f"--- {p.name}:\n{p.read_text(errors='replace')[-chars:]}" for p in sorted(self.logs.glob("*.log"))
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def cluster_env(root: Path) -> dict[str, str]:
    """The environment of the master and worker (and so of the executors): the installed pyspark as
    SPARK_HOME, loopback only, scratch space under ``root``, and no REST submission server (it would take the
    fixed port 6066)."""
    env = launch.spark_env()
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["SPARK_LOCAL_DIRS"] = str(root / "local")
    env["SPARK_MASTER_OPTS"] = "-Dspark.master.rest.enabled=false"
    for var in ("SPARK_CONF_DIR", "SPARK_MASTER_HOST", "SPARK_MASTER_PORT", "SPARK_WORKER_DIR"):
        env.pop(var, None)
    return env


def _spawn(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group: the teardown kills it and everything it started
            preexec_fn=functools.partial(die_with_parent, os.getpid()),  # and a killed pytest takes it along
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group (the JVMs shut down cleanly), then SIGKILL whatever is left of it (executors,
    Python workers, or the JVM itself if it did not go in time), and reap the process."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _wait_for(
    cluster: SparkCluster, procs: dict[str, subprocess.Popen[bytes]], ready: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    """Poll the master's JSON until ``ready(state)``; fail at once if a process exited, with the logs."""
    deadline = time.monotonic() + START_TIMEOUT_S
    last: Any = None
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"the Spark {name} exited with {proc.returncode}\n{cluster.log_tails()}")
        try:
            state = cluster.state()
        except (OSError, urllib.error.URLError, ValueError) as exc:
            last = exc
        else:
            if ready(state):
                return state
            last = state
        time.sleep(0.2)
    raise RuntimeError(f"Spark {what} not ready within {START_TIMEOUT_S:.0f} s (last: {last})\n{cluster.log_tails()}")


def start_spark_cluster(root: Path, *, cores: int = 1, memory: str = "1g") -> Iterator[SparkCluster]:
    """Start a master and one worker (``cores``, ``memory``: 1 and 1 GiB for tests; a bench gives it more) on
    loopback, yield the cluster once the worker has registered, and stop both (process groups killed) however the
    block ends."""
    root.mkdir(parents=True, exist_ok=True)
    logs, work = root / "logs", root / "work"
    for d in (logs, work, root / "local"):
        d.mkdir(exist_ok=True)
    env = cluster_env(root)
    spark_class = str(Path(env["SPARK_HOME"]) / "bin" / "spark-class")
    host, port, webui, worker_webui = "127.0.0.1", free_port(), free_port(), free_port()
    cluster = SparkCluster(f"spark://{host}:{port}", host, port, webui, work, logs)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        master = [spark_class, "org.apache.spark.deploy.master.Master", "--host", host, "--port", str(port)]
        procs["master"] = _spawn([*master, "--webui-port", str(webui)], logs / "master.log", env)
        state = _wait_for(cluster, procs, lambda s: s.get("status") == "ALIVE", "master")
        if state.get("url") != cluster.master_url:  # the port was taken meanwhile and Spark moved to another
            raise RuntimeError(f"the master listens at {state.get('url')}, not {cluster.master_url}")
        worker = [spark_class, "org.apache.spark.deploy.worker.Worker", cluster.master_url, "--host", host]
        worker += ["--cores", str(cores), "--memory", memory, "--webui-port", str(worker_webui)]
        worker += ["--work-dir", str(work)]
        procs["worker"] = _spawn(worker, logs / "worker.log", env)
        _wait_for(cluster, procs, lambda s: [w["state"] for w in s.get("workers", [])] == ["ALIVE"], "worker")
        yield cluster
    finally:
        for proc in reversed(procs.values()):  # the worker first: its executors go with its group
            stop(proc)


def build_segrep_zip(dest: Path) -> Path:
    """``build/segrep.zip`` as ``make spark-zip`` makes it (the same ``shutil.make_archive`` call: the
    ``segrep`` folder of ``include/`` at the root of the archive), in ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    return Path(shutil.make_archive(str(dest / "segrep"), "zip", str(REPO / "include"), "segrep"))


def python_without_segrep(dest: Path) -> tuple[Path, Path]:
    """An interpreter for the Spark driver and executors that has this venv's libraries (pyarrow, pyspark, ...)
    but not its segrep, which is installed editable through a ``.pth`` file: ``python -S`` skips the ``site``
    module (so no ``.pth`` file is read) and the venv's site-packages are put back on PYTHONPATH, after what
    Spark puts there (the shipped ``--py-files``). Each start is logged (its arguments, one line), and the
    executors' Python (``-m pyspark.daemon``) reports its imports (``-X importtime``) on stderr, which the
    worker keeps in the executor's ``stderr`` file. Returns (the script, its log)."""
    dest.mkdir(parents=True, exist_ok=True)
    log = dest / "starts.log"
    libs = os.pathsep.join(dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib")))
    script = dest / "python"
    script.write_text(
        "#!/bin/sh\n"
        f"echo \"$*\" >> '{log}'\n"
        f'PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH{os.pathsep}}}{libs}"\n'
        "export PYTHONPATH\n"
        'if [ "$1" = "-m" ]; then\n'
        f"  exec '{sys.executable}' -S -X importtime \"$@\"\n"
        "fi\n"
        f"exec '{sys.executable}' -S \"$@\"\n"
    )
    script.chmod(0o755)
    return script, log
