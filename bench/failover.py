"""Benchmark: failover, switchover and failback (issue 14 item 8), each against its target or a baseline
measured in the same run.

Run by hand (`python bench/failover.py --scale 1`, or `make bench-failover`); prints a markdown table with each
target and MET / NOT MET, and with ``--json PATH`` writes the figures there. The catalog is PostgreSQL (a fresh
schema per part, dropped at the end). ``--scale`` scales (b)'s pending bytes and (c)'s TPC-H scale factor.

a. promote (the RTO of the catalog step): a table ``kv`` with ``--promote-partitions`` partitions (10,000), each
   with a placement at ``primary`` (leading), ``dr`` and ``dr2``, and ``--promote-segments`` segment entries
   (200,000, a major every 16, every segment acked both ways, as in bench/rounds.py (e)), built with COPY;
   ``--promote-new`` partitions hold one segment at the leader that no replica holds (the failover's loss).
   Each repeat: ``failover(to=dr, dry_run=True)``, ``failover(to=dr)`` (one catalog transaction per table),
   then ``failover(to=primary)`` to fail back for the next repeat; medians. Target ≤ 2 s. Profiled (cProfile,
   top entries on stderr) when the target is not met, or with ``--profile``.
b. switchover: a table ``kv`` (int64 key, 1 KiB random binary payload, which Parquet cannot compress) with
   ``--switch-partitions`` partitions (1,000) at ``primary``, replicas ``dr`` and ``other``; ``--switch-mb`` x
   scale MB (1 GiB at scale 1) written at the leader in ``--switch-batches`` interleaved batches (each
   partition gets one segment per batch), replicated nowhere. First the baseline: a plain round to ``other``
   (``run_round(target=other)``) copying every pending byte; then ``switchover(to=dr)`` end to end (pause,
   drain rounds, promote, resume), with its drain rounds timed apart (``run_round`` wrapped in the switchover
   module, timing only). Both read the same leader files from a warm page cache (just written), and both
   fsync what they copy; ``cp`` + ``sync`` of the same files (afterwards) is shown for the disk's rate.
   Target (ours): the switchover takes at most the plain round + 2 s, (a)'s target for the catalog step: the
   drain is bound by the copy rate.
c. failback: TPC-H ``lineitem`` scale ``--scale`` written at ``primary`` (4 partitions, ``--batches``
   batches), one round to ``dr``; then ``--diverge`` (1%) of the rows updated at ``primary`` and not
   replicated; ``primary`` down (its site directory moved aside), ``failover(to=dr)`` (policy ``on_return:
   rollback``), the same fraction of rows updated at ``dr``, one round while ``primary`` is down; ``primary``
   back, rounds to it until one copies nothing. Measured: the bytes those rounds copied to ``primary``
   against the table's bytes (the new leader's visible chain; target ≤ 2%), and against a re-bootstrap: a
   round to ``fresh``, a replica site that holds nothing yet, which copies the whole table (100%). The rows
   set aside at ``primary`` (the rollback file, written locally from its own segments) are shown apart.
d. failback under ``on_return: merge`` (DESIGN 11, issue 32): (c)'s scenario with a healthy replica ``edge``
   beside ``dr``; the rounds while ``primary`` is down go to ``primary`` (DOWN: nothing offered, no Spark) and
   to ``edge`` (its safe time's lag is measured after each); ``primary`` back, rounds to ``primary`` then
   ``edge`` until neither copies anything; the first of them pushes ``primary``'s diverged rows to ``dr``,
   which merges them (a Spark application: spark-submit, ``local[*]``). Measured: the bytes copied to
   ``primary`` after its return against the diverged bytes plus the bytes written at ``dr`` meanwhile (target
   ≤ 2x), and to ``edge`` against the merge outputs (target ≤ 1x): no major of the whole table is built.

No part but (d)'s merge may launch a Spark application (the ``submit`` given to every other round refuses).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from benchkit import args_doc, fill_chains, log, make_env, pg_schema, print_table, profile_top, timed, verdict
from sqlalchemy import select

import segrep.failover.switchover as switchover_module
from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog.snapshot import snapshot
from segrep.config.definitions import Definitions
from segrep.core import hlc
from segrep.core.chain import visible_segments
from segrep.data import demo as demo_data
from segrep.data.writer import write_batch
from segrep.failover.promote import failover
from segrep.failover.switchover import switchover
from segrep.replication.orchestrator import run_round
from segrep.replication.rollback import ROLLBACK_DIR
from segrep.spark import launch

KV = "kv"
LINEITEM = "lineitem"
PK = ["l_orderkey", "l_linenumber"]
PAYLOAD = 1024  # bytes of random payload per (b) row
PROMOTE_TARGET_S = 2.0
SWITCH_OVERHEAD_S = 2.0
FAILBACK_TARGET = 0.02
Results = dict[str, Any]


# -- shared helpers -------------------------------------------------------------------------------------------


def no_spark(app: str, args: Sequence[str], *, name: str, master: str | None = None) -> None:
    raise SystemExit(f"a Spark application ({app}, {name}) was launched: nothing here needs one")


def leader_segments(catalog: Catalog, table: str) -> list[m.Segment]:
    """The segments on the leaders' visible chains (what a new replica would copy)."""
    with catalog.read() as s:
        snap = snapshot(s, table, include_stalled=True)
        return [
            part.segment(part.leader.placement_id, ref.segment_id)
            for part in snap.partitions
            for ref in visible_segments(part.chain(part.leader))
        ]


# -- (a) promote ----------------------------------------------------------------------------------------------


def build_promote_catalog(root: Path, url: str, schema: str, args: argparse.Namespace) -> tuple[Definitions, Results]:
    """``kv`` with ``--promote-partitions`` partitions x 3 placements and ``--promote-segments`` entries: every
    chain holds the same history at the three placements (all acked both ways); ``--promote-new`` partitions
    have one more segment at the leader that no replica holds. Built with COPY (benchkit.fill_chains, as
    bench/rounds.py (e))."""
    partitions, total, new = args.promote_partitions, args.promote_segments, args.promote_new
    body = {"columns": {"k": "int64", "v": "binary"}, "primary_key": ["k"], "split_points": []}
    # Each repeat moves leadership straight back, with no round between (the chains have no files): under
    # on_return: rollback, primary still holds what the failover gave up and is refused until a round sets it
    # aside. The promote's catalog work is the same under either policy.
    body["policy"] = {"on_return": "merge"}
    catalog, defs = make_env(root, url, ["primary", "dr", "dr2"], KV, body)
    history = max((total - new) // 3, partitions)  # segments per chain summed over partitions
    facts = fill_chains(catalog, schema, KV, partitions=partitions, history=history, new=new)
    catalog.dispose()
    return defs, facts


def bench_promote(work: Path, args: argparse.Namespace) -> Results:
    out: Results = {"partitions": args.promote_partitions, "sites": 3, "repeats": args.repeats}
    with pg_schema("bench_promote") as (schema, url):
        (defs, facts), build_s = timed(build_promote_catalog, work / "promote", url, schema, args)
        out |= facts | {"build_s": build_s}
        log(f"(a) built {facts} in {build_s:.1f} s")
        catalog = Catalog(url)
        samples: dict[str, list[float]] = {"dry": [], "promote": [], "back": []}
        for rep in range(args.repeats):
            dry, dry_s = timed(failover, catalog, defs, [KV], to="dr", dry_run=True)
            moved, promote_s = timed(failover, catalog, defs, [KV], to="dr")
            back, back_s = timed(failover, catalog, defs, [KV], to="primary")
            for what, report in (("dry run", dry), ("failover", moved)):
                move = report.moves[0]
                if len(move.assessment.moving) != args.promote_partitions:
                    raise SystemExit(f"(a) {what} moves {len(move.assessment.moving)} partitions: {move}")
                if move.assessment.segments_lost != facts["new_segments"]:
                    raise SystemExit(f"(a) {what} loses {move.assessment.segments_lost} segments, not {facts}")
            if moved.moves[0].partitions_moved != args.promote_partitions or moved.moves[0].failover_id is None:
                raise SystemExit(f"(a) the failover did not move every partition: {moved.moves[0].partitions_moved}")
            if back.moves[0].partitions_moved != args.promote_partitions:
                raise SystemExit("(a) the move back did not move every partition")
            samples["dry"].append(dry_s)
            samples["promote"].append(promote_s)
            samples["back"].append(back_s)
            log(f"(a) repeat {rep + 1}: dry run {dry_s:.2f} s, failover to dr {promote_s:.2f} s, back {back_s:.2f} s")
        for key, values in samples.items():
            out[f"{key}_s"] = statistics.median(values)
            out[f"{key}_all_s"] = [round(v, 3) for v in values]
        out["loss_segments"] = facts["new_segments"]
        if out["promote_s"] > PROMOTE_TARGET_S or args.profile:

            def once() -> None:
                failover(catalog, defs, [KV], to="dr")
                failover(catalog, defs, [KV], to="primary")

            top, secs = timed(profile_top, once)
            out["profile"] = {"seconds": secs, "top": top}
            print(f"\n### cProfile of failover to dr and back ({secs:.1f} s under the profiler)\n", file=sys.stderr)
            print("\n".join(top), file=sys.stderr)
        catalog.dispose()
    return out


# -- (b) switchover ---------------------------------------------------------------------------------------------


def kv_batch(keys: np.ndarray, rng: np.random.Generator) -> pa.Table:
    """Rows ``keys`` with a random (incompressible) binary payload of PAYLOAD bytes each."""
    n = len(keys)
    data = pa.py_buffer(rng.bytes(n * PAYLOAD))
    offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * PAYLOAD).tobytes())
    payload = pa.BinaryArray.from_buffers(pa.binary(), n, [None, offsets, data])
    return pa.table({"k": pa.array(keys, pa.int64()), "v": payload})


@contextlib.contextmanager
def timing_drain_rounds() -> Iterator[list[tuple[float, Any]]]:
    """Time the rounds a switchover runs (its module's ``run_round``, wrapped for timing only)."""
    seen: list[tuple[float, Any]] = []
    original = switchover_module.run_round

    def wrapped(*a: Any, **kw: Any) -> Any:
        report, secs = timed(original, *a, **kw)
        seen.append((secs, report))
        return report

    switchover_module.run_round = wrapped
    try:
        yield seen
    finally:
        switchover_module.run_round = original


def bench_switchover(work: Path, args: argparse.Namespace) -> Results:
    parts = args.switch_partitions
    total_bytes = int(args.switch_mb * args.scale * 1024 * 1024)
    rows = max(total_bytes // PAYLOAD, parts * args.switch_batches)
    width = -(-rows // parts)
    splits = [width * i for i in range(1, parts)]
    out: Results = {"partitions": parts, "rows": rows, "batches": args.switch_batches}
    with pg_schema("bench_switch") as (_schema, url):
        body = {
            "columns": {"k": "int64", "v": "binary"},
            "primary_key": ["k"],
            "split_points": splits,
            "policy": {"retry_delay_s": 0},
        }
        (catalog, defs), setup_s = timed(make_env, work / "switch", url, ["primary", "dr", "other"], KV, body)
        log(f"(b) catalog with {parts:,} partitions x 3 sites in {setup_s:.1f} s")
        rng = np.random.default_rng(args.seed)
        start = time.perf_counter()
        for b in range(args.switch_batches):
            write_batch(catalog, KV, kv_batch(np.arange(b, rows, args.switch_batches, dtype=np.int64), rng))
        out["write_s"] = time.perf_counter() - start
        pending = leader_segments(catalog, KV)
        out |= {"segments": len(pending), "bytes": sum(seg.byte_size for seg in pending)}
        log(f"(b) {len(pending):,} segments, {out['bytes'] / 1e6:,.0f} MB pending, written in {out['write_s']:.1f} s")

        os.sync()
        report, round_s = timed(run_round, catalog, defs, KV, target="other", submit=no_spark)
        tr = report.targets["other"]
        if tr.status != "ok" or tr.segments_copied != len(pending) or tr.bytes_copied != out["bytes"]:
            raise SystemExit(f"(b) the plain round did not copy every pending segment: {tr}")
        out |= {"round_s": round_s, "round_copy_step_s": tr.seconds}
        log(f"(b) plain round to other: {round_s:.2f} s (copy step {tr.seconds:.2f} s)")

        os.sync()
        with timing_drain_rounds() as drains:
            (moved, drained), switch_s = timed(
                switchover, catalog, defs, [KV], "dr", timeout_s=args.switch_timeout_s, submit=no_spark
            )
        move = moved.moves[0]
        copied = sum(d.segments_copied for d in drained)
        if move.partitions_moved != parts or move.assessment.loss or copied != len(pending):
            raise SystemExit(f"(b) unexpected switchover: moved {move.partitions_moved}, copied {copied}, {drained}")
        with catalog.read() as s:
            paused = s.scalar(select(m.Partition.partition_id).where(m.Partition.paused_us.is_not(None)).limit(1))
        if paused is not None:
            raise SystemExit("(b) writes are still paused after the switchover")
        drain_s = sum(secs for secs, _ in drains)
        out |= {
            "switch_s": switch_s,
            "drain_s": drain_s,
            "drain_rounds": len(drains),
            "drain_copy_step_s": sum(r.targets["dr"].seconds for _, r in drains if "dr" in r.targets),
            "switch_other_s": switch_s - drain_s,
            "ratio": switch_s / round_s,
            "overhead_s": switch_s - round_s,
        }
        log(f"(b) switchover to dr: {switch_s:.2f} s ({len(drains)} drain round(s) {drain_s:.2f} s)")

        os.sync()  # for reference: the disk's rate for the same files, cp then sync of the copies
        files = [str(Path(defs.data_dir) / "sites" / "primary" / seg.relpath) for seg in pending]
        dest = work / "switch-cp"
        dest.mkdir()
        start = time.perf_counter()
        for off in range(0, len(files), 500):
            subprocess.run(["cp", "--", *files[off : off + 500], str(dest)], check=True)
        subprocess.run(["sync", "--", *map(str, dest.iterdir())], check=True)
        out["cp_sync_s"] = time.perf_counter() - start
        shutil.rmtree(dest)
        log(f"(b) cp + sync of the same files: {out['cp_sync_s']:.2f} s")
        catalog.dispose()
    return out


# -- (c) failback -----------------------------------------------------------------------------------------------


def quartile_splits(rows: pa.Table) -> list[int]:
    keys = rows.column("l_orderkey").to_numpy()
    return [int(np.quantile(keys, q)) for q in (0.25, 0.5, 0.75)]


def diverged(rows: pa.Table, fraction: float, rng: np.random.Generator, comment: str) -> pa.Table:
    """``fraction`` of the rows, drawn at random, with l_comment changed (an update of those rows)."""
    n = max(int(rows.num_rows * fraction), 1)
    picked = rows.take(pa.array(np.sort(rng.choice(rows.num_rows, size=n, replace=False))))
    col = picked.schema.get_field_index("l_comment")
    return picked.set_column(col, "l_comment", pa.array([comment] * n, picked.schema.field(col).type))


def take_down(site_dir: Path) -> Path:
    """The site unreachable: its directory moved aside and a regular file in its place (every access fails)."""
    aside = site_dir.with_name(f"{site_dir.name}.away")
    site_dir.rename(aside)
    site_dir.write_text("down\n")
    return aside


def bring_up(site_dir: Path, aside: Path) -> None:
    site_dir.unlink()
    aside.rename(site_dir)


def _failback_setup(
    source: Path, args: argparse.Namespace, on_return: str
) -> tuple[pa.Table, np.random.Generator, Results, dict[str, Any]]:
    """What both failback parts start from: the rows, the seeded generator, the results and the table's body."""
    rows = demo_data.normalized(pq.read_table(source)).sort_by([(k, "ascending") for k in PK])
    body = {
        "schema_from": str(source),
        "primary_key": PK,
        "partition_key": "l_orderkey",
        "split_points": quartile_splits(rows),
        "policy": {"on_return": on_return, "retry_delay_s": 0},
    }
    out: Results = {"rows": rows.num_rows, "scale": args.scale, "diverge": args.diverge}
    return rows, np.random.default_rng(args.seed), out, body


def bench_failback(work: Path, source: Path, args: argparse.Namespace) -> Results:
    rows, rng, out, body = _failback_setup(source, args, "rollback")
    with pg_schema("bench_failback") as (_schema, url):
        catalog, defs = make_env(work / "failback", url, ["primary", "dr", "fresh"], LINEITEM, body)
        primary_dir = Path(defs.data_dir) / "sites" / "primary"
        start = time.perf_counter()
        for k in range(args.batches):
            write_batch(catalog, LINEITEM, rows.take(pa.array(np.arange(k, rows.num_rows, args.batches))))
        out["write_s"] = time.perf_counter() - start
        first = run_round(catalog, defs, LINEITEM, target="dr", submit=no_spark).targets["dr"]
        out["initial_bytes"] = first.bytes_copied
        log(
            f"(c) {rows.num_rows:,} rows written at primary ({out['write_s']:.0f} s), "
            f"{first.bytes_copied / 1e6:.0f} MB to dr"
        )

        lost = write_batch(catalog, LINEITEM, diverged(rows, args.diverge, rng, "diverged at primary"))
        out |= {"lost_rows": lost.rows_written, "lost_bytes": sum(seg.byte_size for seg in lost.segments)}
        aside = take_down(primary_dir)
        moved = failover(catalog, defs, [LINEITEM], to="dr")
        a = moved.moves[0].assessment
        if a.rows_lost != lost.rows_written:
            raise SystemExit(f"(c) the failover lost {a.rows_lost} rows, not the {lost.rows_written} diverged")
        after = write_batch(catalog, LINEITEM, diverged(rows, args.diverge, rng, "written at dr after the failover"))
        out |= {"dr_rows": after.rows_written, "dr_bytes": sum(seg.byte_size for seg in after.segments)}
        down = run_round(catalog, defs, LINEITEM, target="primary", submit=no_spark)
        out["down_status"] = str(down.targets["primary"].status)
        log(
            f"(c) {lost.rows_written:,} rows diverged at primary; primary down, failover to dr; "
            f"{after.rows_written:,} rows written at dr; round while down: {out['down_status']}"
        )

        bring_up(primary_dir, aside)
        rounds: list[dict[str, Any]] = []
        for _ in range(args.max_rounds):
            report, secs = timed(run_round, catalog, defs, LINEITEM, target="primary", submit=no_spark)
            tr = report.targets["primary"]
            rounds.append(
                {"s": secs, "status": str(tr.status), "segments": tr.segments_copied, "bytes": tr.bytes_copied}
            )
            if tr.status == "ok" and not tr.segments_copied:
                break
        else:
            raise SystemExit(f"(c) primary did not settle in {args.max_rounds} rounds: {rounds}")
        with catalog.read() as s:
            pls = s.execute(
                select(m.Placement.partition_id, m.Site.name, m.Placement.root_segment_id, m.Placement.needs_bootstrap)
                .join(m.Site, m.Site.site_id == m.Placement.site_id)
                .where(m.Site.name.in_(["primary", "dr"]), m.Placement.removed_us.is_(None))
            ).all()
        roots: dict[int, dict[str, str | None]] = {}
        for pid, site, root, stalled in pls:
            if stalled:
                raise SystemExit(f"(c) {site}'s replica of partition {pid} needs a bootstrap")
            roots.setdefault(pid, {})[site] = root
        if any(r["primary"] != r["dr"] for r in roots.values()):
            raise SystemExit(f"(c) primary's chains are not dr's after the failback rounds: {roots}")
        rollback_files = [p for p in (primary_dir / ROLLBACK_DIR).rglob("*.parquet")]
        set_aside = sum(pq.ParquetFile(p).metadata.num_rows for p in rollback_files)
        if set_aside != lost.rows_written:
            raise SystemExit(f"(c) {set_aside} rows set aside at primary, not the {lost.rows_written} it alone held")
        table_segs = leader_segments(catalog, LINEITEM)
        out |= {
            "failback_rounds": rounds,
            "failback_bytes": sum(r["bytes"] for r in rounds),
            "failback_segments": sum(r["segments"] for r in rounds),
            "failback_s": sum(r["s"] for r in rounds),
            "rollback_files": len(rollback_files),
            "rollback_rows": set_aside,
            "rollback_bytes": sum(p.stat().st_size for p in rollback_files),
            "table_bytes": sum(seg.byte_size for seg in table_segs),
            "table_segments": len(table_segs),
        }
        log(f"(c) failback: {rounds}; rollback files {len(rollback_files)} with {set_aside:,} rows")

        os.sync()
        full, full_s = timed(run_round, catalog, defs, LINEITEM, target="fresh", submit=no_spark)
        tr = full.targets["fresh"]
        if tr.status != "ok" or tr.segments_copied != len(table_segs):
            raise SystemExit(f"(c) the copy to fresh did not copy the whole table: {tr}")
        out |= {
            "rebootstrap_bytes": tr.bytes_copied,
            "rebootstrap_segments": tr.segments_copied,
            "rebootstrap_s": full_s,
        }
        out["of_table"] = out["failback_bytes"] / out["table_bytes"]
        out["of_rebootstrap"] = out["failback_bytes"] / tr.bytes_copied
        log(f"(c) whole table to fresh: {tr.bytes_copied / 1e6:.0f} MB in {full_s:.1f} s")
        catalog.dispose()
    return out


def dr_bytes_since(catalog: Catalog, table: str, since_us: int) -> int:
    """Bytes of the segments ``dr`` committed after ``since_us``."""
    with catalog.read() as s:
        sizes = s.scalars(
            select(m.Segment.byte_size)
            .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
            .join(m.Site, m.Site.site_id == m.Placement.site_id)
            .join(m.Partition, m.Partition.partition_id == m.Placement.partition_id)
            .join(m.Table, m.Table.table_id == m.Partition.table_id)
            .where(m.Site.name == "dr", m.Table.name == table, m.Segment.committed_us > since_us)
        ).all()
    return sum(sizes)


def bench_failback_merge(work: Path, source: Path, args: argparse.Namespace) -> Results:
    rows, rng, out, body = _failback_setup(source, args, "merge")
    with pg_schema("bench_failback_merge") as (_schema, url):
        catalog, defs = make_env(work / "failback-merge", url, ["primary", "dr", "edge"], LINEITEM, body)
        primary_dir = Path(defs.data_dir) / "sites" / "primary"
        for k in range(args.batches):
            write_batch(catalog, LINEITEM, rows.take(pa.array(np.arange(k, rows.num_rows, args.batches))))
        first = run_round(catalog, defs, LINEITEM, submit=no_spark)
        out["initial_bytes"] = {site: t.bytes_copied for site, t in first.targets.items()}

        lost = write_batch(catalog, LINEITEM, diverged(rows, args.diverge, rng, "diverged at primary"))
        out |= {"lost_rows": lost.rows_written, "lost_bytes": sum(seg.byte_size for seg in lost.segments)}
        aside = take_down(primary_dir)
        moved = failover(catalog, defs, [LINEITEM], to="dr")
        given_up = moved.moves[0].assessment.rows_lost
        if given_up != lost.rows_written:
            raise SystemExit(f"(d) the failover lost {given_up} rows, not the {lost.rows_written} diverged")
        with catalog.read() as s:
            failed_over_us = max(s.scalars(select(m.Failover.done_us)).all())
        down_rounds: list[dict[str, Any]] = []
        written = 0  # the bytes of the segments written at dr meanwhile
        for n in range(args.down_rounds):
            after = write_batch(catalog, LINEITEM, diverged(rows, args.diverge / args.down_rounds, rng, f"dr {n}"))
            written += sum(seg.byte_size for seg in after.segments)
            report = run_round(catalog, defs, LINEITEM, submit=no_spark)  # primary and edge: no Spark for either
            committed = report.safe_time_us.get("edge")
            down_rounds.append(
                {
                    "rows": after.rows_written,
                    "primary": str(report.targets["primary"].status),
                    "edge": str(report.targets["edge"].status),
                    "edge_bytes": report.targets["edge"].bytes_copied,
                    "edge_lag_s": None if committed is None else (hlc.now_us() - committed) / 1e6,
                    "majors": len(report.plan.majors) if report.plan else 0,
                }
            )
        out["down_rounds"] = down_rounds
        out["dr_rows"] = sum(r["rows"] for r in down_rounds)
        out["dr_bytes"] = written
        out["edge_down_bytes"] = sum(r["edge_bytes"] for r in down_rounds)  # = written: no major built meanwhile
        out["dr_since_failover_bytes"] = dr_bytes_since(catalog, LINEITEM, failed_over_us)
        log(f"(d) primary down under on_return merge, rounds: {down_rounds}")

        bring_up(primary_dir, aside)
        returned_us = hlc.now_us()
        rounds: list[dict[str, Any]] = []
        for _ in range(args.max_rounds):
            report, secs = timed(run_round, catalog, defs, LINEITEM, submit=launch.submit)
            t = report.targets
            rounds.append(
                {
                    "s": secs,
                    "status": {site: str(r.status) for site, r in t.items()},
                    "primary_bytes": t["primary"].bytes_copied,
                    "edge_bytes": t["edge"].bytes_copied,
                    "merges": report.merges.items,
                    "majors": len(report.plan.majors) if report.plan else 0,
                }
            )
            if all(r.status == "ok" and not r.segments_copied for r in t.values()) and not report.merges.items:
                break
        else:
            raise SystemExit(f"(d) primary and edge did not settle in {args.max_rounds} rounds: {rounds}")
        merge_output = dr_bytes_since(catalog, LINEITEM, returned_us)
        table_segs = leader_segments(catalog, LINEITEM)
        out |= {
            "failback_rounds": rounds,
            "primary_bytes": sum(r["primary_bytes"] for r in rounds),
            "edge_bytes": sum(r["edge_bytes"] for r in rounds),
            "majors": sum(r["majors"] for r in rounds) + sum(r["majors"] for r in down_rounds),
            "merge_output_bytes": merge_output,
            "failback_s": sum(r["s"] for r in rounds),
            "table_bytes": sum(seg.byte_size for seg in table_segs),
        }
        out["primary_goal_bytes"] = 2 * (out["lost_bytes"] + out["dr_bytes"])
        out["primary_ok"] = out["primary_bytes"] <= out["primary_goal_bytes"]
        out["edge_ok"] = out["edge_bytes"] <= merge_output
        log(f"(d) failback rounds: {rounds}")
        catalog.dispose()
    return out


# -- report ----------------------------------------------------------------------------------------------------


def table_rows(r: Results) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    a, b, c = r.get("a"), r.get("b"), r.get("c")
    if a:
        shape = (
            f"{a['partitions']:,} partitions x 3 sites, {a['segments']:,} segments, {a['loss_segments']} lost; "
            f"median of {a['repeats']}"
        )
        rows.append(
            (
                f"(a) promote: `failover(to=dr)`, the catalog transaction ({shape}), s",
                f"{a['promote_s']:.2f} (all {', '.join(f'{x:.2f}' for x in a['promote_all_s'])})",
                f"dry run {a['dry_s']:.2f}; move back {a['back_s']:.2f}",
                "-",
                f"≤ {PROMOTE_TARGET_S:g} s",
                verdict(a["promote_s"] <= PROMOTE_TARGET_S),
            )
        )
    if b:
        mb = b["bytes"] / 1e6
        rows.append(
            (
                f"(b) switchover to dr end to end ({b['partitions']:,} partitions, {b['segments']:,} segments, "
                f"{mb:,.0f} MB pending), s",
                f"{b['switch_s']:.2f} ({b['switch_s'] and mb / b['switch_s']:,.0f} MB/s; drain "
                f"{b['drain_rounds']} round(s) {b['drain_s']:.2f}, the rest {b['switch_other_s']:.2f})",
                f"plain round copying the same bytes: {b['round_s']:.2f} ({mb / b['round_s']:,.0f} MB/s; "
                f"`cp` + `sync` of the files {b['cp_sync_s']:.2f}, {mb / b['cp_sync_s']:,.0f} MB/s)",
                f"{b['ratio']:.2f}",
                f"≤ plain round + {SWITCH_OVERHEAD_S:g} s",
                verdict(b["overhead_s"] <= SWITCH_OVERHEAD_S),
            )
        )
    if c:
        rows.append(
            (
                f"(c) failback: bytes copied to primary by {len(c['failback_rounds'])} round(s) after its return "
                f"(lineitem sf{c['scale']:g}, {c['lost_rows']:,} rows diverged at primary, {c['dr_rows']:,} written "
                f"at dr), % of the table",
                f"{c['failback_bytes'] / 1e6:,.1f} MB = {100 * c['of_table']:.2f}% of {c['table_bytes'] / 1e6:,.0f} MB "
                f"({c['failback_segments']} segments, {c['failback_s']:.1f} s; {c['rollback_rows']:,} rows set aside "
                f"locally in {c['rollback_files']} rollback file(s), {c['rollback_bytes'] / 1e6:,.1f} MB)",
                f"re-bootstrap (whole table to a new site): {c['rebootstrap_bytes'] / 1e6:,.0f} MB, "
                f"{c['rebootstrap_s']:.1f} s",
                f"{100 * c['of_rebootstrap']:.2f}%",
                f"≤ {100 * FAILBACK_TARGET:g}% of the table",
                verdict(c["of_table"] <= FAILBACK_TARGET),
            )
        )
    d = r.get("d")
    if d:
        lags = [x["edge_lag_s"] for x in d["down_rounds"] if x["edge_lag_s"] is not None]
        shape = (
            f"lineitem sf{d['scale']:g}, {d['lost_rows']:,} rows diverged at primary "
            f"({d['lost_bytes'] / 1e6:,.2f} MB), "
            f"{d['dr_rows']:,} written at dr meanwhile ({d['dr_bytes'] / 1e6:,.2f} MB)"
        )
        down = (
            f"while primary was down: {', '.join(x['primary'] for x in d['down_rounds'])}; edge copied "
            f"{d['edge_down_bytes'] / 1e6:,.2f} MB, its lag after each round {', '.join(f'{x:.1f}' for x in lags)} "
            f"s; majors built {d['majors']}"
        )
        rows.append(
            (
                f"(d) failback under `on_return: merge`: bytes copied to primary after its return ({shape})",
                f"{d['primary_bytes'] / 1e6:,.2f} MB in {len(d['failback_rounds'])} round(s), "
                f"{d['failback_s']:.1f} s ({down})",
                f"diverged + written meanwhile: {(d['lost_bytes'] + d['dr_bytes']) / 1e6:,.2f} MB; "
                f"table {d['table_bytes'] / 1e6:,.1f} MB",
                f"{d['primary_bytes'] / max(d['lost_bytes'] + d['dr_bytes'], 1):.2f}",
                "≤ 2x (diverged + written meanwhile)",
                verdict(d["primary_ok"]),
            )
        )
        rows.append(
            (
                "(d) failback under `on_return: merge`: bytes copied to the healthy replica edge after the return",
                f"{d['edge_bytes'] / 1e6:,.2f} MB",
                f"the merge outputs: {d['merge_output_bytes'] / 1e6:,.2f} MB",
                f"{d['edge_bytes'] / max(d['merge_output_bytes'], 1):.2f}",
                "≤ the merge outputs",
                verdict(d["edge_ok"]),
            )
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="(b) pending GiB and (c) TPC-H scale factor")
    ap.add_argument("--repeats", type=int, default=3, help="(a) failovers to dr, each moved back (medians)")
    ap.add_argument("--promote-partitions", type=int, default=10_000)
    ap.add_argument("--promote-segments", type=int, default=200_000, help="(a) segment entries in the catalog")
    ap.add_argument("--promote-new", type=int, default=100, help="(a) segments only the leader holds (the loss)")
    ap.add_argument("--profile", action="store_true", help="(a) always profile one failover and its move back")
    ap.add_argument("--switch-partitions", type=int, default=1_000)
    ap.add_argument("--switch-mb", type=float, default=1024.0, help="(b) MiB pending at scale 1")
    ap.add_argument("--switch-batches", type=int, default=2, help="(b) write batches (= segments per partition)")
    ap.add_argument("--switch-timeout-s", type=float, default=600.0)
    ap.add_argument("--batches", type=int, default=10, help="(c) write batches of lineitem (4 partitions)")
    ap.add_argument("--diverge", type=float, default=0.01, help="(c) fraction of rows updated at each side")
    ap.add_argument("--max-rounds", type=int, default=4, help="(c) rounds after the return, at most")
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--skip-promote", action="store_true")
    ap.add_argument("--skip-switchover", action="store_true")
    ap.add_argument("--skip-failback", action="store_true")
    ap.add_argument("--skip-failback-merge", action="store_true", help="(d), the one part that runs Spark")
    ap.add_argument("--down-rounds", type=int, default=3, help="(d) writes at dr and rounds while primary is down")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    ap.add_argument("--tpch-dir", type=Path, default=Path("data/tpch"))
    ap.add_argument("--work-dir", type=Path, default=None, help="parent of the scratch directory (default: /tmp)")
    args = ap.parse_args()

    results: Results = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "args": args_doc(args),
    }
    seconds: dict[str, float] = {}
    load_start = os.getloadavg()
    started = time.perf_counter()
    source = None
    if not (args.skip_failback and args.skip_failback_merge):
        source = demo_data.generate_tpch("lineitem", args.scale, args.tpch_dir / f"sf{args.scale:g}").resolve()
    with tempfile.TemporaryDirectory(prefix="segrep-bench-failover-", dir=args.work_dir) as tmp:
        work = Path(tmp)
        if not args.skip_promote:
            results["a"], seconds["a"] = timed(bench_promote, work, args)
        if not args.skip_switchover:
            results["b"], seconds["b"] = timed(bench_switchover, work, args)
        if source is not None and not args.skip_failback:
            results["c"], seconds["c"] = timed(bench_failback, work, source, args)
        if source is not None and not args.skip_failback_merge:
            results["d"], seconds["d"] = timed(bench_failback_merge, work, source, args)
    total_s = time.perf_counter() - started
    load_end = os.getloadavg()
    results |= {"loadavg": [load_start, load_end], "part_seconds": seconds, "seconds": total_s}

    print()
    print_table(table_rows(results))
    print(
        f"\nran in {total_s:.0f} s ({', '.join(f'{k} {v:.0f} s' for k, v in seconds.items())}); "
        f"load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1, default=str) + "\n")
        log(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
