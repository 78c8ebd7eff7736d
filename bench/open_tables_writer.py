"""bench/open_tables.py part ``writer`` (issue 37 item 5): the Spark writer (``segrep.spark.write_dataframe``)
against Spark's own ``df.write.parquet`` of the same DataFrame on the same standalone cluster
(``tests.support.spark_cluster``: a master and one worker with ``--cores`` and ``--memory``, on loopback; this
process is the driver). The DataFrame is TPC-H ``lineitem`` at ``--scale`` (``tpchgen-cli``, cached in
``--tpch-dir``/sf<scale>) read from its Parquet file; the table has ``--partitions`` key ranges of about equal
size on ``l_orderkey``. After an unmeasured run of each, the two writes alternate ``--writer-repeats`` times;
each segrep write goes to a fresh catalog and sites (SQLite), each plain write to a fresh directory, removed
after it. Target: segrep's throughput at least 0.8 of plain Parquet's (median seconds of plain / median
seconds of segrep >= 0.8). segrep's time includes everything its call does: the checks, the planning pass over
the key columns, the writing pass (files hashed as written) and the commit. Each run's CPU seconds (this process
and every process under it: the cluster, the Python workers) are reported too, and their ratio: on a machine
other work keeps busy, wall time follows CPU time.

``--writer-ceiling`` adds two writes of the same DataFrame to each round of the alternation, as baselines of what
any writer taking the rows into Python on the executors pays: ``mapInArrow`` into a function that only counts
them (Spark's conversion of rows to Arrow batches alone), and into one that writes each task's rows with
``pq.write_table`` to a local directory (the least such a writer can do: no stamping, routing, hashing, fsync or
commit). Their ratios to plain Parquet bound the writer's: segrep does all that the second does and more.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support (the standalone Spark cluster)

from benchkit import log, quantile_splits, verdict

from segrep.catalog import Catalog
from segrep.catalog.apply import apply_definitions
from segrep.catalog.migrate import upgrade
from segrep.config.definitions import load_definitions
from segrep.data.demo import generate_tpch, lineitem_yaml
from segrep.spark import launch
from segrep.spark.dataframe_writer import write_dataframe
from tests.support.spark_cluster import start_spark_cluster

WRITER_TARGET = 0.8  # segrep's throughput / plain Parquet's


def _session(master: str, memory: str, arrow_batch_rows: int, split_mb: int) -> Any:
    """This process as the cluster's driver, with the jobs' own conf (``launch.SPARK_CONF``)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName("segrep-bench-open-tables")
    conf = {**launch.SPARK_CONF, "spark.pyspark.python": sys.executable, "spark.executor.memory": memory}
    conf["spark.driver.memory"] = "2g"
    conf["spark.ui.showConsoleProgress"] = "false"  # the bench's own lines only
    if arrow_batch_rows:  # rows per Arrow batch into the writer's Python tasks (Spark's default: 10,000)
        conf["spark.sql.execution.arrow.maxRecordsPerBatch"] = str(arrow_batch_rows)
    if split_mb:  # the input's Spark partitions (Spark's default: up to 128 MB, at least a core's share)
        conf["spark.sql.files.maxPartitionBytes"] = str(split_mb * 2**20)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _cpu_s() -> float:
    """CPU seconds (user and system) used so far by this process and everything under it: the driver's JVM,
    the cluster's master, worker and executor, the Python workers (those that ended, through their parents).
    Unlike seconds of wall time, a run's difference hardly depends on what else the machine is running."""
    stats: dict[int, tuple[int, int]] = {}  # pid -> (parent, clock ticks of it and its waited-for children)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        fields = text[text.rindex(")") + 2 :].split()
        stats[int(entry)] = (int(fields[1]), sum(int(v) for v in fields[11:15]))
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0))[1]
        todo += children.get(pid, [])
    return total / os.sysconf("SC_CLK_TCK")


def _lineitem_table(root: Path, source: Path, splits: list[int]) -> Catalog:
    """A fresh catalog and site holding an empty ``lineitem`` led by ``primary`` (no replica)."""
    root.mkdir(parents=True)
    config = root / "segrep.yaml"
    config.write_text(lineitem_yaml(source, splits, []))
    catalog = Catalog(f"sqlite:///{root}/catalog.db")
    upgrade(catalog)
    apply_definitions(catalog, load_definitions(config))
    return catalog


def part_writer(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """``write_dataframe`` vs ``df.write.parquet`` of TPC-H lineitem on one standalone cluster."""
    source = generate_tpch("lineitem", args.scale, (args.tpch_dir or work / "tpch") / f"sf{args.scale:g}")
    rows = pq.ParquetFile(source).metadata.num_rows
    splits = quantile_splits(pq.read_table(source, columns=["l_orderkey"]), "l_orderkey", args.partitions)
    mib = source.stat().st_size / 2**20
    log(f"lineitem scale {args.scale}: {rows:,} rows, {mib:.0f} MiB of Parquet, {args.partitions} partitions")
    names = ["plain", "segrep", *(CEILINGS if args.writer_ceiling else ())]
    times: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    details: list[dict[str, Any]] = []
    cluster_cm = contextlib.contextmanager(start_spark_cluster)(work / "cluster", cores=args.cores, memory=args.memory)
    with cluster_cm as cluster:
        spark = _session(cluster.master_url, args.executor_memory, args.arrow_batch_rows, args.split_mb)
        df = spark.read.parquet(str(source))
        log(f"{df.rdd.getNumPartitions()} Spark partitions of the input; cluster {cluster.master_url}")
        counter = iter(range(10**6))

        def plain() -> float:
            out = work / f"plain-{next(counter)}"
            started = time.perf_counter()
            df.write.parquet(str(out))
            secs = time.perf_counter() - started
            shutil.rmtree(out)
            return secs

        def segrep() -> float:
            root = work / f"segrep-{next(counter)}"
            catalog = _lineitem_table(root, source, splits)
            started = time.perf_counter()
            result = write_dataframe(df, "lineitem", catalog=catalog)
            secs = time.perf_counter() - started
            details.append(
                {
                    "secs": secs,
                    "files_s": result.files_s,
                    "commit_s": result.commit_s,
                    "segments": len(result.segments),
                    "rows_written": result.rows_written,
                    "bytes": sum(seg.byte_size for seg in result.segments),
                }
            )
            assert result.rows_written == rows, (result.rows_written, rows)
            catalog.dispose()
            shutil.rmtree(root)
            return secs

        runs: dict[str, Callable[[], float]] = {"plain": plain, "segrep": segrep}
        if args.writer_ceiling:
            runs |= ceiling_runs(df, work)
        for name, run in runs.items():  # warm-up: the JVMs, the Python workers, the input in the page cache
            log(f"warm-up {name}: {run():.1f} s")
        details.clear()
        for i in range(args.writer_repeats):
            order = names[i % len(names) :] + names[: i % len(names)]  # each first in turn
            for name in order:
                before = _cpu_s()
                secs = runs[name]()
                cpu[name].append(_cpu_s() - before)
                times[name].append(secs)
                log(f"repeat {i + 1}: {name} {secs:.1f} s, {cpu[name][-1]:.1f} CPU s (load {os.getloadavg()[0]:.2f})")
        spark.stop()
    plain_s, segrep_s = statistics.median(times["plain"]), statistics.median(times["segrep"])
    ratio = plain_s / segrep_s
    plain_cpu, segrep_cpu = statistics.median(cpu["plain"]), statistics.median(cpu["segrep"])
    cpu_ratio = plain_cpu / segrep_cpu
    log(f"CPU seconds, medians: plain {plain_cpu:.1f}, segrep {segrep_cpu:.1f}")
    ceilings = {
        name: {"s": times[name], "cpu_s": cpu[name], "ratio": plain_s / statistics.median(times[name])}
        for name in CEILINGS
        if name in times
    }
    return {
        "rows": rows,
        "input_mib": mib,
        "plain_s": times["plain"],
        "segrep_s": times["segrep"],
        "segrep_runs": details,
        "plain_cpu_s": cpu["plain"],
        "segrep_cpu_s": cpu["segrep"],
        "cpu_ratio": cpu_ratio,  # plain's CPU seconds / segrep's (medians): the wall-time ratio of a busy machine
        "ratio": ratio,
        "met": ratio >= WRITER_TARGET,
        "ceilings": ceilings,
        "table": [
            (
                f"writer: lineitem scale {args.scale} ({rows:,} rows), {args.cores} core(s), "
                f"median of {args.writer_repeats}",
                f"{segrep_s:.1f} s ({rows / segrep_s / 1e6:.2f} M rows/s)",
                f"{plain_s:.1f} s df.write.parquet ({rows / plain_s / 1e6:.2f} M rows/s)",
                f"{ratio:.2f} (CPU s: {cpu_ratio:.2f})",
                f">= {WRITER_TARGET}",
                verdict(ratio >= WRITER_TARGET),
            )
        ]
        + [
            (
                f"(writer, ceiling) {CEILINGS[name]} vs df.write.parquet, median of {args.writer_repeats}",
                f"{statistics.median(c['s']):.1f} s",
                f"{plain_s:.1f} s",
                f"{c['ratio']:.2f} (CPU s: {plain_cpu / statistics.median(c['cpu_s']):.2f})",
                "-",
                "-",
            )
            for name, c in ceilings.items()
        ],
    }


CEILINGS = {
    "count": "Spark's rows to Arrow alone: mapInArrow into a function that only counts the rows",
    "bare": "the least a writer on the executors does: mapInArrow, each task's rows written by pq.write_table",
}


def ceiling_runs(df: Any, work: Path) -> dict[str, Callable[[], float]]:
    """The two baselines of ``--writer-ceiling``, each a timed job over ``df`` on the same cluster. Their
    functions are defined here, not at the module's top: Spark ships them by value (an executor cannot import
    this bench's modules)."""
    counter = iter(range(10**6))

    def job(rows_of: Callable[[Any], Any]) -> float:
        """One timed ``mapInArrow`` over ``df``; each task yields the rows it had, which must add up to the input."""
        started = time.perf_counter()
        got = df.mapInArrow(rows_of, "rows long").toArrow()
        secs = time.perf_counter() - started
        assert sum(got.column("rows").to_pylist()) == df_rows, "the tasks' rows differ from the input's"
        return secs

    def counted(batches: Any) -> Any:
        yield pa.RecordBatch.from_pydict({"rows": [sum(batch.num_rows for batch in batches)]})

    def bare() -> float:
        out = work / f"bare-{next(counter)}"
        out.mkdir()
        target = str(out)

        def written(batches: Any) -> Any:
            chunks = list(batches)
            rows = sum(batch.num_rows for batch in chunks)
            if rows:
                pq.write_table(pa.Table.from_batches(chunks), f"{target}/{uuid.uuid4().hex}.parquet")
            yield pa.RecordBatch.from_pydict({"rows": [rows]})

        secs = job(written)
        shutil.rmtree(out)
        return secs

    df_rows = df.count()
    return {"count": lambda: job(counted), "bare": bare}
