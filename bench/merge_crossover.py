"""Benchmark: where a merge stops being cheaper in process than as a Spark application (issue 33 item 2).

For each fork size N (default 10, 1k, 10k, 100k, 1M rows) one merge manifest, like a round's: a leader
partition of N rows (one major, keys 0..N-1) and a fork pushed by another site of N rows (keys N/2..3N/2: half
updates, half new keys; about 5% of them deletes, in a second segment), orders-like columns. The same manifest
runs in process (``spark.in_process``, through ``run_merge_manifest(force="in_process")``) and as a Spark
application (``spark-submit spark_jobs/merge.py`` through ``launch.submit``, JVM start-up included), in the same
run; their output files must be equal byte for byte. Also timed: the engine decision itself (``choose_engine``:
the input files' footers read), and the in-process run's peak memory (its RSS growth). Each in-process run is
in a fresh child process, after the imports pyarrow makes on its first use in a process (pandas and
pyarrow.dataset: timed apart, a once-per-process cost that a long-lived worker has already paid).

Run by hand (`python bench/merge_crossover.py`; `make bench-rounds` runs it after bench/rounds.py). Prints a
markdown table with the load average beside every figure and writes bench/results/merge-crossover-<date>.json.
``--background-load N`` runs N CPU-bound processes meanwhile. Target (issue 33): a fork of <= 100,000 rows
merged in <= 2 s in process. The policy's defaults (``in_process_merge_max_rows`` and ``_bytes``) come from here.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import multiprocessing
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from benchkit import ORDERS_COLUMNS, background_load, log, verdict

from segrep.config.stores import StoreOptions
from segrep.core import schema as sch
from segrep.core.ids import new_segment_id
from segrep.spark import launch
from segrep.spark.manifest import FileRef, Manifest, MergeItem, output_segment_id
from segrep.spark.merge_runner import MergeLimits, choose_engine, run_merge_manifest
from segrep.storage.segment_meta import SegmentEntry, entry_stats, stamp_rows
from segrep.storage.site import Site, segment_relpath

TABLE = "orders"
COLUMNS = ORDERS_COLUMNS
PK = ["o_orderkey"]
WORDS = np.array(
    [
        "furiously",
        "regular",
        "deposits",
        "sleep",
        "quickly",
        "final",
        "ironic",
        "accounts",
        "haggle",
        "blithely",
        "carefully",
    ]
)
TARGET_ROWS, TARGET_S = 100_000, 2.0
Results = dict[str, Any]


def rows_for(keys: np.ndarray, seed: int) -> pa.Table:
    """Orders-like rows for ``keys`` (comments of 4-9 words, as TPC-H's are 19-78 characters)."""
    rng = np.random.default_rng(seed)
    n = len(keys)
    words = WORDS[rng.integers(0, len(WORDS), size=(n, 9))]
    lengths = rng.integers(4, 10, size=n)
    comments = [" ".join(w[:k]) for w, k in zip(words, lengths, strict=True)]
    cents = rng.integers(100, 50_000_000, size=n)
    return pa.table(
        {
            "o_orderkey": pa.array(keys, pa.int64()),
            "o_custkey": pa.array(rng.integers(1, 150_000, size=n), pa.int64()),
            "o_orderstatus": pa.array(rng.choice(["O", "F", "P"], size=n)),
            "o_totalprice": pa.array([Decimal(c).scaleb(-2) for c in cents.tolist()], pa.decimal128(15, 2)),
            "o_orderdate": pa.array(rng.integers(8035, 10591, size=n).astype("int32"), pa.int32()).cast(pa.date32()),
            "o_orderpriority": pa.array(rng.choice(["1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW"], n)),
            "o_clerk": pa.array([f"Clerk#{c:09d}" for c in rng.integers(1, 1000, size=n).tolist()]),
            "o_shippriority": pa.array(np.zeros(n, np.int32), pa.int32()),
            "o_comment": pa.array(comments),
        }
    )


def write_segment(site: Site, site_id: int, rows: pa.Table, base: str | None, major: bool) -> FileRef:
    """A segment of ``rows`` (segment layout) at ``site``, as the writer would make it; its file reference."""
    schema = sch.schema_from_columns(COLUMNS)
    rows = rows.sort_by([(k, "ascending") for k in PK])
    entry = SegmentEntry(
        segment_id=new_segment_id(),
        table=TABLE,
        partition_id=1,
        base_segment_id=base,
        is_major=major,
        origin_site_id=site_id,
        epoch=1,
        schema_fingerprint=sch.fingerprint(schema, PK),
        **entry_stats(rows, PK),
    )
    relpath = segment_relpath(TABLE, 1, entry.segment_id)
    facts = site.write_segment(relpath, rows, entry.to_meta())
    return FileRef(
        site.name, site.uri, relpath, entry.segment_id, facts.byte_size, facts.sha256, site_id, StoreOptions()
    )


def fork_manifest(root: Path, n: int) -> Path:
    """The leader's N rows and a fork of N rows (half updates, about 5% deletes) as a merge manifest."""
    schema = sch.schema_from_columns(COLUMNS)
    sites = {}
    for site_id, name in ((1, "primary"), (2, "dr")):
        (root / name).mkdir(parents=True)
        sites[name] = (site_id, Site(name, str(root / name), StoreOptions()))
    leader_rows = stamp_rows(rows_for(np.arange(n), 1), schema, version=1_000, deleted=False, origin=1)
    leader = write_segment(sites["primary"][1], 1, leader_rows, None, True)
    keys = np.arange(n // 2, n // 2 + n)
    deleted = np.random.default_rng(2).random(n) < 0.05
    upserts = stamp_rows(rows_for(keys[~deleted], 3), schema, version=2_000, deleted=False, origin=2)
    deletes = stamp_rows(rows_for(keys[deleted], 4).select(PK), schema, version=2_001, deleted=True, origin=2)
    incoming = [write_segment(sites["dr"][1], 2, upserts, None, False)]
    if deletes.num_rows:
        incoming.append(write_segment(sites["dr"][1], 2, deletes, incoming[0].segment_id, False))
    key = f"{TABLE}-bench-{n}"
    item = MergeItem(
        item_id="merge-1",
        kind="merge",
        table=TABLE,
        partition_id=1,
        columns=list(COLUMNS.items()),
        primary_key=PK,
        schema_fingerprint=sch.fingerprint(schema, PK),
        leader_site="primary",
        leader_uri=str(root / "primary"),
        leader_options=StoreOptions(),
        leader_placement_id=1,
        leader_site_id=1,
        epoch=1,
        base_segment_id=leader.segment_id,
        partition_begin=None,
        partition_end=None,
        visible=[leader],
        incoming=incoming,
        output_segment_id=output_segment_id(key, "merge", 1, leader.segment_id, [r.segment_id for r in incoming]),
        origin_forks={"2": 500},
    )
    path = root / "manifest.json"
    Manifest(key, [item]).write(path)
    return path


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _child(manifest: Path, result: Path, conn: Any) -> None:
    started = time.perf_counter()
    import pandas  # noqa: F401  (what pyarrow imports on its first conversion in a process)
    import pyarrow.dataset  # noqa: F401  (and on its first filter by expression)

    imports = time.perf_counter() - started
    before = _rss_kb()
    started = time.perf_counter()
    run = run_merge_manifest(manifest, result, submit=_no_spark, limits=LIMITS, name="bench", force="in_process")
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    conn.send((seconds, max(0, peak - before) * 1024, imports, run.engine.value))


def _no_spark(*args: Any, **kwargs: Any) -> None:
    raise SystemExit("the in-process measurement started Spark")


LIMITS = MergeLimits(10**12, 2**50)


def in_process(manifest: Path, result: Path) -> tuple[float, int, float]:
    """Wall seconds and peak memory growth of one in-process run in a fresh child process, and the seconds of
    the child's first-use imports."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(manifest, result, child))
    proc.start()
    seconds, peak, imports, engine = parent.recv()
    proc.join()
    assert engine == "in_process", engine
    return seconds, peak, imports


def on_spark(manifest: Path, result: Path) -> float:
    started = time.perf_counter()
    run = run_merge_manifest(manifest, result, submit=launch.submit, limits=LIMITS, name="bench-merge", force="spark")
    assert run.engine == "spark"
    return time.perf_counter() - started


def output_bytes(root: Path, result: Path) -> bytes:
    (item,) = json.loads(result.read_text())["items"]
    assert item["status"] == "ok", item
    return (root / "primary" / item["output"]["relpath"]).read_bytes()


def measure(n: int, work: Path, args: argparse.Namespace) -> Results:
    root = work / f"n{n}"
    manifest = fork_manifest(root, n)
    loaded = Manifest.load(manifest)
    started = time.perf_counter()
    choice = choose_engine(loaded, MergeLimits(10**12, 2**50))
    decide_s = time.perf_counter() - started
    out: Results = {"fork_rows": n, "rows_in": choice.rows_in, "bytes_in": choice.bytes_in, "decide_s": decide_s}
    runs = []
    for _ in range(args.repeats):
        load = os.getloadavg()
        seconds, peak, imports = in_process(manifest, root / "result-in-process.json")
        runs.append((seconds, peak, load, imports))
    runs.sort(key=lambda r: r[0])
    seconds, peak, load, imports = runs[len(runs) // 2]
    out |= {"in_process_s": seconds, "in_process_all_s": [r[0] for r in runs], "peak_rss_bytes": peak}
    out["first_use_imports_s"] = imports
    out["in_process_load"] = load
    mine = output_bytes(root, root / "result-in-process.json")
    log(f"{n:>9,} rows: in process {seconds:.3f} s (median of {args.repeats}), +{peak / 2**20:.0f} MiB, load {load[0]}")
    if args.spark_max_rows is None or n <= args.spark_max_rows:
        out["spark_load"] = os.getloadavg()
        out["spark_s"] = on_spark(manifest, root / "result-spark.json")
        out["same_file"] = output_bytes(root, root / "result-spark.json") == mine
        log(f"{n:>9,} rows: Spark {out['spark_s']:.1f} s, the same output file: {out['same_file']}")
    shutil.rmtree(root)
    return out


def table(results: list[Results]) -> None:
    print(
        "| fork rows | input rows | input MiB | decision | in process | peak RSS growth | load | Spark | load |"
        " same file | in process / Spark | (imports of a fresh process) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        spark = f"{r['spark_s']:.1f} s" if "spark_s" in r else "-"
        ratio = f"{r['in_process_s'] / r['spark_s']:.3f}" if "spark_s" in r else "-"
        print(
            f"| {r['fork_rows']:,} | {r['rows_in']:,} | {r['bytes_in'] / 2**20:.2f} | {r['decide_s'] * 1000:.0f} ms "
            f"| {r['in_process_s']:.3f} s | {r['peak_rss_bytes'] / 2**20:.0f} MiB | {_load(r.get('in_process_load'))} "
            f"| {spark} | {_load(r.get('spark_load'))} | {r.get('same_file', '-')} | {ratio} "
            f"| {r['first_use_imports_s']:.2f} s |"
        )
    at = [r for r in results if r["fork_rows"] == TARGET_ROWS]
    if at:
        ok = at[0]["in_process_s"] <= TARGET_S
        print(
            f"\ntarget: a fork of {TARGET_ROWS:,} rows merged in <= {TARGET_S} s in process: "
            f"{at[0]['in_process_s']:.2f} s, {verdict(ok)}"
        )


def _load(load: Any) -> str:
    return "-" if not load else ", ".join(f"{x:.2f}" for x in load)


@contextlib.contextmanager
def scratch(parent: Path | None) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="segrep-merge-crossover-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,1000,10000,100000,1000000", help="fork sizes in rows, comma-separated")
    ap.add_argument("--repeats", type=int, default=3, help="in-process runs per size (the median is reported)")
    ap.add_argument("--spark-max-rows", type=int, default=None, help="no Spark run above this fork size")
    ap.add_argument("--skip-spark", action="store_true", help="in process only")
    ap.add_argument("--background-load", type=int, default=0, help="CPU-bound processes running meanwhile")
    ap.add_argument("--work-dir", type=Path, default=None, help="parent of the scratch directory (default: /tmp)")
    ap.add_argument("--results-dir", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    if args.skip_spark:
        args.spark_max_rows = -1
    sizes = [int(x) for x in args.sizes.split(",")]
    results: Results = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count()}
    results["background_load"] = args.background_load
    results["loadavg_start"] = os.getloadavg()
    with scratch(args.work_dir) as work, background_load(args.background_load):
        results["sizes"] = [measure(n, work, args) for n in sizes]
    results["loadavg_end"] = os.getloadavg()
    print(
        f"\nload average at the start {_load(results['loadavg_start'])}, at the end {_load(results['loadavg_end'])}; "
        f"{os.cpu_count()} CPUs; background load {args.background_load}\n"
    )
    table(results["sizes"])
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / f"merge-crossover-{results['date'][:10]}.json"
    out.write_text(json.dumps(results, indent=2))
    log(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
