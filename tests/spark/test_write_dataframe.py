"""The Spark writer (``segrep.spark.write_dataframe``, ``spark_jobs/write_dataframe.py``): segment files written
on the executors with ``write_batch``'s stamping, routing and checksums, committed by the driver in one
transaction; a failed or killed job commits nothing and leaves only files GC removes.

In this process on the tests' local session (cheap), and through spark-submit on a standalone cluster (one per
module: the ``spark_cluster`` fixture): the SparkSubmitOperator's path, with executors in other processes than
the driver.
"""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import func, select

import segrep.spark
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.core import faults, hlc
from segrep.core.errors import SchemaMismatchError, SegrepError
from segrep.data.reader import read_table
from segrep.data.writer import write_batch, write_targets
from segrep.failover.promote import failover
from segrep.maintenance.gc import collect
from segrep.replication.orchestrator import run_round
from segrep.spark import dataframe_writer, launch
from segrep.spark.dataframe_writer import write_dataframe
from segrep.spark.lifecycle import kill_group
from tests.support.env import ORDERS_YAML, Env, make_env
from tests.support.rounds import no_spark
from tests.support.spark_cluster import SparkCluster

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
EVENTS_KEY = [("tenant", "ascending"), ("seq", "ascending")]
TWO_DAYS_US = 2 * 86_400 * 1_000_000  # past the default orphan grace (one day)


def _env(root: Path) -> Env:
    root.mkdir(parents=True, exist_ok=True)
    return make_env(root, f"sqlite:///{root}/catalog.db", ORDERS_YAML)


def _events(spark: Any, n: int, tasks: int, tag: str, keys: int) -> Any:
    """``n`` events in ``tasks`` Spark partitions, in id order: tenants on both sides of the split point ``m``,
    ``seq`` repeating every ``keys`` ids, so the same key is in several tasks (the latest id must win)."""
    from pyspark.sql import functions as F

    tenant = F.element_at(
        F.array(*[F.lit(t) for t in ("alpha", "kilo", "mike", "zulu")]), (F.col("id") % 4 + 1).cast("int")
    )
    return spark.range(0, n, 1, tasks).select(
        tenant.alias("tenant"),
        (F.col("id") % keys).alias("seq"),
        F.concat(F.lit(tag), F.col("id").cast("string")).alias("payload"),
        F.timestamp_seconds(F.col("id") + F.lit(1_700_000_000)).alias("at"),
    )


def _orders(spark: Any, n: int, tasks: int) -> Any:
    """``n`` orders whose keys are scattered over the table's four key ranges in every task."""
    from pyspark.sql import functions as F

    key = ((F.col("id") * 7919) % F.lit(n)) * 1000
    return spark.range(0, n, 1, tasks).select(
        key.alias("o_orderkey"),
        (F.col("id") % 97).alias("o_custkey"),
        F.lit("O").alias("o_orderstatus"),
        (F.col("id") / 100).cast("decimal(15,2)").alias("o_totalprice"),
        F.date_add(F.lit("2020-01-01").cast("date"), (F.col("id") % 365).cast("int")).alias("o_orderdate"),
        F.lit("1-URGENT").alias("o_orderpriority"),
        F.concat(F.lit("Clerk#"), F.col("id").cast("string")).alias("o_clerk"),
        F.lit(0).cast("int").alias("o_shippriority"),
        F.concat(F.lit("c"), F.col("id").cast("string")).alias("o_comment"),
    )


def _table_files(env: Env, table: str) -> list[Path]:
    return sorted(p for p in (env.site_dir("primary") / table).rglob("*") if p.is_file())


def _unreferenced(env: Env, table: str) -> list[Path]:
    """Files under the table's directory at the leader that no catalog row references."""
    with env.catalog.read() as s:
        known = set(s.scalars(select(m.Segment.relpath)))
    root = env.site_dir("primary")
    return [p for p in _table_files(env, table) if str(p.relative_to(root)) not in known]


def _segments(env: Env, table: str) -> int:
    with env.catalog.read() as s:
        return int(
            s.scalar(
                select(func.count())
                .select_from(m.Segment)
                .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
                .join(m.Partition, m.Partition.partition_id == m.Placement.partition_id)
                .join(m.Table, m.Table.table_id == m.Partition.table_id)
                .where(m.Table.name == table)
            )
            or 0
        )


@contextlib.contextmanager
def _executor_fault(spark: Any, name: str) -> Iterator[None]:
    """Switch a fault point on in the Python workers of Spark tasks defined inside (their environment)."""
    env = spark.sparkContext.environment
    env[faults.FAULTS_ENV] = name
    try:
        yield
    finally:
        env.pop(faults.FAULTS_ENV, None)


# -- in this process, on the local session --------------------------------------------------------------------


def test_rows_read_back_are_the_dataframes_last_rows_per_key(spark: Any, tmp_path: Path) -> None:
    env = _env(tmp_path)
    df = _events(spark, 600, 3, "a", keys=100)
    assert df.rdd.getNumPartitions() == 3

    result = segrep.spark.write_dataframe(df, "events", catalog=env.catalog)

    latest: dict[tuple[str, int], dict[str, Any]] = {}
    for row in df.toArrow().to_pylist():  # in DataFrame order: the later row with a key wins
        latest[(row["tenant"], row["seq"])] = row
    got = read_table(env.catalog, "events").sort_by(EVENTS_KEY).to_pylist()
    assert got == [latest[k] for k in sorted(latest)]
    # one segment per (task, partition touched), chained in task order: 3 tasks x 2 partitions
    assert result.rows_in == 600 and result.committed_us is not None and result.attempts == 1
    assert len({seg.partition_id for seg in result.segments}) == 2
    assert len(result.segments) == 6 and _segments(env, "events") == 6
    assert {seg.site for seg in result.segments} == {"primary"}


def test_the_same_rows_through_write_batch_resolve_to_the_same_table(spark: Any, tmp_path: Path) -> None:
    df = _events(spark, 400, 4, "b", keys=70)
    by_batch, by_spark = _env(tmp_path / "batch"), _env(tmp_path / "spark")

    write_batch(by_batch.catalog, "events", df.toArrow())
    write_dataframe(df, "events", catalog=by_spark.catalog)

    expected = read_table(by_batch.catalog, "events").sort_by(EVENTS_KEY)
    assert expected.num_rows == 140  # (id % 4, id % 70): 140 keys, most written several times
    assert read_table(by_spark.catalog, "events").sort_by(EVENTS_KEY).equals(expected)
    # the files are the writer's own: their footers say what the catalog says (a rebuild reads them)
    files = [p for p in _table_files(by_spark, "events") if p.suffix == ".parquet"]
    assert len(files) == _segments(by_spark, "events")
    assert all(b"segrep.segment" in (pq.read_schema(p).metadata or {}) for p in files)


def test_a_write_that_loses_its_leaders_to_a_failover_plans_again_and_commits_at_the_new_ones(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer planned against the old leaders (read before a failover): its commit conflicts, its files
    at the old leader are removed, and the second attempt writes and commits at the new leader."""
    env = _env(tmp_path)
    write_batch(env.catalog, "events", _events(spark, 40, 1, "a", keys=40).toArrow())
    run_round(env.catalog, env.defs, "events", submit=no_spark)
    with env.catalog.read() as s:
        stale = write_targets(env.catalog, q.table_info(s, "events"))  # what the writer reads first
    failover(env.catalog, env.defs, ["events"], to="dr")
    calls: list[int] = []

    def zombie_then_fresh(catalog: Any, info: Any, site: str | None = None) -> Any:
        calls.append(1)
        return stale if len(calls) == 1 else write_targets(catalog, info, site)

    monkeypatch.setattr(dataframe_writer, "write_targets", zombie_then_fresh)
    before = _table_files(env, "events")
    df = _events(spark, 200, 2, "b", keys=100)
    result = write_dataframe(df, "events", catalog=env.catalog)
    assert result.attempts == 2 and {seg.site for seg in result.segments} == {"dr"}
    assert _table_files(env, "events") == before  # nothing of the first attempt stays at the old leader
    got = read_table(env.catalog, "events", "dr").sort_by(EVENTS_KEY)
    assert got.num_rows == 100 and all(p.startswith("b") for p in got.column("payload").to_pylist())  # all won


def test_upsert_then_delete(spark: Any, tmp_path: Path) -> None:
    env = _env(tmp_path)
    rows = _events(spark, 200, 2, "c", keys=200)
    write_dataframe(rows, "events", "upsert", catalog=env.catalog)
    gone = rows.where("seq % 3 = 0").select("tenant", "seq")

    result = write_dataframe(gone, "events", mode="delete", catalog=env.catalog)

    assert result.deleted and result.rows_in == gone.count()
    deleted = {(r["tenant"], r["seq"]) for r in gone.toArrow().to_pylist()}
    left = read_table(env.catalog, "events").to_pylist()
    assert {(r["tenant"], r["seq"]) for r in left} == {
        (r["tenant"], r["seq"]) for r in rows.toArrow().to_pylist()
    } - deleted
    assert len(left) == 200 - len(deleted)


def test_rows_are_routed_to_every_partition_from_every_task(spark: Any, tmp_path: Path) -> None:
    env = _env(tmp_path)
    df = _orders(spark, 600, 4)

    result = write_dataframe(df, "orders", catalog=env.catalog)

    assert len(result.segments) == 16  # every task held keys of all four ranges
    got = read_table(env.catalog, "orders").sort_by("o_orderkey")
    want = df.toArrow().sort_by("o_orderkey")
    assert got.column("o_orderkey").to_pylist() == want.column("o_orderkey").to_pylist()
    assert got.column("o_totalprice").equals(want.column("o_totalprice"))
    # each partition's files hold only its key range (150000 wide), one file per task: a chain of four
    ranges = set()
    for pid in {seg.partition_id for seg in result.segments}:
        part_files = sorted((env.site_dir("primary") / "orders" / str(pid)).glob("*.parquet"))
        assert len(part_files) == 4, pid
        keys = pa.concat_tables([pq.read_table(p, columns=["o_orderkey"]) for p in part_files]).column(0)
        found = {k // 150000 for k in keys.to_pylist()}
        assert len(found) == 1, (pid, found)
        ranges |= found
    assert ranges == {0, 1, 2, 3}


@pytest.mark.parametrize(
    ("change", "mode", "error", "message"),
    [
        ("extra", "upsert", SchemaMismatchError, "has columns the table does not: bogus"),
        ("no_key", "upsert", SchemaMismatchError, "lacks columns: seq"),
        ("full_rows", "delete", SchemaMismatchError, "has columns the table does not"),
        ("none", "merge", SegrepError, "unknown write mode 'merge': use upsert or delete"),
        ("null_key", "upsert", SegrepError, "key column seq has 1 null value(s)"),
    ],
)
def test_bad_input_is_refused_before_any_file_is_written(
    spark: Any, tmp_path: Path, change: str, mode: str, error: type[Exception], message: str
) -> None:
    from pyspark.sql import functions as F

    env = _env(tmp_path)
    df = _events(spark, 50, 2, "d", keys=50)
    changed = {
        "extra": df.withColumn("bogus", F.lit(1)),
        "no_key": df.drop("seq"),
        "full_rows": df,
        "none": df,
        "null_key": df.withColumn("seq", F.when(F.col("seq") == 7, F.lit(None)).otherwise(F.col("seq"))),
    }[change]

    with pytest.raises(error) as caught:
        write_dataframe(changed, "events", mode, catalog=env.catalog)

    assert message in str(caught.value)
    assert _table_files(env, "events") == [] and _segments(env, "events") == 0


def test_a_failing_task_commits_nothing_and_gc_leaves_no_file(spark: Any, tmp_path: Path) -> None:
    env = _env(tmp_path)
    write_dataframe(_events(spark, 100, 2, "e", keys=100), "events", catalog=env.catalog)
    before = read_table(env.catalog, "events").sort_by(EVENTS_KEY)
    committed = _segments(env, "events")

    with _executor_fault(spark, "in_spark_write"), pytest.raises(Exception, match="injected fault at in_spark_write"):
        write_dataframe(_events(spark, 100, 2, "f", keys=100), "events", catalog=env.catalog)

    assert read_table(env.catalog, "events").sort_by(EVENTS_KEY).equals(before)
    assert _segments(env, "events") == committed
    collect(env.catalog, env.defs, "events", now_us=hlc.now_us() + TWO_DAYS_US)
    assert _unreferenced(env, "events") == []  # nothing of the failed write is left
    assert len(_table_files(env, "events")) == committed


# -- spark-submit on a standalone cluster -------------------------------------------------------------------


def _job(
    env: Env, cluster: SparkCluster, table: str, data: Path, *extra: str, conf: dict[str, str] | None = None
) -> list[str]:
    args = ["--catalog", env.url, "--config", str(env.config), table, "--input", str(data), *extra]
    cmd = launch.command("write_dataframe", args, name=f"segrep-write-{table}", master=cluster.master_url)
    for key, value in (conf or {}).items():
        cmd[1:1] = ["--conf", f"{key}={value}"]
    return cmd


def _finished_apps(cluster: SparkCluster, before: set[str]) -> list[dict[str, Any]]:
    """The applications the master lists as completed since ``before`` (it learns of an end a moment after)."""
    deadline = time.monotonic() + 30
    while True:
        apps = [a for a in cluster.state()["completedapps"] if a["id"] not in before]
        if apps or time.monotonic() > deadline:
            return apps
        time.sleep(0.2)


def _job_env() -> dict[str, str]:
    return {**launch.spark_env(), "SPARK_LOCAL_IP": "127.0.0.1"}


def _input(df: Any, path: Path) -> Path:
    pq.write_table(df.toArrow(), path)
    return path


def test_the_job_writes_on_the_cluster_and_commits_in_the_driver(
    spark: Any, spark_cluster: SparkCluster, tmp_path: Path
) -> None:
    env = _env(tmp_path / "env")
    data = _input(_orders(spark, 600, 1), tmp_path / "orders.parquet")
    apps_before = {app["id"] for app in spark_cluster.state()["completedapps"]}

    done = subprocess.run(
        _job(env, spark_cluster, "orders", data),
        capture_output=True,
        text=True,
        timeout=300,
        env=_job_env(),
        cwd=env.root,
    )

    assert done.returncode == 0, f"{done.stderr[-3000:]}\n{spark_cluster.log_tails()}"
    assert "upserted 600 input row(s) into orders: 600 row(s) in 4 segment(s)" in done.stdout
    assert (
        read_table(env.catalog, "orders")
        .sort_by("o_orderkey")
        .equals(pq.read_table(data).sort_by("o_orderkey").cast(read_table(env.catalog, "orders").schema))
    )
    apps = _finished_apps(spark_cluster, apps_before)
    assert [(a["name"], a["state"]) for a in apps] == [("segrep-write-orders", "FINISHED")]
    assert spark_cluster.executor_dirs(apps[0]["id"])  # the files were written by the worker's executor


def test_the_job_refuses_bad_arguments_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = _env(tmp_path)
    job = _load_job()
    base = ["--catalog", env.url, "--config", str(env.config)]
    assert job.main([*base, "orders", "--input", str(tmp_path / "missing.parquet")]) == 2
    assert "segrep: error: input" in capsys.readouterr().err
    (tmp_path / "in.parquet").write_bytes(b"")
    assert job.main([*base, "nosuch", "--input", str(tmp_path / "in.parquet")]) == 2
    assert "nosuch" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        job.main([*base, "orders", "--input", str(tmp_path / "in.parquet"), "--mode", "merge"])
    assert exited.value.code == 2 and "invalid choice: 'merge'" in capsys.readouterr().err
    assert _table_files(env, "orders") == []


@pytest.mark.slow
def test_a_killed_job_commits_nothing_and_gc_removes_what_it_wrote(
    spark: Any, spark_cluster: SparkCluster, tmp_path: Path
) -> None:
    """The executor stops after writing its first file (``in_spark_write:hang``) and the job is killed there:
    the catalog never heard of the file, and GC removes it once past the orphan grace."""
    env = _env(tmp_path / "env")
    data = _input(_orders(spark, 600, 1), tmp_path / "orders.parquet")
    cmd = _job(env, spark_cluster, "orders", data, conf={"spark.executorEnv.SEGREP_FAULTS": "in_spark_write:hang"})
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_job_env(),
        cwd=env.root,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not [p for p in _table_files(env, "orders") if p.suffix == ".parquet"]:
            assert proc.poll() is None and time.monotonic() < deadline, spark_cluster.log_tails()
            time.sleep(0.5)
    finally:
        kill_group(proc)

    assert _segments(env, "orders") == 0 and read_table(env.catalog, "orders").num_rows == 0
    assert _unreferenced(env, "orders"), "the killed job left no file: the test would prove nothing"
    report = collect(env.catalog, env.defs, "orders", now_us=hlc.now_us() + TWO_DAYS_US)
    assert {d.reason.split(":")[0] for d in report.deletions} == {"orphan"}
    assert _table_files(env, "orders") == []


def _load_job() -> ModuleType:
    spec = importlib.util.spec_from_file_location("write_dataframe_job", ROOT / "spark_jobs" / "write_dataframe.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
