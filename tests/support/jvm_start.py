"""A faster JVM start for the suite's many short Spark applications.

Every spark-submit (and the session's own SparkSession) starts a JVM that loads some 10,000 classes and
JIT-compiles them on both tiers, which on a 2-core machine costs ~8 s of wall time and ~12 s of CPU before the
job does anything. The suite runs dozens of them. Two standard HotSpot options halve that: a class-data-sharing
archive of Spark's classes (``-XX:SharedArchiveFile``, dumped once per run by a small application) and the
client compiler only (``-XX:TieredStopAtLevel=1``; the test jobs are too short for C2 to pay off). Both go into
``SPARK_SUBMIT_OPTS``, which spark-submit's launcher gives the driver JVM and which every process the tests
start (spark-submit, pyspark's gateway, Airflow's tasks) inherits. Segrep itself is not changed: the jobs run
the same code with the same results, only the JVM starts sooner.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from segrep.spark import launch

OPTS_VAR = "SPARK_SUBMIT_OPTS"
WARM_UP_APP = Path(__file__).with_name("jvm_warm_up_app.py")
DUMP_TIMEOUT_S = 180


def speed_up_jvm_start() -> Path | None:
    """Dump a class-data-sharing archive of a short Spark application into a temporary directory and set
    ``SPARK_SUBMIT_OPTS`` to use it with the client compiler only. Returns the directory (remove it at the end),
    or None when the caller already set ``SPARK_SUBMIT_OPTS`` (left alone) or the dump failed, in which case the
    tests run with the JVM's defaults and a warning says why."""
    if os.environ.get(OPTS_VAR):
        return None
    where = Path(tempfile.mkdtemp(prefix="segrep-jvm-"))
    archive = where / "spark.jsa"
    env = {**launch.spark_env(), OPTS_VAR: f"-XX:ArchiveClassesAtExit={archive}"}
    # segrep's own spark-submit line (its --conf settings load the same classes), with the warm-up app instead
    cmd = [*launch.command("merge", [], name="segrep-tests-jvm-warm-up", master="local[1]")[:-1], str(WARM_UP_APP)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=DUMP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return _without(where, f"{type(exc).__name__}: {exc}")
    if proc.returncode != 0 or not archive.is_file():
        return _without(where, f"exit {proc.returncode}: {launch.failure_excerpt(proc.stderr, 5)}")
    os.environ[OPTS_VAR] = f"-XX:SharedArchiveFile={archive} -XX:TieredStopAtLevel=1"
    return where


def _without(where: Path, why: str) -> None:
    shutil.rmtree(where, ignore_errors=True)
    print(f"tests: Spark's JVM starts with its defaults (no class-data-sharing archive: {why})")
    return None
