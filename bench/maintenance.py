"""Benchmark: compaction and bootstrap on TPC-H lineitem (issue 4).

Run by hand (`python bench/maintenance.py --scale 1`); results go to the README. In one run:

1. compaction: lineitem written through segrep in 20 batches (so every partition holds a chain of 20
   segments: one major and 19 minors on top, 5% of the rows of later batches being updates), then
   ``segrep.maintenance.compaction.compact(force=True)``: one spark-submit of the merge job folding every
   partition into a major segment (last writer wins). Rows per second = input rows / wall time of the whole
   step, Spark start-up included. For reference, the same fold in-process with pyarrow
   (segrep.data.reader.resolve), and a check that every site resolves to the same rows before and after.
2. bootstrap copy: a new replica site joins (apply + bootstrap) and one round copies the leader's chains
   (now one major per partition) by fast-forward; bytes per second against ``cp`` of the same files in the
   same run (median of alternating repeats, each into a fresh directory).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from segrep.catalog import Catalog
from segrep.catalog.apply import apply_definitions
from segrep.catalog.migrate import upgrade
from segrep.config.definitions import load_definitions
from segrep.data import demo as demo_data
from segrep.data.reader import read_table, resolve
from segrep.data.writer import write_batch
from segrep.maintenance.bootstrap import bootstrap
from segrep.maintenance.compaction import compact
from segrep.replication.orchestrator import run_round

KEY = [("l_orderkey", "ascending"), ("l_linenumber", "ascending")]


def setup(root: Path, source: Path, splits: list[int], replicas: list[str]) -> tuple[Catalog, Path]:
    config = root / "segrep.yaml"
    config.write_text(demo_data.lineitem_yaml(source, splits, replicas, {"compact_min_segments": 2}))
    catalog = Catalog(f"sqlite:///{root}/catalog.db")
    upgrade(catalog)
    apply_definitions(catalog, load_definitions(config))
    return catalog, config


def batches(rows: pa.Table, n: int, update_frac: float, seed: int = 7) -> list[pa.Table]:
    """n slices of the table; from the second on, each also re-writes update_frac of the rows seen so far."""
    rng = np.random.default_rng(seed)
    bounds = np.linspace(0, rows.num_rows, n + 1).astype(int)
    out = []
    for i in range(n):
        fresh = rows.slice(int(bounds[i]), int(bounds[i + 1] - bounds[i]))
        if i and update_frac:
            idx = np.sort(rng.choice(int(bounds[i]), int(bounds[i] * update_frac / i) or 1, replace=False))
            upd = rows.take(pa.array(idx))
            upd = upd.set_column(
                upd.schema.get_field_index("l_comment"),
                "l_comment",
                pc.binary_join_element_wise(upd["l_comment"], pa.scalar(f" u{i}"), ""),
            )
            fresh = pa.concat_tables([fresh, upd])
        out.append(fresh)
    return out


def bench_compaction(rows: pa.Table, source: Path, work: Path, n_batches: int) -> dict[str, float]:
    catalog, config = setup(work, source, _splits(rows), ["dr"])
    defs = load_definitions(config)
    rows_in = 0
    for b in batches(rows, n_batches, 0.05):
        write_batch(catalog, "lineitem", b)
        rows_in += b.num_rows
    before = read_table(catalog, "lineitem").sort_by(KEY)
    t = time.perf_counter()
    segs = [pq.read_table(p) for p in sorted((work / "data/sites/primary/lineitem").rglob("*.parquet"))]
    resolve(pa.concat_tables(segs), ["l_orderkey", "l_linenumber"])
    pyarrow_s = time.perf_counter() - t
    t = time.perf_counter()
    report = compact(catalog, defs, "lineitem", force=True)
    compact_s = time.perf_counter() - t
    after = read_table(catalog, "lineitem").sort_by(KEY)
    assert report.committed == len(report.candidates), report
    assert after.equals(before), "compaction changed the resolved rows"
    run_round(catalog, defs, "lineitem")  # dr takes the majors by fast-forward
    assert read_table(catalog, "lineitem", "dr").sort_by(KEY).equals(before)
    catalog.dispose()
    return {
        "compaction_rows_in": rows_in,
        "compaction_rows_out": before.num_rows,
        "compaction_partitions": len(report.candidates),
        "compaction_s": compact_s,
        "compaction_rows_per_s": rows_in / compact_s,
        "pyarrow_fold_s": pyarrow_s,
        "pyarrow_fold_rows_per_s": rows_in / pyarrow_s,
    }


def _splits(rows: pa.Table) -> list[int]:
    keys = rows.column("l_orderkey")
    top = int(pc.max(keys).as_py())
    return [top // 4, top // 2, 3 * top // 4]


def bench_bootstrap(work: Path) -> dict[str, float]:
    """The compacted table of ``work`` gains replica `edge`; time the round that copies it, against cp of the
    same files before and after it (median)."""
    config = work / "segrep.yaml"
    catalog = Catalog(f"sqlite:///{work}/catalog.db")
    source_dir = work / "data/sites/primary/lineitem"

    def cp() -> float:
        target = work / "cp-target"
        t = time.perf_counter()
        subprocess.run(["cp", "-r", str(source_dir), str(target)], check=True)
        elapsed = time.perf_counter() - t
        shutil.rmtree(target)
        return elapsed

    cp_times = [cp()]
    config.write_text(config.read_text().replace("replicas: [dr]", "replicas: [dr, edge]"))
    defs = load_definitions(config)
    apply_definitions(catalog, defs)
    bootstrap(catalog, defs, "lineitem", "edge")
    t = time.perf_counter()
    report = run_round(catalog, defs, "lineitem", target="edge")
    seg_s = time.perf_counter() - t
    cp_times.append(cp())
    assert report.spark_apps == 0 and report.targets["edge"].status == "ok", report
    copied = sum(p.stat().st_size for p in (work / "data/sites/edge/lineitem").rglob("*.parquet"))
    total = sum(p.stat().st_size for p in source_dir.rglob("*.parquet"))
    assert read_table(catalog, "lineitem", "edge").sort_by(KEY).equals(read_table(catalog, "lineitem").sort_by(KEY))
    catalog.dispose()
    cp_s = statistics.median(cp_times)
    return {
        "bootstrap_bytes": copied,
        "cp_bytes": total,
        "cp_bytes_per_s": total / cp_s,
        "bootstrap_s": seg_s,
        "bootstrap_bytes_per_s": copied / seg_s,
        "bootstrap_vs_cp": (copied / seg_s) / (total / cp_s),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--work", type=Path, default=None, help="work directory (default: a temporary one)")
    args = parser.parse_args()
    source = demo_data.generate_tpch("lineitem", args.scale, Path("data/tpch").resolve() / f"sf{args.scale:g}")
    rows = demo_data.normalized(pq.read_table(source))
    work = Path(args.work or tempfile.mkdtemp(prefix="segrep-bench-maint-"))
    try:
        res = bench_compaction(rows, source, work, args.batches)
        res |= bench_bootstrap(work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(res, indent=2))
    print()
    print("| measure | value |")
    print("|---|---|")
    print(
        f"| compaction, {res['compaction_rows_in']:,} rows in {args.batches} segments per partition, "
        f"{res['compaction_partitions']} partitions, Spark start-up included | "
        f"{res['compaction_rows_per_s']:,.0f} rows/s ({res['compaction_s']:.1f} s) |"
    )
    print(f"| same fold in-process with pyarrow (reference) | {res['pyarrow_fold_rows_per_s']:,.0f} rows/s |")
    print(
        f"| bootstrap copy (fast-forward of the majors) vs cp | {res['bootstrap_bytes_per_s'] / 1e6:,.0f} MB/s vs "
        f"{res['cp_bytes_per_s'] / 1e6:,.0f} MB/s = {res['bootstrap_vs_cp']:.2f} |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
