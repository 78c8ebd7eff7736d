"""A Spark application started by segrep dies with the process that started it.

A real ``spark-submit`` (JVM, Python driver) is started through ``launch.submit`` by a stand-in for a segrep
command, which is then interrupted (SIGINT: the process group is killed on the way out) or killed outright
(SIGKILL: it cannot clean up; the parent-death signals of the JVM and the driver do). Before the fix, the
JVM and the driver of a killed ``segrep compact`` kept running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

SLEEPY_JOB = """
import os, sys, time
from pyspark.sql import SparkSession
from segrep.spark.lifecycle import die_with_parent

if __name__ == "__main__":
    die_with_parent()
    spark = SparkSession.builder.getOrCreate()
    spark.range(3).count()
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(600)
"""

LAUNCHER = """
import sys
from segrep.spark import launch
launch.submit("sleepy", [sys.argv[1]], name=sys.argv[2])
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _pids_with(token: str) -> set[int]:
    out = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if token in proc.joinpath("cmdline").read_bytes().decode(errors="replace"):
                    out.add(int(proc.name))
            except OSError:
                continue
    return out


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "interrupt"])
def test_spark_goes_when_its_launcher_goes(tmp_path: Path, how: signal.Signals) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "sleepy.py").write_text(SLEEPY_JOB)
    ready = tmp_path / "driver.pid"
    token = f"segrep-lifecycle-{uuid.uuid4().hex[:12]}"
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(ready), token],
        env={**os.environ, "SEGREP_SPARK_JOBS": str(jobs)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180
        while not ready.exists():
            assert launcher.poll() is None, "the launcher ended before the Spark driver was up"
            assert time.monotonic() < deadline, "the Spark driver did not start"
            time.sleep(0.2)
        spark = _pids_with(token) | {int(ready.read_text())}
        spark.discard(launcher.pid)
        assert len(spark) >= 2, spark  # the JVM (named by the token) and the Python driver
        launcher.send_signal(how)
        launcher.wait(timeout=60)
        deadline = time.monotonic() + 60
        while any(_alive(pid) for pid in spark) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in spark if _alive(pid)], "Spark outlived the command that started it"
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid in _pids_with(token):
            os.kill(pid, signal.SIGKILL)
