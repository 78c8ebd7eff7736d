"""Benchmark: replication rounds (fast-forward, no-op round, Spark merge, planning at scale, the round after a
schema change), each against a baseline measured in the same run.

Run by hand (`python bench/rounds.py --scale 1`); prints a markdown table with each target and MET / NOT MET,
and writes a small JSON to bench/results/rounds-<date>[-load<N>].json. The catalog is PostgreSQL (a fresh
schema per part, dropped at the end; `--catalog sqlite` for parts a-c and f) and TPC-H lineitem (orders for f)
comes from tpchgen-cli (cached in data/tpch/sf<scale>).

a. fast-forward: lineitem written through ``write_batch`` (4 partitions, ``--batches`` batches, so several
   segments per partition), then one round to one fresh target (``run_round(target=...)``) vs ``cp`` of the
   same segment files to a fresh directory. Page cache cold-ish (source pages evicted with
   posix_fadvise(DONTNEED) before each copy) and warm (source read just before); cp and segrep alternate
   which goes first; medians. ``cp`` does not fsync; ``cp + sync`` (the copies fsynced) is shown beside it.
   Spark applications are counted through the ``submit`` function (must be 0).
b. a round with nothing to do after (a): plan_round + fast_forward_target (every target) + commit_round.
c. Spark merge: lineitem written while the replica site led, leadership switched back in the catalog; the next
   round pushes every row and merges it with one spark-submit (wall time, start-up included; the merge engine is
   pinned to Spark, ``SEGREP_MERGE_ENGINE``: bench/merge_crossover.py compares it with the in-process one) vs row-based
   upserts into PostgreSQL through SQLAlchemy: batched executemany (INSERT ... ON CONFLICT DO UPDATE,
   ``--batch-rows`` per transaction) and one statement per row committed every 100 rows, on samples.
d. fast-forward rows/s (a, cold-ish median) vs the batched row-based rate of (c).
e. plan_round on a catalog built with COPY: ``--plan-partitions`` partitions, 2 targets, ``--plan-segments``
   segments (chains mostly acked, a major every 16 segments, ~100 new unacked segments), then ten times the
   history with the same new segments. Profiled (cProfile, top entries) when a target is not met.
f. schema change (bench/schema_change.py): TPC-H orders at ``--scale``; the round after one `apply` that adds a
   column with a default, widens one and renames one, followed by a write, moves exactly that write's segments
   and rewrites nothing at the target; baseline: the rounds after equal writes without a change.

``--background-load N`` runs N CPU-bound processes for the whole run (figures under load).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from benchkit import (
    args_doc,
    background_load,
    evict,
    fill_chains,
    log,
    make_env,
    pg_schema,
    print_table,
    profile_top,
    quantile_splits,
    timed,
    verdict,
    warm,
    write_interleaved,
)
from schema_change import bench_schema_change
from schema_change import table_rows as schema_rows
from sqlalchemy import select

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.config.definitions import load_definitions
from segrep.core.errors import SegrepError
from segrep.data import demo as demo_data
from segrep.replication.commit import commit_round
from segrep.replication.fast_forward import fast_forward_target
from segrep.replication.orchestrator import run_round
from segrep.replication.plan import plan_round
from segrep.replication.run import spark_copier
from segrep.spark import launch
from segrep.spark.merge_runner import ENGINE_ENV

TABLE = "lineitem"
PK = ["l_orderkey", "l_linenumber"]
Results = dict[str, Any]


# -- shared helpers -------------------------------------------------------------------------------------------


@dataclass
class CountingSubmit:
    """A ``submit`` for run_round that counts and times Spark applications (and runs them if ``run``)."""

    run: bool = True
    calls: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, app: str, args: Sequence[str], *, name: str, master: str | None = None) -> None:
        start = time.perf_counter()
        try:
            if self.run:
                launch.submit(app, args, name=name, master=master)
        finally:
            self.calls.append({"app": app, "name": name, "seconds": time.perf_counter() - start})


@contextlib.contextmanager
def catalog_url(kind: str, root: Path, prefix: str) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{root}/catalog.db"
    else:
        with pg_schema(prefix) as (_schema, url):
            yield url


def lineitem_env(root: Path, url: str, sites: list[str], source: Path, splits: list[int]) -> tuple[Catalog, Any]:
    """lineitem (the schema of ``source``, split at ``splits``) at ``sites``, the first leading, in a fresh catalog."""
    body = {"schema_from": str(source), "primary_key": PK, "partition_key": "l_orderkey", "split_points": splits}
    return make_env(root, url, sites, TABLE, body)


def quartile_splits(rows: pa.Table) -> list[int]:
    return quantile_splits(rows, "l_orderkey")


def write_in_batches(catalog: Catalog, rows: pa.Table, batches: int) -> float:
    """``write_interleaved`` of lineitem; the seconds taken (the take of each batch included)."""
    return timed(write_interleaved, catalog, TABLE, rows, batches)[1]


def set_leader(catalog: Catalog, site_id: int) -> None:
    """Move every partition's leadership to the placement at ``site_id`` (a new epoch), as an operator would."""
    with catalog.write() as s:
        for part in s.scalars(select(m.Partition)):
            pl = s.scalars(
                select(m.Placement).where(m.Placement.partition_id == part.partition_id, m.Placement.site_id == site_id)
            ).one()
            part.leader_placement_id = pl.placement_id
            part.epoch += 1


# -- (a) fast-forward and (b) the round with nothing to do -----------------------------------------------------


def bench_fast_forward(rows: pa.Table, source: Path, work: Path, args: argparse.Namespace) -> Results:
    runs = args.repeats * 2  # each repeat: one cold-ish and one warm copy, every copy to a fresh target site
    targets = [f"r{i + 1}" for i in range(runs)]
    out: Results = {"catalog": args.catalog, "rows": rows.num_rows, "batches": args.batches, "targets": runs}
    with catalog_url(args.catalog, work, "bench_ff") as url:
        catalog, defs = lineitem_env(work / "ff", url, ["primary", *targets], source, quartile_splits(rows))
        out["write_s"] = write_in_batches(catalog, rows, args.batches)
        with catalog.read() as s:
            leader_ids = select(m.Partition.leader_placement_id)
            segs = list(s.scalars(select(m.Segment).where(m.Segment.placement_id.in_(leader_ids))))
        site_root = defs.data_dir / "sites" / "primary"
        files = [site_root / seg.relpath for seg in segs]
        total_bytes = sum(seg.byte_size for seg in segs)
        out |= {"segments": len(segs), "partitions": len({seg.partition_id for seg in segs}), "bytes": total_bytes}
        log(f"(a) {len(segs)} segments, {total_bytes / 1e6:.0f} MB written in {out['write_s']:.1f} s")

        submit = CountingSubmit()
        samples: dict[str, list[float]] = {
            k: []
            for k in (
                "cp_cold",
                "cp_warm",
                "cpsync_cold",
                "cpsync_warm",
                "seg_cold",
                "seg_warm",
                "segff_cold",
                "segff_warm",
            )
        }
        n = 0
        for rep in range(args.repeats):
            for cache in ("cold", "warm"):
                site = targets[n]
                order = ("cp", "segrep") if (rep + (cache == "warm")) % 2 == 0 else ("segrep", "cp")
                for who in order:
                    os.sync()
                    (evict if cache == "cold" else warm)(files)
                    if who == "cp":
                        dest = work / f"cp-{n}"
                        dest.mkdir()
                        _, cp_s = timed(subprocess.run, ["cp", "--", *map(str, files), str(dest)], check=True)
                        _, sync_s = timed(subprocess.run, ["sync", "--", *map(str, dest.iterdir())], check=True)
                        samples[f"cp_{cache}"].append(cp_s)
                        samples[f"cpsync_{cache}"].append(cp_s + sync_s)
                    else:
                        report, seg_s = timed(run_round, catalog, defs, TABLE, target=site, submit=submit)
                        tr = report.targets[site]
                        if tr.status != "ok" or tr.segments_copied != len(segs):
                            raise SystemExit(f"(a) round to {site} did not copy everything: {tr}")
                        samples[f"seg_{cache}"].append(seg_s)
                        samples[f"segff_{cache}"].append(tr.seconds)
                log(
                    f"(a) repeat {rep + 1} {cache}: "
                    + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in samples.items() if k.endswith(cache))
                )
                n += 1
        out["spark_apps_ff"] = len(submit.calls)
        for key, values in samples.items():
            med = statistics.median(values)
            out[f"{key}_s"] = med
            out[f"{key}_all_s"] = [round(v, 3) for v in values]
            out[f"{key}_MBps"] = total_bytes / med / 1e6
            out[f"{key}_rows_s"] = rows.num_rows / med
        for cache in ("cold", "warm"):
            out[f"ratio_{cache}"] = out[f"cp_{cache}_s"] / out[f"seg_{cache}_s"]

        if not args.skip_noop:
            out |= bench_noop(catalog, defs, args.noop_repeats)
        catalog.dispose()
    return out


def bench_noop(catalog: Catalog, defs: Any, repeats: int) -> Results:
    """plan_round + fast_forward_target for each target + commit_round, with nothing to replicate."""
    submit = CountingSubmit()
    totals, parts = [], {"plan": [], "ff": [], "commit": []}
    for _ in range(repeats):
        plan, plan_s = timed(plan_round, catalog, defs, TABLE)
        start = time.perf_counter()
        copied = 0
        for site in plan.targets:
            r = fast_forward_target(
                catalog, defs, TABLE, site, plan.end_us, big_copier=spark_copier(defs, TABLE, plan.end_us, site, submit)
            )
            copied += r.segments_copied
        ff_s = time.perf_counter() - start
        report, commit_s = timed(commit_round, catalog, defs, TABLE, plan.end_us, merge_ran=plan.manifest is not None)
        if copied or plan.manifest or report.status != "ok":
            raise SystemExit(f"(b) the round was not a no-op: copied {copied}, manifest {plan.manifest}")
        parts["plan"].append(plan_s)
        parts["ff"].append(ff_s)
        parts["commit"].append(commit_s)
        totals.append(plan_s + ff_s + commit_s)
    log(f"(b) no-op rounds: {', '.join(f'{t:.3f}' for t in totals)} s")
    return {
        "noop_targets": len(plan.targets),
        "noop_total_s": statistics.median(totals),
        "noop_all_s": [round(t, 3) for t in totals],
        **{f"noop_{k}_s": statistics.median(v) for k, v in parts.items()},
        "spark_apps_noop": len(submit.calls),
    }


# -- (c) Spark merge and the row-based baselines ---------------------------------------------------------------


def bench_merge(rows: pa.Table, source: Path, work: Path, args: argparse.Namespace) -> Results:
    out: Results = {"catalog": args.catalog, "rows": rows.num_rows}
    with catalog_url(args.catalog, work, "bench_merge") as url:
        catalog, defs = lineitem_env(work / "merge", url, ["primary", "dr"], source, quartile_splits(rows))
        set_leader(catalog, 2)  # dr leads: every row is written there
        out["write_s"] = write_in_batches(catalog, rows, args.batches)
        set_leader(catalog, 1)  # the operator moves leadership back: dr now holds a fork of every partition
        log(f"(c) {rows.num_rows:,} rows written at dr in {out['write_s']:.1f} s; leadership back to primary")
        submit = CountingSubmit()
        os.environ[ENGINE_ENV] = "spark"  # this part measures the Spark merge, whatever its size
        try:
            report, round_s = timed(run_round, catalog, defs, TABLE, submit=submit)
        except SegrepError as exc:
            lines = str(exc).splitlines()
            out |= {"error": lines[0], "error_tail": lines[-3:], "spark_calls": submit.calls}
            log(f"(c) merge FAILED after {submit.calls[-1]['seconds'] if submit.calls else 0:.0f} s: {exc}")
            catalog.dispose()
            return out
        finally:
            os.environ.pop(ENGINE_ENV)
        merges = report.merges
        apps = [c for c in submit.calls if c["app"] == "merge"]
        if report.status != "ok" or merges.rows_merged != rows.num_rows or len(apps) != 1:
            raise SystemExit(f"(c) unexpected merge round: status {report.status}, merges {merges}, apps {apps}")
        merge_s = apps[0]["seconds"]
        out |= {
            "round_s": round_s,
            "merge_submit_s": merge_s,
            "merge_rows_in": merges.rows_in,
            "merge_rows_merged": merges.rows_merged,
            "merge_items": merges.items,
            "spark_apps": len(submit.calls),
            "merge_rows_s": merges.rows_in / merge_s,
        }
        log(f"(c) merge: one spark-submit {merge_s:.1f} s, round {round_s:.1f} s")
        catalog.dispose()
    return out


def _sa_table(schema: pa.Schema, name: str) -> Any:
    from sqlalchemy import BigInteger, Column, Date, Integer, MetaData, Numeric, Table, Text

    def sa_type(t: pa.DataType) -> Any:
        if pa.types.is_int64(t):
            return BigInteger()
        if pa.types.is_integer(t):
            return Integer()
        if pa.types.is_decimal(t):
            return Numeric(t.precision, t.scale)
        if pa.types.is_date(t):
            return Date()
        return Text()

    cols = [Column(f.name, sa_type(f.type), primary_key=f.name in PK, nullable=f.name in PK) for f in schema]
    return Table(name, MetaData(), *cols)


def bench_row_baselines(rows: pa.Table, args: argparse.Namespace) -> Results:
    """Row-based apply into PostgreSQL via SQLAlchemy: batched upserts and one upsert per row."""
    from sqlalchemy import create_engine
    from sqlalchemy.dialects.postgresql import insert

    out: Results = {}
    with pg_schema("bench_rows") as (_schema, url):
        engine = create_engine(url)
        for kind, sample in (("batched", args.batched_sample), ("per_row", args.row_sample)):
            table = _sa_table(rows.schema, f"lineitem_{kind}")
            table.create(engine)
            data = rows.slice(0, sample).to_pylist()  # conversion to Python rows is not timed
            ins = insert(table)
            stmt = ins.on_conflict_do_update(
                index_elements=PK, set_={c.name: ins.excluded[c.name] for c in table.columns if c.name not in PK}
            )
            start = time.perf_counter()
            if kind == "batched":
                for off in range(0, len(data), args.batch_rows):
                    with engine.begin() as conn:
                        conn.execute(stmt, data[off : off + args.batch_rows])
            else:
                with engine.connect() as conn:
                    for i, row in enumerate(data, 1):
                        conn.execute(stmt, row)
                        if i % 100 == 0:
                            conn.commit()
                    conn.commit()
            seconds = time.perf_counter() - start
            with engine.connect() as conn:
                from sqlalchemy import func

                count = conn.scalar(select(func.count()).select_from(table))
            if count != len(data):
                raise SystemExit(f"(c) baseline {kind}: {count} rows in PostgreSQL, expected {len(data)}")
            out |= {f"{kind}_rows": len(data), f"{kind}_s": seconds, f"{kind}_rows_s": len(data) / seconds}
            log(f"(c) baseline {kind}: {len(data):,} rows in {seconds:.1f} s = {len(data) / seconds:,.0f} rows/s")
        engine.dispose()
    return out


# -- (e) planning at scale -------------------------------------------------------------------------------------


def build_plan_catalog(root: Path, url: str, schema: str, source: Path, partitions: int, total: int) -> Any:
    """A catalog with ``partitions`` partitions x (leader + 2 replicas) and ``total`` segment entries, built with
    COPY (benchkit.fill_chains). Every chain holds the same history at the three placements (all acked both
    ways); ~100 partitions have one new segment at the leader that no replica holds yet. Returns the
    definitions and the catalog's figures."""
    catalog, defs = lineitem_env(root, url, ["primary", "r1", "r2"], source, [])  # sites and the table row
    history = (total - 100) // 3  # segments per chain summed over partitions (each chain is held 3 times)
    new = total - 3 * history
    facts = fill_chains(catalog, schema, TABLE, partitions=partitions, history=history, new=new)
    catalog.dispose()
    return defs, {
        "segments": facts["segments"],
        "acks": facts["acks"],
        "new_segments": new,
        "chain_per_partition": facts["chain"],
    }


def _child(url: str, config: str, what: str, repeats: int, queue: Any) -> None:
    """In a child process: time ``what`` (plan_round or the catalog snapshot alone) ``repeats`` times."""
    from segrep.catalog.snapshot import snapshot

    catalog, defs = Catalog(url), load_definitions(Path(config))
    for _ in range(repeats):
        if what == "plan":
            _, secs = timed(plan_round, catalog, defs, TABLE)
        else:
            with catalog.read() as s:
                _, secs = timed(snapshot, s, TABLE)
        queue.put(secs)


def timed_child(url: str, config: Path, what: str, repeats: int, timeout_s: float) -> tuple[list[float], bool]:
    """Times of up to ``repeats`` runs in a child process, stopped after ``timeout_s``; (times, timed_out)."""
    import multiprocessing as mp
    import queue as qu

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    proc = ctx.Process(target=_child, args=(url, str(config), what, repeats, q))
    proc.start()
    deadline = time.monotonic() + timeout_s
    times: list[float] = []
    while len(times) < repeats:
        try:
            times.append(q.get(timeout=max(deadline - time.monotonic(), 0.01)))
        except qu.Empty:
            break
        if proc.exitcode not in (None, 0):
            break
    timed_out = len(times) == 0 and proc.is_alive()
    if proc.is_alive():
        proc.kill()
    proc.join()
    if not times and not timed_out:
        raise SystemExit(f"(e) {what} failed in the child process (exit {proc.exitcode})")
    return times, timed_out


def bench_planning(source: Path, work: Path, args: argparse.Namespace) -> Results:
    out: Results = {"partitions": args.plan_partitions, "targets": 2, "timeout_s": args.plan_timeout_s}
    for label, total in (("1x", args.plan_segments), ("10x", args.plan_segments * 10)):
        with pg_schema(f"bench_plan_{label}") as (schema, url):
            root = work / f"plan-{label}"
            (defs, facts), build_s = timed(build_plan_catalog, root, url, schema, source, args.plan_partitions, total)
            log(f"(e) {label}: built {facts} in {build_s:.1f} s")
            out |= {f"{label}_{k}": v for k, v in facts.items()} | {f"{label}_build_s": build_s}
            times, late = timed_child(url, root / "segrep.yaml", "plan", args.plan_repeats, args.plan_timeout_s)
            out[f"{label}_plan_s"] = statistics.median(times) if times else None
            out[f"{label}_plan_all_s"] = [round(t, 3) for t in times]
            log(f"(e) {label}: plan_round {'timed out' if late else times}")
            snap, snap_late = timed_child(url, root / "segrep.yaml", "snapshot", 1, args.snapshot_timeout_s)
            out[f"{label}_snapshot_s"] = snap[0] if snap else None
            log(f"(e) {label}: snapshot alone {'timed out' if snap_late else snap}")
    one, ten = out["1x_plan_s"], out["10x_plan_s"]
    out["growth"] = ten / one if one and ten else None
    if one is None or one > 2.0 or ten is None or (out["growth"] or 0) > 1.5 or args.profile_plan:
        # the full scale is too slow to profile in-process: profile a tenth of it (partitions and segments)
        parts, segs = max(args.plan_partitions // 10, 10), max(args.plan_segments // 10, 1000)
        with pg_schema("bench_plan_prof") as (schema, url):
            defs, facts = build_plan_catalog(work / "plan-prof", url, schema, source, parts, segs)
            catalog = Catalog(url)
            (top, secs) = timed(profile_top, plan_round, catalog, defs, TABLE)
            catalog.dispose()
        out["profile"] = {"partitions": parts, "segments": facts["segments"], "seconds": secs, "top": top}
        print(
            f"\n### cProfile of plan_round at {parts:,} partitions, {facts['segments']:,} segments "
            f"({secs:.1f} s under the profiler)\n",
            file=sys.stderr,
        )
        print("\n".join(top), file=sys.stderr)
    return out


# -- report ----------------------------------------------------------------------------------------------------


def table_rows(r: Results) -> list[tuple[str, str, str, str, str, str]]:
    rows: list[tuple[str, str, str, str, str, str]] = []
    a, c, e, f = r.get("a"), r.get("c"), r.get("e"), r.get("f")
    base = r.get("c_baselines")
    if a:
        mb = a["bytes"] / 1e6
        for cache in ("cold", "warm"):
            rows.append(
                (
                    f"(a) fast-forward, {cache}{'-ish' if cache == 'cold' else ''} cache: whole round to one target "
                    f"({a['segments']} segments, {mb:,.0f} MB, {a['rows']:,} rows), MB/s | rows/s",
                    f"{a[f'seg_{cache}_MBps']:,.0f} MB/s, {a[f'seg_{cache}_rows_s']:,.0f} rows/s "
                    f"(copy step alone {a[f'segff_{cache}_MBps']:,.0f} MB/s)",
                    f"cp {a[f'cp_{cache}_MBps']:,.0f} MB/s (cp + sync {a[f'cpsync_{cache}_MBps']:,.0f} MB/s)",
                    f"{a[f'ratio_{cache}']:.2f}",
                    "≥ 0.8 of cp",
                    verdict(a[f"ratio_{cache}"] >= 0.8),
                )
            )
        rows.append(
            (
                "(a) Spark applications launched by the fast-forward rounds",
                str(a["spark_apps_ff"]),
                "-",
                "-",
                "0",
                verdict(a["spark_apps_ff"] == 0),
            )
        )
        if "noop_total_s" in a:
            rows.append(
                (
                    f"(b) round with nothing to do ({a['noop_targets']} targets, 4 partitions): plan + fast-forward + "
                    f"commit, median s",
                    f"{a['noop_total_s']:.3f} (plan {a['noop_plan_s']:.3f}, ff {a['noop_ff_s']:.3f}, "
                    f"commit {a['noop_commit_s']:.3f})",
                    "-",
                    "-",
                    "≤ 1.5 s",
                    verdict(a["noop_total_s"] <= 1.5),
                )
            )
            rows.append(
                ("(b) Spark applications", str(a["spark_apps_noop"]), "-", "-", "0", verdict(a["spark_apps_noop"] == 0))
            )
    if c and "error" in c:
        rows.append(
            (
                "(c) Spark merge of the fork, one spark-submit",
                f"FAILED: {c['error']}",
                "-",
                "-",
                "≥ 3x batched, ≥ 10x per-row",
                "**NOT MET**",
            )
        )
    elif c and base:
        for kind, target in (("batched", 3), ("per_row", 10)):
            ratio = c["merge_rows_s"] / base[f"{kind}_rows_s"]
            label = (
                f"PostgreSQL upserts, executemany of {r['args']['batch_rows']:,} per commit"
                if kind == "batched"
                else "PostgreSQL upsert per row, commit every 100"
            )
            rows.append(
                (
                    f"(c) Spark merge of {c['merge_rows_in']:,} rows, one spark-submit incl. start-up, rows/s",
                    f"{c['merge_rows_s']:,.0f} ({c['merge_submit_s']:.1f} s)",
                    f"{label}: {base[f'{kind}_rows_s']:,.0f} ({base[f'{kind}_rows']:,} rows)",
                    f"{ratio:.1f}",
                    f"≥ {target}x",
                    verdict(ratio >= target),
                )
            )
    elif c and "merge_rows_s" in c:
        rows.append(("(c) Spark merge rows/s", f"{c['merge_rows_s']:,.0f}", "not measured", "-", "-", "-"))
    if a and base:
        ratio = a["seg_cold_rows_s"] / base["batched_rows_s"]
        rows.append(
            (
                "(d) fast-forward rows/s (a, cold-ish) vs batched row-based apply (c)",
                f"{a['seg_cold_rows_s']:,.0f}",
                f"{base['batched_rows_s']:,.0f}",
                f"{ratio:,.0f}",
                "≥ 100x",
                verdict(ratio >= 100),
            )
        )
    if e:

        def secs(v: float | None) -> str:
            return f"{v:.2f}" if v is not None else f"> {e['timeout_s']:.0f} (timed out)"

        def snap(label: str) -> str:
            return f" (catalog snapshot alone {secs(e[f'{label}_snapshot_s'])})"

        one, ten = e["1x_plan_s"], e["10x_plan_s"]
        rows.append(
            (
                f"(e) plan_round, {e['partitions']:,} partitions, 2 targets, {e['1x_segments']:,} segments "
                f"({e['1x_new_segments']} new), median s",
                secs(one) + snap("1x"),
                "-",
                "-",
                "≤ 2 s",
                verdict(one is not None and one <= 2.0),
            )
        )
        growth = f"{e['growth']:.2f}" if e["growth"] else "-"
        rows.append(
            (
                f"(e) plan_round at ten times the history ({e['10x_segments']:,} segments), median s",
                secs(ten) + snap("10x"),
                f"{secs(one)} (1x)",
                growth,
                "≤ 1.5x the 1x case",
                verdict(e["growth"] is not None and e["growth"] <= 1.5),
            )
        )
    if f:
        rows += schema_rows(f)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (1 = 6M lineitem rows)")
    ap.add_argument("--batches", type=int, default=10, help="write batches (= segments per partition)")
    ap.add_argument("--repeats", type=int, default=3, help="(a) repeats; each one copy cold-ish and one warm")
    ap.add_argument("--noop-repeats", type=int, default=7, help="(b) no-op rounds (median reported)")
    ap.add_argument("--catalog", choices=["postgresql", "sqlite"], default="postgresql", help="catalog for a-c, f")
    ap.add_argument(
        "--spark-driver-memory",
        default="4g",
        help="(c) SPARK_DRIVER_MEMORY for spark-submit ('' = Spark's 1g, which fails at scale 1)",
    )
    ap.add_argument("--batched-sample", type=int, default=200_000, help="(c) rows for the batched baseline")
    ap.add_argument("--row-sample", type=int, default=20_000, help="(c) rows for the per-row baseline")
    ap.add_argument("--batch-rows", type=int, default=10_000, help="(c) rows per batched transaction")
    ap.add_argument("--plan-partitions", type=int, default=10_000)
    ap.add_argument("--plan-segments", type=int, default=200_000, help="(e) catalog segments (then 10x)")
    ap.add_argument("--plan-repeats", type=int, default=5)
    ap.add_argument("--plan-timeout-s", type=float, default=90.0, help="(e) give up on plan_round after this")
    ap.add_argument("--snapshot-timeout-s", type=float, default=180.0, help="(e) same for the snapshot alone")
    ap.add_argument("--profile-plan", action="store_true", help="(e) always profile one plan_round")
    ap.add_argument("--skip-ff", action="store_true", help="skip (a), (b) and (d)")
    ap.add_argument("--skip-noop", action="store_true", help="skip (b)")
    ap.add_argument("--skip-merge", action="store_true", help="skip the Spark merge of (c)")
    ap.add_argument("--skip-baselines", action="store_true", help="skip the row-based baselines of (c) and (d)")
    ap.add_argument("--skip-plan", action="store_true", help="skip (e)")
    ap.add_argument("--skip-schema", action="store_true", help="skip (f)")
    ap.add_argument("--background-load", type=int, default=0, metavar="N", help="N CPU-bound processes meanwhile")
    ap.add_argument("--tpch-dir", type=Path, default=Path("data/tpch"))
    ap.add_argument("--work-dir", type=Path, default=None, help="parent of the scratch directory (default: /tmp)")
    ap.add_argument("--results-dir", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()

    results: Results = {
        "date": dt.date.today().isoformat(),
        "args": args_doc(args),
    }
    seconds: dict[str, float] = {}
    if args.spark_driver_memory:
        os.environ["SPARK_DRIVER_MEMORY"] = args.spark_driver_memory  # spark-submit reads it; launch passes env
    results["loadavg_start"] = os.getloadavg()
    results["background_load"] = args.background_load
    lineitem_parts = not (args.skip_ff and args.skip_merge and args.skip_baselines and args.skip_plan)
    source = Path()
    if lineitem_parts:
        source = demo_data.generate_tpch("lineitem", args.scale, args.tpch_dir / f"sf{args.scale:g}").resolve()
    rows = None
    if not (args.skip_ff and args.skip_merge and args.skip_baselines):
        rows = demo_data.normalized(pq.read_table(source))
        rows = rows.sort_by([(k, "ascending") for k in PK])
    with (
        tempfile.TemporaryDirectory(prefix="segrep-bench-rounds-", dir=args.work_dir) as tmp,
        background_load(args.background_load),
    ):
        work = Path(tmp)
        if not args.skip_ff:
            results["a"], seconds["a+b"] = timed(bench_fast_forward, rows, source, work, args)
        if not args.skip_merge:
            results["c"], seconds["c merge"] = timed(bench_merge, rows, source, work, args)
        if not args.skip_baselines:
            results["c_baselines"], seconds["c baselines"] = timed(bench_row_baselines, rows, args)
        if not args.skip_plan:
            results["e"], seconds["e"] = timed(bench_planning, source, work, args)
        if not args.skip_schema:
            (work / "f").mkdir()
            with catalog_url(args.catalog, work / "f", "bench_schema") as url:
                results["f"], seconds["f"] = timed(
                    bench_schema_change, url, work / "f", args.scale, args.tpch_dir, args.batches, CountingSubmit()
                )
    results["loadavg_end"] = os.getloadavg()
    results["part_seconds"] = {k: round(v, 1) for k, v in seconds.items()}

    print_table(table_rows(results))
    print("\nruntime per part: " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()))
    start, end = results["loadavg_start"], results["loadavg_end"]
    print(f"background load {args.background_load}; load average {start[0]:.2f} at the start, {end[0]:.2f} at the end")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    load = f"-load{args.background_load}" if args.background_load else ""
    out = args.results_dir / f"rounds-{results['date']}{load}.json"
    out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
