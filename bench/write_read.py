"""Benchmark: writing and reading TPC-H lineitem through segrep against plain pyarrow, and the catalog commit
time of one segment on SQLite and PostgreSQL.

Run by hand (`make bench`, or `python bench/write_read.py --scale 1`); results go to the README. Every figure
is measured in the same run as its baseline:

1. write: the same N batches of lineitem rows written through segrep (check, dedupe, route to 4 partitions,
   stamp, atomic write with the sha256 taken as the bytes go out + fsync of file and directory, catalog commit)
   vs ``pyarrow.parquet.write_table`` of each batch to a file, both with pyarrow's default Parquet settings;
   ``write_segrep_files_s_total`` is the part of segrep's time from routing to the last file in place (stamp,
   encode, hash, fsync), the rest being check, dedupe and the catalog commit;
2. read: the whole table through segrep's reader (segments do not overlap: the concatenation fast path) vs
   ``pyarrow.parquet.read_table`` of the same files; then again after 5% of the rows were updated (the
   last-writer-wins resolve path);
3. commit: the catalog transaction of one segment (conditional root move + insert, no row read), median of
   repeated writes, for a 1,000-row and a 1,000,000-row segment, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from benchkit import pg_schema, timed

from segrep.catalog import Catalog
from segrep.catalog.apply import apply_definitions
from segrep.catalog.migrate import upgrade
from segrep.config.definitions import load_definitions
from segrep.data import demo as demo_data
from segrep.data.reader import read_table
from segrep.data.writer import write_batch


def setup(root: Path, source: Path, splits: list[int], url: str | None = None) -> Catalog:
    root.mkdir(parents=True, exist_ok=True)
    config = root / "segrep.yaml"
    config.write_text(demo_data.lineitem_yaml(source, splits, ["dr"]))
    catalog = Catalog(url or f"sqlite:///{root}/catalog.db")
    upgrade(catalog)
    apply_definitions(catalog, load_definitions(config))
    return catalog


def bench_write_read(rows: pa.Table, source: Path, batches: int, work: Path) -> dict[str, float]:
    keys = rows.column("l_orderkey").to_numpy()
    splits = [int(np.quantile(keys, q)) for q in (0.25, 0.5, 0.75)]
    chunks = [rows.slice(off, len(idx)) for off, idx in _offsets(rows.num_rows, batches)]
    out: dict[str, float] = {"rows": rows.num_rows, "batches": batches}

    plain_dir = work / "plain"
    plain_dir.mkdir()
    _, plain_w = timed(lambda: [pq.write_table(c, plain_dir / f"{i}.parquet") for i, c in enumerate(chunks)])
    catalog = setup(work / "seg", source, splits)
    results, seg_w = timed(lambda: [write_batch(catalog, "lineitem", c) for c in chunks])
    out |= {
        "write_plain_rows_s": rows.num_rows / plain_w,
        "write_segrep_rows_s": rows.num_rows / seg_w,
        "write_ratio": plain_w / seg_w,
        "write_segrep_files_s_total": sum(r.files_s for r in results),
        "write_segrep_commit_s_total": sum(r.commit_s for r in results),
    }

    files = sorted(plain_dir.glob("*.parquet"))
    plain_t, plain_r = timed(lambda: pq.read_table([str(f) for f in files]))
    seg_t, seg_r = timed(read_table, catalog, "lineitem")
    assert seg_t.num_rows == plain_t.num_rows == rows.num_rows, (seg_t.num_rows, rows.num_rows)
    out |= {
        "read_plain_rows_s": rows.num_rows / plain_r,
        "read_segrep_rows_s": rows.num_rows / seg_r,
        "read_ratio": plain_r / seg_r,
    }
    del plain_t, seg_t

    rng = np.random.default_rng(1)
    upd_idx = np.sort(rng.choice(rows.num_rows, size=rows.num_rows // 20, replace=False))
    updates = rows.take(pa.array(upd_idx))
    write_batch(catalog, "lineitem", updates)
    upd_t, upd_r = timed(read_table, catalog, "lineitem")
    assert upd_t.num_rows == rows.num_rows
    out |= {"read_after_5pct_updates_rows_s": rows.num_rows / upd_r, "read_after_updates_ratio": plain_r / upd_r}
    catalog.dispose()
    return out


def _offsets(n: int, parts: int):  # type: ignore[no-untyped-def]
    off = 0
    for idx in np.array_split(np.arange(n), parts):
        yield off, idx
        off += len(idx)


def bench_commit(rows: pa.Table, source: Path, work: Path, repeats: int) -> dict[str, float | str]:
    """Median catalog transaction time of one segment, by size and backend (PostgreSQL in a schema of its own,
    dropped afterwards)."""
    out: dict[str, float | str] = {}
    with pg_schema("bench_commit") as (_schema, pg_url):
        for backend, url in {"sqlite": None, "postgresql": pg_url}.items():
            root = work / f"commit-{backend}"
            root.mkdir()
            catalog = setup(root, source, [], url)
            for size in (1_000, 1_000_000):
                batch = rows.slice(0, size)
                times = [write_batch(catalog, "lineitem", batch).commit_s for _ in range(repeats)]
                out[f"commit_{backend}_{size}_rows_ms"] = statistics.median(times) * 1000
            catalog.dispose()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (1 = 6M lineitem rows)")
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=9, help="commits per size and backend (median reported)")
    ap.add_argument("--tpch-dir", type=Path, default=Path("data/tpch"))
    args = ap.parse_args()
    source_file = demo_data.generate_tpch("lineitem", args.scale, args.tpch_dir / f"sf{args.scale:g}")
    rows = demo_data.normalized(pq.read_table(source_file))
    with tempfile.TemporaryDirectory(prefix="segrep-bench-") as tmp:
        work = Path(tmp)
        results = {"scale": args.scale} | bench_write_read(rows, source_file.resolve(), args.batches, work)
        results |= bench_commit(rows, source_file.resolve(), work, args.repeats)
    for key, value in results.items():
        print(f"{key:34} {value:,.3f}" if isinstance(value, float) else f"{key:34} {value}")
    print(json.dumps(results), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
