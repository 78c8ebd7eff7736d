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
   last-writer-wins resolve path). Each segrep read is also timed against the same read without the content
   checksum of every file's bytes (``read_without_content_check``: the reader as it was before that check),
   alternately, ``--read-repeats`` times each, medians: ``read_content_check_ratio`` (goal >= 0.9); and each
   checksum's speed over the same files in memory (``checksum_*_gb_s``);
3. commit: the catalog transaction of one segment (conditional root move + insert, no row read), median of
   repeated writes, for a 1,000-row and a 1,000,000-row segment, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import argparse
import hashlib
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
from segrep.data.reader import expected_segment, placement_files, read_table, resolve
from segrep.data.writer import write_batch
from segrep.storage.crc64nvme import Crc64Nvme
from segrep.storage.segment_meta import rows_differences


def setup(root: Path, source: Path, splits: list[int], url: str | None = None) -> Catalog:
    root.mkdir(parents=True, exist_ok=True)
    config = root / "segrep.yaml"
    config.write_text(demo_data.lineitem_yaml(source, splits, ["dr"]))
    catalog = Catalog(url or f"sqlite:///{root}/catalog.db")
    upgrade(catalog)
    apply_definitions(catalog, load_definitions(config))
    return catalog


def bench_write_read(rows: pa.Table, source: Path, batches: int, work: Path, read_repeats: int = 3) -> dict[str, float]:
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
    unchecked_r, seg_r = _read_pair(catalog, rows.num_rows, read_repeats)
    out |= {
        "read_plain_rows_s": rows.num_rows / plain_r,
        "read_segrep_rows_s": rows.num_rows / seg_r,
        "read_ratio": plain_r / seg_r,
        "read_without_content_check_rows_s": rows.num_rows / unchecked_r,
        "read_content_check_ratio": unchecked_r / seg_r,
    }
    del plain_t

    out |= checksum_speeds(catalog)

    rng = np.random.default_rng(1)
    upd_idx = np.sort(rng.choice(rows.num_rows, size=rows.num_rows // 20, replace=False))
    updates = rows.take(pa.array(upd_idx))
    write_batch(catalog, "lineitem", updates)
    upd_unchecked_r, upd_r = _read_pair(catalog, rows.num_rows, read_repeats)
    out |= {
        "read_after_5pct_updates_rows_s": rows.num_rows / upd_r,
        "read_after_updates_ratio": plain_r / upd_r,
        "read_after_updates_without_content_check_rows_s": rows.num_rows / upd_unchecked_r,
        "read_after_updates_content_check_ratio": upd_unchecked_r / upd_r,
    }
    catalog.dispose()
    return out


def _read_pair(catalog: Catalog, n: int, repeats: int) -> tuple[float, float]:
    """Median seconds of the read without the content check and of segrep's read, timed alternately (so that
    load from other processes falls on both alike); both must return the table's ``n`` rows."""
    unchecked, checked = [], []
    for _ in range(repeats):
        got, took = timed(read_without_content_check, catalog, "lineitem")
        assert got.num_rows == n, (got.num_rows, n)
        unchecked.append(took)
        del got
        got, took = timed(read_table, catalog, "lineitem")
        assert got.num_rows == n, (got.num_rows, n)
        checked.append(took)
        del got
    return statistics.median(unchecked), statistics.median(checked)


def checksum_speeds(catalog: Catalog) -> dict[str, float]:
    """GB/s of the two content checksums a read may use, over the table's segment files already in memory
    (one core: what the check costs per byte; reads take CRC-64/NVME wherever the catalog recorded it)."""
    _, placements = placement_files(catalog, "lineitem")
    data = [Path(pf.site.path(seg.relpath)).read_bytes() for pf in placements for seg in pf.segments]
    total = sum(len(d) for d in data)
    out = {}
    for name, new in (("crc64nvme", Crc64Nvme), ("sha256", hashlib.sha256)):
        _, took = timed(lambda new=new: [new(d).hexdigest() for d in data])
        out[f"checksum_{name}_gb_s"] = total / took / 1e9
    return out


def read_without_content_check(catalog: Catalog, table: str) -> pa.Table:
    """The baseline of the content check (issue 32): segrep's reader as it was before every read checked
    each file's content checksum, built from the same pieces. Every footer is checked against the catalog
    (``Site.check_footer``: size, footer entry, row count, columns); then placements whose files cannot share
    a key are read as one multi-file, multi-threaded pyarrow read of the table's columns, the others file by
    file and resolved (last writer wins), page checksums verified; each file's rows are checked for count and
    key range (``rows_differences``). The files are opened by pyarrow, which reads only the column chunks it
    decodes: no byte is hashed."""
    info, placements = placement_files(catalog, table)
    columns = list(info.schema.names)
    simple, parts = [], []
    for pf in placements:
        expected = [(seg.relpath, expected_segment(info, seg)) for seg in pf.segments]
        counts = [pf.site.check_footer(rel, exp).num_rows for rel, exp in expected]
        if pf.disjoint and pf.key_begin is None and pf.key_end is None:
            simple += [(pf.site, rel, exp, count) for (rel, exp), count in zip(expected, counts, strict=True)]
            continue
        tables = []
        for rel, exp in expected:
            got = pq.read_table(pf.site.path(rel), filesystem=pf.site.fs, page_checksum_verification=True)
            assert not rows_differences(exp, got, info.primary_key), rel
            tables.append(got)
        assert pf.key_begin is None and pf.key_end is None, "the bench's table is not split"
        parts.append(resolve(pa.concat_tables(tables), info.primary_key))
    if simple:
        rows = pq.read_table(
            [site.path(rel) for site, rel, _, _ in simple],
            columns=columns,
            filesystem=simple[0][0].fs,
            page_checksum_verification=True,
        )
        offset = 0
        for _, rel, exp, count in simple:
            assert not rows_differences(exp, rows.slice(offset, count), info.primary_key), rel
            offset += count
        parts.append(rows.cast(info.schema))
    return pa.concat_tables(parts)


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
    ap.add_argument("--read-repeats", type=int, default=3, help="reads of each kind, alternated (median reported)")
    ap.add_argument("--tpch-dir", type=Path, default=Path("data/tpch"))
    args = ap.parse_args()
    source_file = demo_data.generate_tpch("lineitem", args.scale, args.tpch_dir / f"sf{args.scale:g}")
    rows = demo_data.normalized(pq.read_table(source_file))
    with tempfile.TemporaryDirectory(prefix="segrep-bench-") as tmp:
        work = Path(tmp)
        results = {"scale": args.scale} | bench_write_read(
            rows, source_file.resolve(), args.batches, work, args.read_repeats
        )
        results |= bench_commit(rows, source_file.resolve(), work, args.repeats)
    for key, value in results.items():
        print(f"{key:48} {value:,.3f}" if isinstance(value, float) else f"{key:48} {value}")
    print(json.dumps(results), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
