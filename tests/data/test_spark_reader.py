"""The Spark read helper and the spark-submit job resolve exactly the rows the pyarrow reader does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from segrep.data.reader import read_table
from segrep.data.spark_reader import read_dataframe
from segrep.data.writer import write_batch
from tests.support.env import Env
from tests.support.tables import orders

pytestmark = pytest.mark.spark


def _load(env: Env) -> None:
    write_batch(env.catalog, "orders", orders(list(range(1, 301)) + list(range(150_000, 150_100))))
    write_batch(env.catalog, "orders", orders(list(range(100, 200)), status="F", comment="u"))
    write_batch(env.catalog, "orders", pa.table({"o_orderkey": pa.array([5, 150, 150_001], pa.int64())}), delete=True)


def test_read_dataframe_matches_reader(sqlite_env: Env, spark) -> None:
    _load(sqlite_env)
    expected = sorted(read_table(sqlite_env.catalog, "orders").to_pylist(), key=lambda r: r["o_orderkey"])
    rows = [r.asDict() for r in read_dataframe(spark, sqlite_env.catalog, "orders").collect()]
    assert sorted(rows, key=lambda r: r["o_orderkey"]) == expected
    assert read_dataframe(spark, sqlite_env.catalog, "orders", site="dr").count() == 0  # nothing replicated yet


def test_spark_submit_read_job(sqlite_env: Env, tmp_path: Path) -> None:
    _load(sqlite_env)
    out = tmp_path / "out"
    job = Path(__file__).resolve().parents[2] / "spark_jobs" / "read_table.py"
    submit = Path(sys.executable).parent / "spark-submit"
    cmd = [str(submit), "--master", "local[2]", "--conf", "spark.ui.enabled=false", str(job)]
    cmd += ["--catalog", sqlite_env.url, "orders", "--output", str(out)]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "PYSPARK_PYTHON": sys.executable}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = pq.read_table(out).to_pylist()
    expected = read_table(sqlite_env.catalog, "orders").to_pylist()
    assert sorted(got, key=lambda r: r["o_orderkey"]) == sorted(expected, key=lambda r: r["o_orderkey"])
