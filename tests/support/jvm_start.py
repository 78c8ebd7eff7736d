"""A faster JVM start for the suite's many short Spark applications.

Every spark-submit (and the session's own SparkSession) starts a JVM that loads some 10,000 classes and
JIT-compiles them on both tiers, which on a 2-core machine costs ~8 s of wall time and ~12 s of CPU before the
job does anything. The suite runs dozens of them. Two standard HotSpot options halve that: a class-data-sharing
archive of Spark's classes (``-XX:SharedArchiveFile``, dumped once per run by a small application) and the
client compiler only (``-XX:TieredStopAtLevel=1``; the test jobs are too short for C2 to pay off). Both go into
``SPARK_SUBMIT_OPTS``, which spark-submit's launcher gives the driver JVM and which every process the tests
start (spark-submit, pyspark's gateway, Airflow's tasks) inherits. Segrep itself is not changed: the jobs run
the same code with the same results, only the JVM starts sooner.

The archive is dumped in the background (~25 s) while the first tests run, under a temporary name, and renamed
into place when complete: a JVM that starts before then finds no archive and starts as it would without one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from segrep.core.errors import SegrepError
from segrep.spark import launch
from segrep.spark.lifecycle import kill_group

OPTS_VAR = "SPARK_SUBMIT_OPTS"
WARM_UP_APP = Path(__file__).with_name("jvm_warm_up_app.py")
DUMP_TIMEOUT_S = 300


class JvmArchive:
    """The archive being dumped (then in place) in a temporary directory; ``close`` stops a dump still running
    and removes the directory."""

    def __init__(self) -> None:
        self.where = Path(tempfile.mkdtemp(prefix="segrep-jvm-"))
        self.archive = self.where / "spark.jsa"
        partial = self.where / "spark.jsa.partial"
        self._closing = threading.Event()
        env = {**launch.spark_env(), OPTS_VAR: f"-XX:ArchiveClassesAtExit={partial}"}
        # segrep's own spark-submit options (its --conf settings load the same classes), with the warm-up app
        cmd = [*launch.submit_options(name="segrep-tests-jvm-warm-up", master="local[1]"), str(WARM_UP_APP)]
        self._proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        self._waiter = threading.Thread(target=self._publish, args=(partial,), name="segrep-jvm-archive", daemon=True)
        self._waiter.start()

    def _publish(self, partial: Path) -> None:
        try:
            _out, err = self._proc.communicate(timeout=DUMP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            kill_group(self._proc)
            return _warn(f"the dump took over {DUMP_TIMEOUT_S} s")
        if self._closing.is_set():
            return None  # a short run ended first: nothing to say
        if self._proc.returncode != 0 or not partial.is_file():
            return _warn(f"exit {self._proc.returncode}: {launch.failure_excerpt(err or '', 5)}")
        os.replace(partial, self.archive)

    def close(self) -> None:
        self._closing.set()
        if self._proc.poll() is None:
            kill_group(self._proc)
        self._waiter.join(timeout=30)
        shutil.rmtree(self.where, ignore_errors=True)


def speed_up_jvm_start() -> JvmArchive | None:
    """Start dumping the archive and set ``SPARK_SUBMIT_OPTS`` to use it (once it is there) with the client
    compiler only. None when the caller already set ``SPARK_SUBMIT_OPTS`` (left alone) or spark-submit cannot
    be started, in which case the tests run with the JVM's defaults and a warning says why."""
    if os.environ.get(OPTS_VAR):
        return None
    try:
        dump = JvmArchive()
    except (OSError, SegrepError) as exc:
        _warn(f"{type(exc).__name__}: {exc}")
        return None
    os.environ[OPTS_VAR] = f"-XX:SharedArchiveFile={dump.archive} -XX:TieredStopAtLevel=1"
    return dump


def _warn(why: str) -> None:
    print(f"tests: Spark's JVMs start without a class-data-sharing archive ({why})")
