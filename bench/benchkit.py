"""Helpers shared by the benches (bench/rounds.py, bench/failover.py, bench/object_store.py): logging and timing,
a scratch PostgreSQL schema, definitions applied to a fresh catalog, interleaved writes, background load,
profiling, the markdown table, and ``fill_chains``, which builds a large catalog with COPY (bench/rounds.py
(e), bench/failover.py (a)).

Imported as ``benchkit``: a bench run as ``python bench/<name>.py`` has this folder first on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import json
import multiprocessing
import os
import pstats
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import yaml
from sqlalchemy import select, update

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog.apply import apply_definitions
from segrep.catalog.migrate import upgrade
from segrep.config.definitions import Definitions, load_definitions
from segrep.data.writer import WriteResult, write_batch

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
PG_CONNINFO = "postgresql://postgres@127.0.0.1:5432/test"
# TPC-H orders as a table's columns (bench/topologies.py, bench/merge_crossover.py)
ORDERS_COLUMNS = {
    "o_orderkey": "int64",
    "o_custkey": "int64",
    "o_orderstatus": "string",
    "o_totalprice": "decimal(15,2)",
    "o_orderdate": "date",
    "o_orderpriority": "string",
    "o_clerk": "string",
    "o_shippriority": "int32",
    "o_comment": "string",
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def args_doc(args: Any) -> dict[str, Any]:
    """A bench's command-line arguments for its JSON results (paths as text)."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


def load_footer(secs: float, background: int, load_start: Sequence[float], load_end: Sequence[float]) -> str:
    """The line a bench ends with: how long it ran, under how much background load, and the machine's load
    average at its start and end."""
    return (
        f"\nran in {secs:.0f} s with {background} background process(es); load average "
        f"{load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end"
    )


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def evict(paths: Sequence[str | Path]) -> None:
    """Drop the files' clean pages from the page cache (cold-ish: the disk or the host may still cache)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(paths: Sequence[str | Path]) -> None:
    """Read the files through, so that their pages are in the page cache."""
    for p in paths:
        with open(p, "rb") as f:
            while f.read(8 * 1024 * 1024):
                pass


@contextlib.contextmanager
def pg_schema(prefix: str) -> Iterator[tuple[str, str]]:
    """(schema, SQLAlchemy URL with the schema first on the search_path); the schema is dropped afterwards."""
    from sqlalchemy import create_engine, text

    schema = f"{prefix}_{uuid.uuid4().hex[:8]}"
    engine = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield schema, f"{PG_URL}?options=-csearch_path%3D{schema}"
    finally:
        with engine.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()


def make_env(
    root: Path,
    url: str,
    sites: list[str],
    table: str,
    body: dict[str, Any],
    site_docs: dict[str, dict[str, Any]] | None = None,
) -> tuple[Catalog, Definitions]:
    """Definitions (``sites`` in order, the first leading ``table``) applied to a fresh catalog at ``url``; each
    site a local directory unless ``site_docs`` defines it (an object-store site: its uri and options)."""
    root.mkdir(parents=True, exist_ok=True)
    body = {**body, "leader": sites[0], "replicas": sites[1:]}
    docs = site_docs or {}
    doc = {
        "data_dir": "data",
        "sites": {name: {"id": i + 1, **docs.get(name, {"uri": f"sites/{name}"})} for i, name in enumerate(sites)},
        "tables": {table: body},
    }
    config = root / "segrep.yaml"
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    catalog = Catalog(url)
    upgrade(catalog)
    defs = load_definitions(config)
    apply_definitions(catalog, defs)
    return catalog, defs


def write_interleaved(catalog: Catalog, table: str, rows: pa.Table, batches: int) -> list[WriteResult]:
    """Write ``rows`` in ``batches`` interleaved batches: each spans every partition, so each partition gets one
    segment per batch (several segments per partition, as a table written over time has)."""
    return [
        write_batch(catalog, table, rows.take(pa.array(np.arange(k, rows.num_rows, batches)))) for k in range(batches)
    ]


def quantile_splits(rows: pa.Table, key: str, parts: int = 4) -> list[int]:
    """Split points that cut ``rows`` into ``parts`` partitions of about equal size by ``key``."""
    keys = rows.column(key).to_numpy()
    return [int(np.quantile(keys, q / parts)) for q in range(1, parts)]


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def background_load(n: int) -> Iterator[None]:
    """``n`` CPU-bound processes for the duration (a bench's figures under load, as the project asks)."""
    procs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.join()


def profile_top(fn: Callable[..., Any], *args: Any, n: int = 15) -> list[str]:
    """``fn(*args)`` under cProfile: the top ``n`` entries by own time, then by cumulative time."""
    prof = cProfile.Profile()
    prof.enable()
    fn(*args)
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf).strip_dirs()
    stats.sort_stats("tottime").print_stats(n)
    stats.sort_stats("cumulative").print_stats(n)
    return buf.getvalue().splitlines()


def verdict(ok: bool) -> str:
    return "MET" if ok else "**NOT MET**"


def print_table(rows: Sequence[Sequence[str]]) -> None:
    print("| measure | segrep | baseline (same run) | ratio | target | result |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


# -- a large catalog built with COPY -----------------------------------------------------------------------------

# The columns each COPY fills. Left out, so at their defaults: partitions.paused_us (migration 0005; NULL, no
# partition paused by a switchover).
COPY_COLUMNS = {
    "partitions": (
        "partition_id, table_id, begin_key, end_key, state, leader_placement_id, epoch, last_version, "
        "parent_partition_id, created_us"
    ),
    "placements": (
        "placement_id, partition_id, site_id, state, root_segment_id, key_begin, key_end, needs_bootstrap, "
        "created_us, removed_us, settled_entry_id, settled_epoch"
    ),
    "segments": (
        "entry_id, placement_id, segment_id, partition_id, base_segment_id, included_segment_ids, is_major, "
        "row_count, deleted_rows, byte_size, sha256, min_version, max_version, key_min, key_max, origin_site_id, "
        "epoch, schema_fingerprint, relpath, committed_us"
    ),
    "acks": "holder_placement_id, segment_id, target_placement_id, acked_us",
}
MAJOR_EVERY = 16
COPY_BATCH = 50_000  # lines per write to the COPY


def fill_chains(
    catalog: Catalog, schema: str, table: str, *, partitions: int, history: int, new: int
) -> dict[str, int]:
    """Replace the partitions and placements that ``apply_definitions`` made for ``table`` (the catalog's only
    table, at the sites with ids 1, 2 and 3, site 1 leading) with ``partitions`` partitions x 3 placements,
    written with COPY into the PostgreSQL ``schema`` of ``catalog``.

    Every chain holds the same history at the three placements, ``history`` segments summed over the
    partitions (spread evenly), a major every MAJOR_EVERY, each acked both ways between the leader and each
    replica, every placement settled to its last entry. Up to ``new`` partitions, spread evenly, have one more
    segment at the leader that no replica holds (not acked, not settled). The sequences are moved past what the
    COPY wrote, and the schema analysed.

    Returns ``segments`` and ``acks`` (rows written), ``new_segments`` (the leader-only segments written, fewer
    than ``new`` when there are fewer partitions) and ``chain`` (the history segments per partition, at least).
    """
    import psycopg

    with catalog.write() as s:
        info = s.scalars(select(m.Table)).one()
        table_id, fingerprint = info.table_id, info.schema_fingerprint
        s.execute(update(m.Partition).values(leader_placement_id=None))
        s.execute(m.Placement.__table__.delete())
        s.execute(m.Partition.__table__.delete())

    per, extra = divmod(history, partitions)
    new_every = max(partitions // max(new, 1), 1)
    now = time.time_ns() // 1000
    t0 = now - 30 * 86400 * 1_000_000
    step = max((now - 60_000_000 - t0) // (per + 2), 1)
    width = 600
    lines: dict[str, list[str]] = {name: [] for name in COPY_COLUMNS}
    part_lines, pl_lines, seg_lines, ack_lines = (lines[name] for name in COPY_COLUMNS)
    entry = new_count = 0
    for p in range(partitions):
        pid = p + 1
        leader, r1, r2 = 3 * p + 1, 3 * p + 2, 3 * p + 3
        begin = "\\N" if p == 0 else str(p * width)
        end = "\\N" if p == partitions - 1 else str((p + 1) * width)
        n = per + (1 if p < extra else 0)
        ids = [f"{pid:012x}{k:08x}{'0' * 12}" for k in range(n)]
        has_new = p % new_every == 0 and new_count < new
        new_count += has_new
        new_id = f"{pid:012x}{n:08x}{'f' * 12}" if has_new else None
        part_lines.append(f"{pid}\t{table_id}\t{begin}\t{end}\tLIVE\t\\N\t1\t{t0 + (n + 1) * step}\t\\N\t{t0}\n")
        roots = {leader: new_id or ids[-1], r1: ids[-1], r2: ids[-1]}
        for pl, site in ((leader, 1), (r1, 2), (r2, 3)):
            chain = [*ids, new_id] if (pl == leader and new_id) else ids
            settled = 0  # as the commit step of earlier rounds left it: the history is acked everywhere
            for k, sid in enumerate(chain):
                entry += 1
                settled = entry if sid != new_id else settled
                major = k % MAJOR_EVERY == 0
                base = "\\N" if k == 0 else chain[k - 1]
                included = json.dumps(chain[max(k - MAJOR_EVERY + 1, 0) : k]) if major and k else "[]"
                committed = now - 60_000_000 if sid == new_id else t0 + k * step + (0 if pl == leader else 1000)
                version = committed - 500
                seg_lines.append(
                    f"{entry}\t{pl}\t{sid}\t{pid}\t{base}\t{included}\t{'t' if major else 'f'}\t10000\t0\t1000000\t"
                    f"{'0' * 64}\t{version - 1000}\t{version}\t\\N\t\\N\t1\t1\t{fingerprint}\t"
                    f"{table}/{pid}/{sid}.parquet\t{committed}\n"
                )
            pl_lines.append(f"{pl}\t{pid}\t{site}\tLIVE\t{roots[pl]}\t\\N\t\\N\tf\t{t0}\t\\N\t{settled}\t1\n")
        for sid in ids:
            for holder, target in ((leader, r1), (leader, r2), (r1, leader), (r2, leader)):
                ack_lines.append(f"{holder}\t{sid}\t{target}\t{now - 1000}\n")

    with psycopg.connect(PG_CONNINFO, options=f"-csearch_path={schema}") as conn, conn.cursor() as cur:
        for name, cols in COPY_COLUMNS.items():
            with cur.copy(f"COPY {name} ({cols}) FROM STDIN") as copy:
                for off in range(0, len(lines[name]), COPY_BATCH):
                    copy.write("".join(lines[name][off : off + COPY_BATCH]))
        cur.execute("UPDATE partitions SET leader_placement_id = 3 * partition_id - 2")
        for name, col in (("partitions", "partition_id"), ("placements", "placement_id"), ("segments", "entry_id")):
            cur.execute(f"SELECT setval(pg_get_serial_sequence('{name}', '{col}'), (SELECT max({col}) FROM {name}))")
        conn.commit()
        conn.autocommit = True
        cur.execute("ANALYZE")
    return {"segments": len(seg_lines), "acks": len(ack_lines), "new_segments": new_count, "chain": per}
