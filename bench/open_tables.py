"""bench/open_tables.py: what publishing each site's copy as an Iceberg table costs, and how fast engines read it
(issue 37 item 5, DESIGN section 18).

(publish) TPC-H orders at `primary`, replicated to `dr` (local directories, a SQLite or PostgreSQL catalog),
policy `publish: iceberg`. After a history of writes, each measured round follows a write of changed and new
orders (updates of existing keys, so old rows are hidden by position deletes): the round's time (plan to
commit) and, inside it, the publication of both sites. Goal: publication <= 10 % of the round without it.
The floor, in the same catalog: the least pyiceberg itself commits (a table property set on a scratch table: one
metadata file written and the catalog's conditional update, no manifest), once per site the round publishes,
against the same rest of the round: what any publication through pyiceberg's catalog costs at the least.

(history) A table with --history-segments segment files at each site (many small interleaved writes), then one
write and its round: the incremental publication of that round (it reads the new files only and carries the
manifests), and the worst case, a consolidated one (forced). Goal: <= 1 s.

(scan) The published `dr` table read whole through pyiceberg's own SQL catalog (`scan().to_arrow()`), against
`segrep read --site dr` of the same copy (`read_table`), each the median of --repeats. Goal: pyiceberg's
throughput >= 0.8 of segrep's.

(writer) The Spark writer against ``df.write.parquet`` on one standalone cluster: bench/open_tables_writer.py.

(deletes) What reading position deletes costs pyiceberg as segrep lays them out: --delete-files data files with
--delete-rows hidden positions each, written by the publisher's ``position_deletes`` once as one delete file
shared by all of them and once as a delete file of its own per data file; each delete file read as pyiceberg's
scan reads it (``_read_deletes``: once, then filtered once per data file it names). No goal: the layout's reason.

``--background-load N`` runs N CPU-bound processes for the whole run (figures under load).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from benchkit import (
    ORDERS_COLUMNS,
    args_doc,
    background_load,
    load_footer,
    log,
    make_env,
    pg_schema,
    print_table,
    quantile_splits,
    timed,
    verdict,
    write_interleaved,
)
from object_store import endpoints, s3_site
from open_tables_writer import part_writer
from pyiceberg.catalog import load_catalog
from pyiceberg.io import pyarrow as pyiceberg_arrow
from sqlalchemy import func, select

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.config.definitions import Definitions
from segrep.data import demo as demo_data
from segrep.data.reader import read_table
from segrep.data.writer import write_batch
from segrep.publish import iceberg_files, publisher
from segrep.publish.outcome import PublishStatus, SitePublication
from segrep.publish.site_io import SiteFileIO, local_io_properties
from segrep.replication.orchestrator import run_round
from segrep.replication.publication import publish

TABLE = "orders"
KEY = "o_orderkey"
Results = dict[str, Any]


def no_spark(*args: Any, **kwargs: Any) -> None:
    raise SystemExit(f"a round asked for Spark although nothing here needs a merge: {args}")


def body(rows: pa.Table) -> dict[str, Any]:
    return {
        "columns": ORDERS_COLUMNS,
        "primary_key": [KEY],
        "split_points": quantile_splits(rows, KEY),
        "policy": {"publish": "iceberg"},
    }


def changed(rows: pa.Table, n: int, seed: int) -> pa.Table:
    """``n`` orders of ``rows`` with a new comment: updates, each hiding an older row at every site."""
    pick = np.random.default_rng(seed).choice(rows.num_rows, size=n, replace=False)
    out = rows.take(pa.array(np.sort(pick)))
    comment = pc.binary_join_element_wise(out.column("o_comment"), pa.scalar(f" u{seed}"), "")
    return out.set_column(out.schema.get_field_index("o_comment"), "o_comment", comment)


def published_seconds(pubs: list[SitePublication]) -> float:
    bad = [p.line() for p in pubs if p.status is PublishStatus.FAILED]
    if bad:
        raise SystemExit(f"publication failed: {bad}")
    return sum(p.seconds for p in pubs)


def measured_round(catalog: Catalog, defs: Definitions, batch: pa.Table) -> dict[str, Any]:
    """One write of ``batch`` and the round after it: the round's time and, inside it, the publication's."""
    write_batch(catalog, TABLE, batch)
    report, seconds = timed(run_round, catalog, defs, TABLE, submit=no_spark)
    pub = published_seconds(report.published)
    kinds = sorted({str(p.kind) for p in report.published})
    sites = sorted(p.site for p in report.published if p.status is PublishStatus.PUBLISHED)
    return {"round_s": seconds, "publish_s": pub, "rows": batch.num_rows, "kinds": kinds, "sites": sites}


def summarize(measured: list[dict[str, Any]]) -> Results:
    round_s = statistics.median(m["round_s"] for m in measured)
    pub_s = statistics.median(m["publish_s"] for m in measured)
    return {"rounds": measured, "round_s": round_s, "publish_s": pub_s, "ratio": pub_s / (round_s - pub_s)}


def bench_publish(
    rows: pa.Table, catalog: Catalog, defs: Definitions, url: str, work: Path, args: argparse.Namespace
) -> Results:
    """New orders (the next keys, as an order stream brings them) and, apart, updates of existing orders; and
    the floor of a commit through pyiceberg's catalog in the same database."""
    cut = int(rows.num_rows * 0.6)
    write_interleaved(catalog, TABLE, rows.slice(0, cut), args.batches)
    first = run_round(catalog, defs, TABLE, submit=no_spark)
    first_s = published_seconds(first.published)
    log(f"(publish) {cut:,} orders written and replicated; first publication {first_s:.2f} s")
    appends, updates = [], []
    for i in range(args.rounds):
        appends.append(measured_round(catalog, defs, rows.slice(cut + i * args.update_rows, args.update_rows)))
        log(f"(publish) new orders, round {i}: {appends[-1]}")
    for i in range(args.rounds):
        updates.append(measured_round(catalog, defs, changed(rows.slice(0, cut), args.update_rows, i)))
        log(f"(publish) updated orders, round {i}: {updates[-1]}")
    out = {"appends": summarize(appends), "updates": summarize(updates)}
    sites = len(appends[0]["sites"])
    commit_s = floor_commit_s(url, work / "floor", max(2 * args.rounds, 5))
    rest_s = out["appends"]["round_s"] - out["appends"]["publish_s"]
    out["floor"] = {"commit_s": commit_s, "sites": sites, "ratio": commit_s * sites / rest_s}
    log(f"(publish) floor: pyiceberg's least commit {commit_s * 1e3:.1f} ms, x {sites} sites, vs {rest_s:.3f} s")
    return out


def floor_commit_s(url: str, where: Path, repeats: int) -> float:
    """The median time of pyiceberg's least commit in the catalog at ``url``: a property set on a scratch table
    of namespace ``bench_floor`` (a new metadata file and the catalog's conditional update of its location)."""
    ice = load_catalog("segrep", type="sql", uri=url)
    try:
        ice.create_namespace("bench_floor")
        tbl = ice.create_table(
            ("bench_floor", "t"), schema=pa.schema([pa.field("k", pa.int64())]), location=where.as_uri()
        )
        times = []
        for i in range(repeats + 1):  # the first is not counted (imports, a first connection)
            started = time.perf_counter()
            with tbl.transaction() as tx:
                tx.set_properties(commit=str(i))
            times.append(time.perf_counter() - started)
        ice.drop_table(("bench_floor", "t"))
        ice.drop_namespace("bench_floor")
    finally:
        ice.engine.dispose()
    return statistics.median(times[1:])


def bench_history(work: Path, url: str, args: argparse.Namespace) -> Results:
    """--history-segments files at one site (its own leader: a publication's cost is per site), then one write
    of updates across every partition: its incremental publication, and a consolidated one (forced)."""
    parts = 16
    writes = max(args.history_segments // parts, 1)
    keys = np.arange(writes * 64, dtype=np.int64)
    rows = pa.table({"k": keys, "v": pa.array(np.full(keys.size, "x"))})
    splits = [int(q) for q in np.quantile(keys, [i / parts for i in range(1, parts)])]
    columns = {"columns": {"k": "int64", "v": "string"}, "primary_key": ["k"], "split_points": splits}
    catalog, defs = make_env(work, url, ["primary"], "h", {**columns, "policy": {"publish": "iceberg"}})
    try:
        t0 = time.perf_counter()
        write_interleaved(catalog, "h", rows, writes)
        log(f"(history) {writes} writes of {parts} segments each in {time.perf_counter() - t0:.0f} s")
        clean = publish(catalog, defs, "h").sites[0]
        upd = rows.take(pa.array(np.arange(0, rows.num_rows, max(rows.num_rows // 2000, 1))))
        out: Results = {"clean_s": clean.seconds}
        for kind, value in (("incremental", "y"), ("consolidated", "z")):
            write_batch(catalog, "h", upd.set_column(1, "v", pa.array(np.full(upd.num_rows, value))))
            saved = publisher.MAX_CARRIED_MANIFESTS
            if kind == "consolidated":
                publisher.MAX_CARRIED_MANIFESTS = 0  # the next publication consolidates
            try:
                pub = publish(catalog, defs, "h").sites[0]
            finally:
                publisher.MAX_CARRIED_MANIFESTS = saved
            out[f"{kind}_s"], out[f"{kind}_kind"] = pub.seconds, str(pub.kind)
        _, out["unchanged_s"] = timed(publish, catalog, defs, "h")
        with catalog.read() as s:
            out["segments_in_catalog"] = s.scalar(select(func.count()).select_from(m.Segment))
        log(f"(history) {out}")
    finally:
        catalog.dispose()
    return out


def bench_scan(catalog: Catalog, url: str, args: argparse.Namespace) -> Results:
    ice = load_catalog("segrep", type="sql", uri=url)
    try:
        tbl = ice.load_table(("dr", TABLE))

        def pyiceberg_scan() -> pa.Table:
            return tbl.scan().to_arrow()

        def segrep_read() -> pa.Table:
            return read_table(catalog, TABLE, "dr")

        got, want = pyiceberg_scan(), segrep_read()
        if got.num_rows != want.num_rows or not got.sort_by(KEY).cast(want.schema).equals(want.sort_by(KEY)):
            raise SystemExit(
                f"(scan) the published table differs from segrep's read: {got.num_rows} vs {want.num_rows}"
            )
        times: dict[str, list[float]] = {"pyiceberg": [], "segrep": []}
        for _ in range(args.repeats):
            for name, fn in (("pyiceberg", pyiceberg_scan), ("segrep", segrep_read)):
                times[name].append(timed(fn)[1])
        # diagnostic, not the goal's figure: the same scans with pyiceberg building each file's row positions
        # with numpy instead of from a Python range (its _combine_positional_deletes, ~100 ns a row under the GIL
        # for every row of a file with a position delete; its own comment names the upgrade, issue 1271)
        saved = pyiceberg_arrow._combine_positional_deletes
        pyiceberg_arrow._combine_positional_deletes = _positions_with_numpy
        try:
            times["pyiceberg_numpy_positions"] = [timed(pyiceberg_scan)[1] for _ in range(args.repeats)]
        finally:
            pyiceberg_arrow._combine_positional_deletes = saved
    finally:
        ice.engine.dispose()
    ice_s, seg_s = statistics.median(times["pyiceberg"]), statistics.median(times["segrep"])
    fast_s = statistics.median(times["pyiceberg_numpy_positions"])
    log(
        f"(scan) {want.num_rows:,} rows: pyiceberg {ice_s:.3f} s, segrep read {seg_s:.3f} s; "
        f"with numpy positions {fast_s:.3f} s"
    )
    return {
        "rows": want.num_rows,
        "pyiceberg_s": ice_s,
        "segrep_s": seg_s,
        "throughput_ratio": seg_s / ice_s,
        "pyiceberg_numpy_positions_s": fast_s,
        "all": times,
    }


def bench_deletes(work: Path, args: argparse.Namespace) -> Results:
    """pyiceberg's reading of the same hidden positions, one delete file shared by every data file vs one each."""
    root = work / "deletes"
    root.mkdir()
    io = SiteFileIO(local_io_properties(str(root)))
    n_files, n_rows = args.delete_files, args.delete_rows
    uris = {
        f"t/p{i:04d}/seg-{i:06d}.parquet": f"{root.as_uri()}/t/p{i:04d}/seg-{i:06d}.parquet" for i in range(n_files)
    }
    hidden = pa.table(
        {
            "_file": pa.array(np.repeat(list(uris), n_rows)),
            "_pos": pa.array(np.tile(np.arange(n_rows, dtype=np.int64), n_files)),
        }
    )
    out: Results = {"data_files": n_files, "rows_each": n_rows}
    saved = iceberg_files.OWN_DELETE_FILE_ROWS
    try:
        for snapshot_id, (layout, threshold) in enumerate((("shared", n_rows + 1), ("own", 1)), start=1):
            iceberg_files.OWN_DELETE_FILE_ROWS = threshold
            made = iceberg_files.position_deletes(io, root.as_uri(), snapshot_id, hidden, uris)
            started = time.perf_counter()
            read = [pyiceberg_arrow._read_deletes(io, f) for f in made]
            out[f"{layout}_s"] = time.perf_counter() - started
            out[f"{layout}_files"] = len(made)
            if sum(len(d) for d in read) != n_files or sum(len(c) for d in read for c in d.values()) != hidden.num_rows:
                raise SystemExit(f"(deletes) the {layout} layout reads back other positions than written")
    finally:
        iceberg_files.OWN_DELETE_FILE_ROWS = saved
    log(f"(deletes) {out}")
    return out


def _positions_with_numpy(deletes: list[pa.ChunkedArray], start: int, end: int) -> pa.Array:
    """pyiceberg's ``_combine_positional_deletes`` (the positions of a batch not deleted) with the range built by
    numpy: the same result."""
    chunks = pa.chunked_array([c for arr in deletes for c in arr.chunks], type=pa.int64())
    full = pa.array(np.arange(start, end, dtype=np.int64))
    return pc.subtract(pc.filter(full, pc.invert(pc.is_in(full, value_set=chunks))), pa.scalar(start))


def table_rows(r: Results) -> list[tuple[str, ...]]:
    out = []
    if "publish" in r:
        for key, what in (("appends", "new orders (the next keys)"), ("updates", "updates of existing orders")):
            p = r["publish"][key]
            goal = key == "appends"
            out.append(
                (
                    f"(publish) round after a write of {p['rounds'][0]['rows']:,} {what}: publication of both sites "
                    f"vs the rest of the round, s (median of {len(p['rounds'])})",
                    f"{p['publish_s']:.3f}",
                    f"{p['round_s'] - p['publish_s']:.3f}",
                    f"{p['ratio']:.3f}",
                    "<= 0.10" if goal else "-",
                    verdict(p["ratio"] <= 0.10) if goal else "-",
                )
            )
        f, rest = r["publish"]["floor"], r["publish"]["appends"]
        out.append(
            (
                f"(publish, floor) pyiceberg's least commit in the same catalog (a property set: one metadata file and "
                f"the catalog's update, no manifest), once per site published ({f['sites']}), vs the same rest of "
                "the round, s",
                f"{f['commit_s'] * f['sites']:.3f}",
                f"{rest['round_s'] - rest['publish_s']:.3f}",
                f"{f['ratio']:.3f}",
                "-",
                "-",
            )
        )
    if "history" in r:
        h = r["history"]
        worst = max(h["incremental_s"], h["consolidated_s"])
        out.append(
            (
                f"(history) publication after a write of updates with {h['segments_in_catalog']:,} segments of "
                "history at the site: incremental / consolidated / nothing changed, s",
                f"{h['incremental_s']:.3f} / {h['consolidated_s']:.3f} / {h['unchanged_s']:.3f}",
                f"clean (first) {h['clean_s']:.2f}",
                "-",
                "<= 1 s",
                verdict(worst <= 1.0),
            )
        )
    if "writer" in r:
        out += [tuple(row) for row in r["writer"]["table"]]
    if "deletes" in r:
        d = r["deletes"]
        out.append(
            (
                f"(deletes) pyiceberg reading the position deletes of {d['data_files']:,} data files, "
                f"{d['rows_each']:,} rows each: a delete file per data file vs one shared, s",
                f"{d['own_s']:.3f} ({d['own_files']} files)",
                f"{d['shared_s']:.3f} ({d['shared_files']} file)",
                f"{d['shared_s'] / d['own_s']:.2f}",
                "-",
                "-",
            )
        )
    if "scan" in r:
        s = r["scan"]
        out.append(
            (
                f"(scan) whole table at dr ({s['rows']:,} rows): pyiceberg scan vs segrep read, s (median of "
                f"{len(s['all']['segrep'])}); ratio = segrep time / pyiceberg time",
                f"{s['pyiceberg_s']:.3f}",
                f"{s['segrep_s']:.3f}",
                f"{s['throughput_ratio']:.2f}",
                ">= 0.8",
                verdict(s["throughput_ratio"] >= 0.8),
            )
        )
        out.append(
            (
                "(scan, diagnostic) the same pyiceberg scan with its delete positions built by numpy, not from a "
                "Python range (a one-line change in pyiceberg's _combine_positional_deletes)",
                f"{s['pyiceberg_numpy_positions_s']:.3f}",
                f"{s['segrep_s']:.3f}",
                f"{s['segrep_s'] / s['pyiceberg_numpy_positions_s']:.2f}",
                "-",
                "-",
            )
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--part", action="append", choices=["publish", "history", "scan", "writer", "deletes"], help="default: all"
    )
    ap.add_argument("--scale", type=float, default=1.0, help="TPC-H scale of orders (1 = 1.5M rows)")
    ap.add_argument("--batches", type=int, default=10, help="history writes before the measured rounds")
    ap.add_argument("--rounds", type=int, default=5, help="(publish) measured rounds")
    ap.add_argument("--update-rows", type=int, default=25_000, help="(publish) updated orders per round (as many new)")
    ap.add_argument("--history-segments", type=int, default=10_000)
    ap.add_argument("--delete-files", type=int, default=400, help="(deletes) data files with hidden rows")
    ap.add_argument("--delete-rows", type=int, default=1_000, help="(deletes) hidden rows of each")
    ap.add_argument("--repeats", type=int, default=5, help="(scan) reads of each kind")
    ap.add_argument("--catalog", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument(
        "--dr-store", choices=["local", "s3"], default="local", help="(publish, scan) where `dr` is: s3 = a moto server"
    )
    ap.add_argument("--partitions", type=int, default=4, help="(writer) key ranges of the table")
    ap.add_argument("--writer-repeats", type=int, default=3, help="(writer) measured runs of each side (medians)")
    ap.add_argument("--cores", type=int, default=2, help="(writer) cores of the cluster's worker")
    ap.add_argument("--memory", default="4g", help="(writer) memory of the cluster's worker")
    ap.add_argument("--executor-memory", default="3g", help="(writer) heap of the executor")
    ap.add_argument("--arrow-batch-rows", type=int, default=0, help="(writer) rows per Arrow batch (0: Spark's)")
    ap.add_argument("--split-mb", type=int, default=0, help="(writer) most MB of input per Spark partition")
    ap.add_argument(
        "--writer-ceiling", action="store_true", help="(writer) also time Spark's conversion alone and a bare writer"
    )
    ap.add_argument("--background-load", type=int, default=0, metavar="N", help="N CPU-bound processes meanwhile")
    ap.add_argument("--tpch-dir", type=Path, default=Path("data/tpch"))
    ap.add_argument("--work-dir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args()
    args.tpch_dir = args.tpch_dir.resolve()  # the writer part names it in definitions read from another directory
    parts = args.part or ["publish", "history", "scan", "writer", "deletes"]
    results: Results = {"date": dt.date.today().isoformat(), "args": args_doc(args), "loadavg_start": os.getloadavg()}
    started = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="segrep-bench-open-", dir=args.work_dir) as tmp,
        background_load(args.background_load),
    ):
        work = Path(tmp)
        with catalog_url(args.catalog, work / "t") as url, dr_site(args.dr_store, work) as dr_doc:
            if "publish" in parts or "scan" in parts:
                source = demo_data.generate_tpch("orders", args.scale, args.tpch_dir / f"sf{args.scale:g}")
                rows = demo_data.normalized(pq.read_table(source)).sort_by(KEY)
                catalog, defs = make_env(work / "t", url, ["primary", "dr"], TABLE, body(rows), dr_doc)
                try:
                    if "publish" in parts:
                        results["publish"] = bench_publish(rows, catalog, defs, url, work, args)
                    else:
                        write_interleaved(catalog, TABLE, rows, args.batches)
                        run_round(catalog, defs, TABLE, submit=no_spark)
                    if "scan" in parts:
                        results["scan"] = bench_scan(catalog, url, args)
                finally:
                    catalog.dispose()
        if "history" in parts:
            with catalog_url(args.catalog, work / "h") as url:
                results["history"] = bench_history(work / "h", url, args)
        if "deletes" in parts:
            results["deletes"] = bench_deletes(work, args)
        if "writer" in parts:
            (work / "w").mkdir()
            results["writer"] = part_writer(args, work / "w")
    results["loadavg_end"] = os.getloadavg()
    print_table(table_rows(results))
    print(
        load_footer(
            time.perf_counter() - started, args.background_load, results["loadavg_start"], results["loadavg_end"]
        )
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 0


@contextlib.contextmanager
def dr_site(store: str, work: Path) -> Iterator[dict[str, dict[str, Any]] | None]:
    """``dr``'s site definition: a local directory (None), or a prefix of a bucket on a moto S3 server on
    loopback (an object store across a link: each round uploads, each publication writes its metadata there)."""
    if store == "local":
        yield None
        return
    with endpoints(work) as eps:
        yield {"dr": s3_site("a", "open-tables", "dr", eps)}


class catalog_url:
    """A fresh catalog URL: a SQLite file under ``root``, or a scratch PostgreSQL schema."""

    def __init__(self, kind: str, root: Path) -> None:
        self.kind, self.root = kind, root
        self._pg: Any = None

    def __enter__(self) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.kind == "sqlite":
            return f"sqlite:///{self.root}/catalog.db"
        self._pg = pg_schema("bench_open")
        return self._pg.__enter__()[1]

    def __exit__(self, *exc: object) -> None:
        if self._pg is not None:
            self._pg.__exit__(*exc)


if __name__ == "__main__":
    raise SystemExit(main())
