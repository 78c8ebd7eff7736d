"""Benchmark: open tables (issue 37 item 5), one part per ``--part``.

Run by hand (``python bench/open_tables.py --part writer``); prints a markdown table with each measure and MET /
NOT MET, and with ``--json PATH`` writes the figures there. Each part is one function (``PARTS``).

``writer``: the Spark writer (``segrep.spark.write_dataframe``) against Spark's own ``df.write.parquet`` of the same
DataFrame on the same standalone cluster (``tests.support.spark_cluster``: a master and one worker with
``--cores`` and ``--memory``, on loopback; this process is the driver). The DataFrame is TPC-H ``lineitem`` at
``--scale`` (``tpchgen-cli``, cached in ``--tpch-dir``/sf<scale>) read from its Parquet file; the table has
``--partitions`` key ranges of about equal size on ``l_orderkey``. After an unmeasured run of each, the two
writes alternate ``--repeats`` times; each segrep write goes to a fresh catalog and sites (SQLite), each plain
write to a fresh directory, removed after it. Target: segrep's throughput at least 0.8 of plain Parquet's
(median seconds of plain / median seconds of segrep >= 0.8). segrep's time includes everything its call does:
the checks, the planning pass over the key columns, the writing pass (files hashed as written) and the commit.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support (the standalone Spark cluster)

from benchkit import args_doc, background_load, load_footer, log, quantile_splits, verdict

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
    times: dict[str, list[float]] = {"plain": [], "segrep": []}
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
        for name, run in runs.items():  # warm-up: the JVMs, the Python workers, the input in the page cache
            log(f"warm-up {name}: {run():.1f} s")
        details.clear()
        for i in range(args.repeats):
            order = ["plain", "segrep"] if i % 2 == 0 else ["segrep", "plain"]
            for name in order:
                secs = runs[name]()
                times[name].append(secs)
                log(f"repeat {i + 1}: {name} {secs:.1f} s (load {os.getloadavg()[0]:.2f})")
        spark.stop()
    plain_s, segrep_s = statistics.median(times["plain"]), statistics.median(times["segrep"])
    ratio = plain_s / segrep_s
    return {
        "rows": rows,
        "input_mib": mib,
        "plain_s": times["plain"],
        "segrep_s": times["segrep"],
        "segrep_runs": details,
        "ratio": ratio,
        "met": ratio >= WRITER_TARGET,
        "table": [
            (
                f"writer: lineitem scale {args.scale} ({rows:,} rows), {args.cores} core(s), median of {args.repeats}",
                f"{segrep_s:.1f} s ({rows / segrep_s / 1e6:.2f} M rows/s)",
                f"{plain_s:.1f} s df.write.parquet ({rows / plain_s / 1e6:.2f} M rows/s)",
                f"{ratio:.2f}",
                f">= {WRITER_TARGET}",
                verdict(ratio >= WRITER_TARGET),
            )
        ],
    }


PARTS: dict[str, Callable[[argparse.Namespace, Path], dict[str, Any]]] = {"writer": part_writer}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=sorted(PARTS), action="append", help="part to run (repeatable; default all)")
    ap.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor")
    ap.add_argument("--partitions", type=int, default=4, help="key ranges of the table (writer)")
    ap.add_argument("--repeats", type=int, default=3, help="measured runs of each side (medians)")
    ap.add_argument("--cores", type=int, default=2, help="cores of the cluster's worker (writer)")
    ap.add_argument("--memory", default="4g", help="memory of the cluster's worker (writer)")
    ap.add_argument("--executor-memory", default="3g", help="heap of the executor (writer)")
    ap.add_argument("--arrow-batch-rows", type=int, default=0, help="rows per Arrow batch (0: Spark's default)")
    ap.add_argument("--split-mb", type=int, default=0, help="most MB of input per Spark partition (0: Spark's)")
    ap.add_argument("--tpch-dir", type=Path, default=None, help="TPC-H cache (default: in the scratch directory)")
    ap.add_argument("--work-dir", type=Path, default=None, help="parent of the scratch directory (default: /tmp)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    ap.add_argument("--background-load", type=int, default=0, metavar="N", help="N CPU-bound processes meanwhile")
    args = ap.parse_args()
    if args.scale <= 0 or args.repeats < 1 or args.partitions < 1 or args.cores < 1:
        ap.error("--scale, --repeats, --partitions and --cores must be positive")

    load_start = os.getloadavg()
    results: dict[str, dict[str, Any]] = {}
    scratch = tempfile.TemporaryDirectory(prefix="segrep-bench-open-tables-", dir=args.work_dir)
    with scratch as tmp, background_load(args.background_load):
        started = time.monotonic()
        for part in args.part or sorted(PARTS):
            results[part] = PARTS[part](args, Path(tmp))
        secs = time.monotonic() - started
    load_end = os.getloadavg()
    print("\n| measure | segrep | baseline (same run) | ratio | target | result |")
    print("|---|---|---|---|---|---|")
    for figures in results.values():
        for row in figures["table"]:
            print("| " + " | ".join(row) + " |")
    print(load_footer(secs, args.background_load, load_start, load_end))
    if args.json:
        doc = {
            "date": dt.datetime.now().isoformat(timespec="seconds"),
            "args": args_doc(args),
            "loadavg": [load_start, load_end],
            "parts": results,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        log(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
