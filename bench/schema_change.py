"""bench/rounds.py part (f): what a schema change costs a round (issue 35 item 6).

TPC-H orders (4 partitions) at `primary`, replicated to `dr`. Half the rows are written and replicated; then
three equal writes (the same rows-per-batch and batches) each followed by one timed round:

1. baseline before: an equal write at version 1, no schema change;
2. `segrep apply` of one change that adds a column with a default (o_channel 'web'), widens o_shippriority
   int32 -> int64 and renames o_comment -> o_note; a round with nothing written (must move 0 bytes); then the
   write, at version 2, and the measured round;
3. baseline after: an equal write at version 2, no schema change.

Target: the measured round moves exactly the new write's segments (bytes in the round's report = their sizes,
as many segments), and no file `dr` held is written again (size, mtime and inode unchanged). Its bytes and
time are shown against the baselines' (median of the two).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from benchkit import ORDERS_COLUMNS, log, make_env, quantile_splits, timed, verdict, write_interleaved

from segrep.catalog import Catalog
from segrep.catalog.apply import apply_definitions
from segrep.config.definitions import Definitions, load_definitions
from segrep.data import demo as demo_data
from segrep.data.writer import WriteResult
from segrep.replication.orchestrator import run_round

TABLE = "orders"
KEY = "o_orderkey"
CHANGED_COLUMNS: dict[str, Any] = {
    **{k: v for k, v in ORDERS_COLUMNS.items() if k != "o_comment"},
    "o_shippriority": "int64",
    "o_note": {"type": "string", "renamed_from": "o_comment"},
    "o_channel": {"type": "string", "default": "web"},
}
CHANGE = "add o_channel (default 'web'), widen o_shippriority int32 -> int64, rename o_comment -> o_note"
Results = dict[str, Any]
Submit = Callable[..., None]


@dataclass(frozen=True)
class MeasuredRound:
    """One write and the round after it, at `dr`."""

    rows: int
    segments: int  # the write's segments
    segment_bytes: int  # their sizes summed
    copied: int  # segments the round copied to dr
    bytes: int  # bytes the round copied to dr
    seconds: float  # the round, plan to commit
    rewritten: int  # files dr held before the round that changed (size, mtime or inode) or vanished
    new_files: int  # files at dr after the round that were not there before
    stored_versions: list[int]  # the schema versions the write's rows were stored at

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def files_at(root: Path) -> dict[str, tuple[int, int, int]]:
    """relpath -> (size, mtime ns, inode) of every file under a local site's root."""
    return {
        str(p.relative_to(root)): (st.st_size, st.st_mtime_ns, st.st_ino)
        for p in root.rglob("*")
        if p.is_file() and (st := p.stat())
    }


def v2_rows(rows: pa.Table) -> pa.Table:
    """TPC-H orders as a writer at the changed schema sends them: o_note, o_shippriority int64, a channel."""
    rows = rows.rename_columns(["o_note" if c == "o_comment" else c for c in rows.column_names])
    rows = rows.set_column(
        rows.schema.get_field_index("o_shippriority"), "o_shippriority", rows["o_shippriority"].cast(pa.int64())
    )
    channels = pa.array(["app", "phone", "web"] * (rows.num_rows // 3 + 1))[: rows.num_rows]
    return rows.append_column("o_channel", channels)


def write_then_round(
    catalog: Catalog, defs: Definitions, dr_root: Path, rows: pa.Table, batches: int, submit: Submit
) -> MeasuredRound:
    written: list[WriteResult] = write_interleaved(catalog, TABLE, rows, batches)
    segs = [seg for r in written for seg in r.segments]
    before = files_at(dr_root)
    report, seconds = timed(run_round, catalog, defs, TABLE, submit=submit)
    if report.status != "ok":
        raise SystemExit(f"(f) the round failed: {report}")
    after = files_at(dr_root)
    dr = report.targets["dr"]
    return MeasuredRound(
        rows=rows.num_rows,
        segments=len(segs),
        segment_bytes=sum(seg.byte_size for seg in segs),
        copied=dr.segments_copied,
        bytes=dr.bytes_copied,
        seconds=seconds,
        rewritten=sum(1 for k, v in before.items() if after.get(k) != v),
        new_files=len(after.keys() - before.keys()),
        stored_versions=sorted({r.stored_version for r in written if r.stored_version is not None}),
    )


def change_schema(config: Path, catalog: Catalog) -> tuple[Definitions, float]:
    """The definitions file with CHANGED_COLUMNS, applied; the new definitions and apply's seconds."""
    doc = yaml.safe_load(config.read_text())
    doc["tables"][TABLE]["columns"] = CHANGED_COLUMNS
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    defs = load_definitions(config)
    changes, seconds = timed(apply_definitions, catalog, defs)
    if not any(TABLE in c.what for c in changes):
        raise SystemExit(f"(f) apply changed nothing of {TABLE}: {changes}")
    return defs, seconds


def bench_schema_change(url: str, work: Path, scale: float, tpch_dir: Path, batches: int, submit: Submit) -> Results:
    source = demo_data.generate_tpch("orders", scale, tpch_dir / f"sf{scale:g}")
    rows = demo_data.normalized(pq.read_table(source)).sort_by(KEY)
    # every other row first, then three equal writes of every sixth row: each spans every partition
    base = rows.take(pa.array(np.arange(0, rows.num_rows, 2)))
    parts = [rows.take(pa.array(np.arange(2 * i + 1, rows.num_rows, 6))) for i in range(3)]
    root = work / "schema"
    body = {"columns": ORDERS_COLUMNS, "primary_key": [KEY], "split_points": quantile_splits(rows, KEY)}
    catalog, defs = make_env(root, url, ["primary", "dr"], TABLE, body)
    dr_root = defs.data_dir / "sites" / "dr"
    out: Results = {"rows": rows.num_rows, "batches": batches, "change": CHANGE}
    try:
        first = write_then_round(catalog, defs, dr_root, base, batches, submit)
        log(f"(f) {base.num_rows:,} rows written and replicated ({first.bytes / 1e6:.1f} MB)")
        before = write_then_round(catalog, defs, dr_root, parts[0], batches, submit)
        defs, out["apply_s"] = change_schema(root / "segrep.yaml", catalog)
        idle_before = files_at(dr_root)
        idle, out["idle_round_s"] = timed(run_round, catalog, defs, TABLE, submit=submit)
        out["idle_round_bytes"] = idle.targets["dr"].bytes_copied
        out["idle_round_rewritten"] = sum(1 for k, v in idle_before.items() if files_at(dr_root).get(k) != v)
        changed = write_then_round(catalog, defs, dr_root, v2_rows(parts[1]), batches, submit)
        after = write_then_round(catalog, defs, dr_root, v2_rows(parts[2]), batches, submit)
    finally:
        catalog.dispose()
    stored = (before.stored_versions, changed.stored_versions, after.stored_versions)
    if stored != ([1], [2], [2]):
        raise SystemExit(f"(f) the writes were stored at schema versions {stored}, not ([1], [2], [2])")
    out |= {"baseline_before": before.as_dict(), "changed": changed.as_dict(), "baseline_after": after.as_dict()}
    out["baseline_bytes"] = statistics.median([before.bytes, after.bytes])
    out["baseline_s"] = statistics.median([before.seconds, after.seconds])
    log(
        f"(f) apply {out['apply_s']:.2f} s; round after it alone {out['idle_round_bytes']} B; after the change and "
        f"a write {changed.bytes:,} B in {changed.seconds:.2f} s (new segments {changed.segment_bytes:,} B); "
        f"baselines {before.bytes:,} B {before.seconds:.2f} s, {after.bytes:,} B {after.seconds:.2f} s"
    )
    return out


def table_rows(f: Results) -> list[tuple[str, str, str, str, str, str]]:
    c = f["changed"]
    exact = c["bytes"] == c["segment_bytes"] and c["copied"] == c["segments"] == c["new_files"]
    idle_ok = f["idle_round_bytes"] == 0 and f["idle_round_rewritten"] == 0
    return [
        (
            f"(f) round right after one `apply` ({f['change']}; apply {f['apply_s']:.2f} s), nothing written: "
            "bytes moved, files at dr rewritten",
            f"{f['idle_round_bytes']:,} B, {f['idle_round_rewritten']} rewritten ({f['idle_round_s']:.2f} s)",
            "-",
            "-",
            "0 B, 0",
            verdict(idle_ok),
        ),
        (
            f"(f) round after the change and a write of {c['rows']:,} orders ({c['segments']} segments): bytes "
            "moved vs the new write's segments, files at dr rewritten",
            f"{c['bytes']:,} B = {c['copied']} segments (new write: {c['segment_bytes']:,} B, {c['segments']} "
            f"segments); {c['rewritten']} rewritten",
            f"{f['baseline_bytes']:,.0f} B after an equal write without a change (median of 2)",
            f"{c['bytes'] / f['baseline_bytes']:.3f}",
            "= the new write's segments only, 0 rewritten",
            verdict(exact and c["rewritten"] == 0),
        ),
        (
            "(f) that round's time, plan to commit, s",
            f"{c['seconds']:.3f}",
            f"{f['baseline_s']:.3f} (median of 2: {f['baseline_before']['seconds']:.3f}, "
            f"{f['baseline_after']['seconds']:.3f})",
            f"{c['seconds'] / f['baseline_s']:.2f}",
            "-",
            "-",
        ),
    ]
