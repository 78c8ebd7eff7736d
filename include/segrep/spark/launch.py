"""Launching the Spark jobs of ``spark_jobs/`` without Airflow (``segrep round``, tests, benchmarks).

Airflow runs the same applications with SparkSubmitOperator and the same ``SPARK_CONF``; this module is the
plain ``spark-submit`` equivalent. A Spark application started here dies with the process that started it
(:mod:`segrep.spark.lifecycle`). The driver and executors use this interpreter, so the ``segrep`` package
installed in it is importable there (cluster deployments ship it with ``--py-files``: SEGREP_SPARK_PY_FILES).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from segrep.core.errors import SegrepError
from segrep.spark.lifecycle import die_with_parent, kill_group

MASTER_ENV = "SEGREP_SPARK_MASTER"
JOBS_ENV = "SEGREP_SPARK_JOBS"
PY_FILES_ENV = "SEGREP_SPARK_PY_FILES"

# Every entry says why it is set; the DAGs pass the same dictionary to SparkSubmitOperator.
SPARK_CONF: dict[str, str] = {
    # Our jobs are short batch steps: the UI's port and threads only slow start-up.
    "spark.ui.enabled": "false",
    # Airflow (or the caller) retries a failed step; Spark must not re-run the driver on its own.
    "spark.yarn.maxAppAttempts": "1",
    # Merges shuffle one round's rows; the default of 200 shuffle partitions is tuned for far larger inputs.
    "spark.sql.shuffle.partitions": "16",
    # Arrow makes DataFrame.toArrow() (the merge output) a columnar transfer instead of row pickling.
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Segments carry microsecond versions and dates; keep Spark from rebasing old dates on read or write.
    "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInRead": "CORRECTED",
    # Merge and major outputs come back to the driver as Arrow (one segment file per item); the default 1g
    # driver heap is too small for a partition of millions of rows.
    "spark.driver.memory": "4g",
    "spark.driver.maxResultSize": "4g",
    # Timestamps cross into Arrow in the session time zone; UTC makes merge output independent of the host.
    "spark.sql.session.timeZone": "UTC",
}


def jobs_dir() -> Path:
    """``spark_jobs/`` of this repository (or SEGREP_SPARK_JOBS)."""
    return Path(os.environ.get(JOBS_ENV) or Path(__file__).resolve().parents[3] / "spark_jobs")


def application(name: str) -> Path:
    path = jobs_dir() / f"{name}.py"
    if not path.is_file():
        raise SegrepError(f"Spark job {path} not found (set {JOBS_ENV} to the spark_jobs directory)")
    return path


def python() -> str:
    """The interpreter Spark's driver and executors run: this one, which has segrep installed."""
    return os.environ.get("SEGREP_SPARK_PYTHON") or sys.executable


def spark_submit_binary() -> str:
    beside = Path(sys.executable).with_name("spark-submit")
    found = str(beside) if beside.exists() else shutil.which("spark-submit")
    if not found:
        raise SegrepError("spark-submit not found: install pyspark in this environment (make venv)")
    return found


def command(app: str, args: Sequence[str], *, name: str, master: str | None = None) -> list[str]:
    """The spark-submit command line for ``spark_jobs/<app>.py``."""
    return [*submit_options(name=name, master=master), str(application(app)), *args]


def submit_options(*, name: str, master: str | None = None) -> list[str]:
    """spark-submit and its options, up to the application: master, name, ``SPARK_CONF``, this interpreter."""
    cmd = [spark_submit_binary(), "--master", master or os.environ.get(MASTER_ENV, "local[*]"), "--name", name]
    conf = {**SPARK_CONF, "spark.pyspark.python": python(), "spark.pyspark.driver.python": python()}
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    if os.environ.get(PY_FILES_ENV):
        cmd += ["--py-files", os.environ[PY_FILES_ENV]]
    return cmd


def spark_env() -> dict[str, str]:
    """Environment for spark-submit: SPARK_HOME of the installed pyspark and this interpreter for Python."""
    env = dict(os.environ)
    if "SPARK_HOME" not in env:
        spec = importlib.util.find_spec("pyspark")
        if spec is None or not spec.submodule_search_locations:
            raise SegrepError("pyspark is not installed in this environment (make venv)")
        env["SPARK_HOME"] = next(iter(spec.submodule_search_locations))
    env.setdefault("PYSPARK_PYTHON", python())
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


Submit = Callable[..., None]  # the signature of submit(), for callers that take a stand-in


def submit(app: str, args: Sequence[str], *, name: str, master: str | None = None) -> None:
    """Run a Spark job to completion; raise SegrepError with the tail of its log if it fails."""
    cmd = command(app, args, name=name, master=master)
    parent = os.getpid()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=spark_env(),
        start_new_session=True,  # its own process group, so an interrupt can kill all of Spark at once
        preexec_fn=functools.partial(die_with_parent, parent),  # and a kill -9 of this process kills the JVM
    )
    try:
        stdout, stderr = proc.communicate()
    except BaseException:  # interrupted (Ctrl-C, SIGTERM through the CLI): Spark goes with us
        kill_group(proc)
        raise
    if proc.returncode != 0:
        raise SegrepError(f"Spark job {app} failed (exit {proc.returncode}):\n{failure_excerpt(stderr or stdout)}")


def failure_excerpt(log: str, lines: int = 20) -> str:
    """The Python traceback of a failed job if its log has one (Spark's shutdown lines follow it), else the tail."""
    text = log.strip().splitlines()
    starts = [i for i, line in enumerate(text) if line.startswith("Traceback (most recent call last)")]
    return "\n".join(text[starts[-1] : starts[-1] + lines] if starts else text[-lines:])
