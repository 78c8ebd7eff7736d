"""Benchmark: fast-forward between stores (issue 13 item 6), each path against a plain copy of the same files
between the same stores in the same run.

Run by hand (`python bench/object_store.py --scale 1`, or `make bench-object-store`); prints a markdown table
with each target and MET / NOT MET, and with ``--json PATH`` writes the figures there. TPC-H ``lineitem`` comes
from tpchgen-cli (cached in ``--tpch-dir``/sf<scale>) and is written through ``write_batch`` into a local leader
in ``--batches`` interleaved batches over 4 partitions (40 segments by default). Two S3-compatible servers run
on loopback (moto, ``tests.support.s3``), each with its own credentials: endpoint ``a`` and endpoint ``b``.

Every measured copy is a real round (``run_round(target=...)``) to an empty target site, which copies and
verifies every byte before registering a segment (size and a checksum against the catalog: the CRC-64/NVME of a
local copy, the one the store computes of a server-side copy, the sha256 of a streamed upload, checked by the
store too); the bench checks the round's report (every segment fast-forwarded, nothing invalid, no Spark
application) and, outside the timing, the copies again with ``Site.verify``. The paths and their baselines:

- local → local: ``cp`` of the segment files then ``sync`` of the copies (the same durability as segrep's
  fsyncs); cold-ish (source pages evicted) and warm page cache. Shown beside it, not the target's baseline:
  ``cp``, then the sha256 of the copies (``openssl dgst``, two processes) while ``sync`` runs, checked against
  the catalog: the same durability and a check before use by the catalog's sha256 (segrep checks a local
  copy by the CRC-64/NVME its writer recorded, which costs a seventh of the CPU);
- local → S3 (endpoint a), S3 → S3 on one endpoint (a to another bucket of a, same credentials: segrep copies
  server-side), S3 → S3 across endpoints (a → b, other credentials), S3 → local: ``pyarrow.fs.copy_files`` of
  the table's directory between the same file systems (for S3 → local, ``sync`` of the copies is shown beside
  it). The S3 paths read from an S3 leader: a site on endpoint a filled by one unmeasured round, after which
  leadership moves to it in the catalog.

Each path has a catalog (SQLite) and definitions of its own holding only the sites it uses: the leader, the S3
leader for paths from S3, and one target site. Every measurement starts from the same state, the table written
and the target empty: the catalog as it was after the writes is restored (SQLite's backup API) and the target's
files are deleted. (Until 2026-11-27 each measurement had a target site of its own in one table, so a round to
the sixth target also planned, checkpointed and computed safe times for five more replicas: work a round to one
replica of a table does not do.) Each repeat runs segrep and the baseline back to back, in an order drawn from
``--seed``; medians are reported. Before each copy ``os.sync()`` runs; after each measurement both copies are
deleted (moto keeps objects in memory).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import yaml
from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support (the moto servers)

from benchkit import args_doc, background_load, evict, load_footer, log, quantile_splits, timed, warm, write_interleaved

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog.apply import apply_definitions
from segrep.catalog.migrate import upgrade
from segrep.config.definitions import Definitions, load_definitions
from segrep.data import demo as demo_data
from segrep.replication.orchestrator import run_round
from segrep.storage.identity import marker_path
from segrep.storage.site import Site
from tests.support.s3 import S3Endpoint, start_s3_endpoints

TABLE = "lineitem"
PK = ["l_orderkey", "l_linenumber"]
LEADER, S3_LEADER, TARGET = "primary", "lead", "t"
ENV_PREFIX = {"a": "BENCH_A_S3", "b": "BENCH_B_S3"}


@dataclass(frozen=True)
class Route:
    """One measured path: where the leader is, where the target site lives, and the ratio aimed at."""

    key: str
    label: str
    source: str  # "local" or "s3"
    target: str  # "local", "a" (endpoint a, bucket segrep-a), "a2" (endpoint a, bucket segrep-b), "b"
    goal: float
    baseline: str  # what the baseline is called in the table


ROUTES = (
    Route("local_local", "local → local", "local", "local", 0.9, "cp + sync"),
    Route("local_s3", "local → S3", "local", "a", 0.8, "copy_files"),
    Route("s3_s3_same", "S3 → S3, same endpoint", "s3", "a2", 0.8, "copy_files"),
    Route("s3_s3_across", "S3 → S3, across endpoints", "s3", "b", 0.8, "copy_files"),
    Route("s3_local", "S3 → local", "s3", "local", 0.8, "copy_files"),
)
_BUCKET = {"a": ("a", "segrep-a"), "a2": ("a", "segrep-b"), "b": ("b", "segrep-a")}


@dataclass
class Samples:
    """One route's (and page-cache state's) timings, seconds per repeat."""

    route: str
    cache: str
    segrep_s: list[float] = field(default_factory=list)  # the whole round: plan, copy, commit
    segrep_cpu_s: list[float] = field(default_factory=list)  # this process's CPU time (every thread) in the round
    copy_step_s: list[float] = field(default_factory=list)  # the target's fast-forward alone
    baseline_s: list[float] = field(default_factory=list)
    baseline_cpu_s: list[float] = field(default_factory=list)  # its CPU time (this process's, or cp's and sync's)
    baseline_sync_s: list[float] = field(default_factory=list)  # S3 → local: copy_files, then sync
    # local → local: cp, then the sha256 of the copies (two at a time) beside sync: a verified copy by sha256
    verified_s: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Figures:
    """Medians of one Samples, as MB/s and the ratio to the baseline."""

    route: str
    cache: str
    segrep_MBps: float
    copy_step_MBps: float
    baseline_MBps: float
    baseline_sync_MBps: float | None
    ratio: float
    goal: float
    verified_MBps: float | None = None
    verified_ratio: float | None = None
    segrep_cpu_s_per_GB: float | None = None
    baseline_cpu_s_per_GB: float | None = None

    @property
    def met(self) -> bool:
        return self.ratio >= self.goal


@dataclass
class World:
    """One route's catalog, definitions and stores: the leader holds the table, the target is empty; ``pristine``
    is a copy of the catalog in that state, restored before each measurement."""

    route: Route
    work: Path
    prefix: str  # this route's key prefix in the buckets
    catalog: Catalog
    defs: Definitions
    sha256: dict[str, str]  # the leader's segment files: relpath -> the catalog's sha256
    total_bytes: int
    fs_of: dict[str, pafs.FileSystem]  # endpoint -> its file system, opened as segrep opens a site there
    pristine: Path

    @property
    def relpaths(self) -> list[str]:
        return list(self.sha256)


# -- set-up ------------------------------------------------------------------------------------------------------


def s3_site(where: str, prefix: str, name: str, eps: dict[str, S3Endpoint]) -> dict[str, Any]:
    endpoint, bucket = _BUCKET[where]
    ep = eps[endpoint]
    return {
        "uri": f"s3://{bucket}/{prefix}/{name}",
        "storage_options": {"endpoint": ep.url, "region": ep.region, "retries": 3},
        "credentials": {"env_prefix": ENV_PREFIX[endpoint]},
    }


def definitions_doc(route: Route, source: Path, splits: list[int], prefix: str, eps: dict[str, S3Endpoint]) -> Any:
    """The table with only the sites this route needs (a table has a few sites: the catalog's per-round work,
    checkpoints and safe times, grows with them)."""
    sites: dict[str, Any] = {LEADER: {"uri": f"sites/{LEADER}"}}
    if route.source == "s3":
        sites[S3_LEADER] = s3_site("a", prefix, S3_LEADER, eps)
    for name in (TARGET,):
        sites[name] = {"uri": f"sites/{name}"} if route.target == "local" else s3_site(route.target, prefix, name, eps)
    for n, doc in enumerate(sites.values(), start=1):
        doc["id"] = n
    table = {
        "schema_from": str(source),
        "primary_key": PK,
        "partition_key": "l_orderkey",
        "split_points": splits,
        "leader": LEADER,
        "replicas": [s for s in sites if s != LEADER],
        "policy": {"retry_delay_s": 0},
    }
    return {"data_dir": "data", "sites": sites, "tables": {TABLE: table}}


def build_world(
    route: Route, work: Path, source: Path, rows: pa.Table, eps: dict[str, S3Endpoint], args: argparse.Namespace
) -> World:
    """Catalog and definitions, then lineitem written at the local leader in ``--batches`` batches; for a route
    from S3, one unmeasured round fills the S3 leader and leadership moves to it."""
    prefix = f"bench-{random.Random(args.seed).getrandbits(32):08x}/{route.key}"
    root = work / route.key
    root.mkdir()
    config = root / "segrep.yaml"
    doc = definitions_doc(route, source, quantile_splits(rows, "l_orderkey"), prefix, eps)
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    catalog = Catalog(f"sqlite:///{root}/catalog.db")
    upgrade(catalog)
    defs = load_definitions(config)
    apply_definitions(catalog, defs)
    _, write_s = timed(write_interleaved, catalog, TABLE, rows, args.batches)
    with catalog.read() as s:
        leaders = select(m.Partition.leader_placement_id)
        segs = list(s.scalars(select(m.Segment).where(m.Segment.placement_id.in_(leaders))))
    total = sum(seg.byte_size for seg in segs)
    fs_of = {e: Site(n, defs.site(n).uri).fs for e, n in _sites_per_endpoint(route).items()}
    sha256 = {seg.relpath: seg.sha256 for seg in segs}
    world = World(route, root, prefix, catalog, defs, sha256, total, fs_of, root / "catalog-pristine.db")
    log(f"{route.label}: {len(segs)} segments, {total / 1e6:.0f} MB, {rows.num_rows:,} rows written in {write_s:.1f} s")
    if route.source == "s3":
        segrep_copy(world, S3_LEADER)  # (not measured)
        set_leader(catalog, S3_LEADER)
        log(f"{route.label}: the S3 leader holds the table (one round, not measured) and leads")
    copy_catalog(root / "catalog.db", world.pristine)
    return world


def copy_catalog(source: Path, dest: Path) -> None:
    """A consistent copy of a SQLite catalog (WAL included) over ``dest``, by SQLite's backup API."""
    with contextlib.closing(sqlite3.connect(source)) as src, contextlib.closing(sqlite3.connect(dest)) as dst:
        src.backup(dst)


def restore_catalog(world: World) -> None:
    """The catalog as it was once the table was written: no round to the target has happened."""
    world.catalog.dispose()  # no connection of the engine survives the restore
    copy_catalog(world.pristine, world.work / "catalog.db")


def _sites_per_endpoint(route: Route) -> dict[str, str]:
    """A site on each endpoint this route uses (its file system is the baseline's)."""
    out = {"a": S3_LEADER} if route.source == "s3" else {}
    if route.target != "local":
        out.setdefault(_BUCKET[route.target][0], TARGET)
    return out


def caches_of(route: Route) -> tuple[str, ...]:
    """Local → local in a cold-ish and a warm page cache; the others read from a store or a warm cache."""
    return ("cold", "warm") if route.key == "local_local" else ("warm",)


def set_leader(catalog: Catalog, site: str) -> None:
    """Move every partition's leadership to ``site`` (a new epoch), as an operator would."""
    with catalog.write() as s:
        site_id = s.scalars(select(m.Site.site_id).where(m.Site.name == site)).one()
        for part in s.scalars(select(m.Partition)):
            pl = s.scalars(
                select(m.Placement).where(m.Placement.partition_id == part.partition_id, m.Placement.site_id == site_id)
            ).one()
            part.leader_placement_id = pl.placement_id
            part.epoch += 1


# -- one measurement -----------------------------------------------------------------------------------------------


def site(world: World, name: str) -> Site:
    return Site(name, world.defs.site(name).uri)


def segrep_copy(world: World, target: str) -> tuple[float, float, float]:
    """One round to ``target``; (whole round s, copy step s, CPU s of this process, every thread). Refuses a
    round that did not copy everything."""
    cpu = time.process_time()
    report, secs = timed(run_round, world.catalog, world.defs, TABLE, target=target)
    cpu = time.process_time() - cpu
    tr = report.targets[target]
    if tr.status != "ok" or tr.segments_copied != len(world.relpaths) or tr.invalid or report.spark_apps:
        raise SystemExit(f"round to {target} did not fast-forward everything: {tr}")
    return secs, tr.seconds, cpu


def check_copies(world: World, target: str) -> None:
    """Every copy against the catalog's size and sha256, read back (outside the timing)."""
    dest = site(world, target)
    with world.catalog.read() as s:
        segs = list(
            s.scalars(
                select(m.Segment)
                .join(m.Placement)
                .join(m.Site, m.Site.site_id == m.Placement.site_id)
                .where(m.Site.name == target)
            )
        )
    for seg in segs:
        dest.verify(seg.relpath, seg.byte_size, seg.sha256)
    if len(segs) != len(world.relpaths):
        raise SystemExit(f"{target} holds {len(segs)} segments, not {len(world.relpaths)}")


def cp_sync(files: Sequence[str], dest: Path) -> tuple[float, float]:
    """(cp s, cp + sync s) of ``files`` into ``dest``."""
    dest.mkdir(parents=True)
    _, cp_s = timed(subprocess.run, ["cp", "--", *files, str(dest)], check=True)
    _, sync_s = timed(subprocess.run, ["sync", "--", *map(str, dest.iterdir())], check=True)
    return cp_s, cp_s + sync_s


# The fastest sha256 at hand: OpenSSL's uses the CPU's SHA extensions (about 1.3 GB/s here), coreutils' does
# not (0.35 GB/s): a baseline hashing with the slow one would flatter segrep
SHA256_TOOL = ["openssl", "dgst", "-sha256", "-r"] if shutil.which("openssl") else ["sha256sum", "--"]


def cp_verify_sync(files: Sequence[str], dest: Path, expected: dict[str, str]) -> float:
    """Seconds for ``cp`` of ``files`` into ``dest``, then the sha256 of the copies (``SHA256_TOOL``, two
    processes, one per core) while ``sync`` writes them back: segrep's durability, and a check before use by
    the catalog's sha256. Refuses a copy whose sha256 is not ``expected`` (file name -> sha256)."""
    dest.mkdir(parents=True)
    start = time.perf_counter()
    subprocess.run(["cp", "--", *files, str(dest)], check=True)
    copies = sorted(str(p) for p in dest.iterdir())
    sync = subprocess.Popen(["sync", "--", *copies])
    sums = [subprocess.Popen([*SHA256_TOOL, *half], stdout=subprocess.PIPE) for half in (copies[::2], copies[1::2])]
    lines = [line for p in sums for line in p.communicate()[0].decode().splitlines()]
    if sync.wait() or any(p.returncode for p in sums):
        raise SystemExit("cp + sha256 + sync failed")
    secs = time.perf_counter() - start
    got = {Path(path.lstrip("*")).name: digest for digest, path in (line.split(maxsplit=1) for line in lines)}
    if got != expected:
        raise SystemExit(f"cp + sha256: the copies in {dest} do not match the catalog")
    return secs


def copy_files(src: Site, dst_fs: pafs.FileSystem, dst_root: str) -> float:
    """pyarrow.fs.copy_files of the table's directory (every segment file) to ``dst_root``."""
    _, secs = timed(
        pafs.copy_files,
        src.path(TABLE),
        f"{dst_root.rstrip('/')}/{TABLE}",
        source_filesystem=src.fs,
        destination_filesystem=dst_fs,
    )
    return secs


def sync_tree(root: Path) -> float:
    files = [str(p) for p in root.rglob("*") if p.is_file()]
    _, secs = timed(subprocess.run, ["sync", "--", *files], check=True)
    return secs


def _cpu_with_children() -> float:
    """CPU seconds of this process (every thread) and of its waited-for children (cp, sync), user and system;
    the moto servers are not waited for, so their CPU is in neither side's figure."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def baseline(world: World, n: int, sample: Samples, source: Site) -> None:
    """The baseline copy of measurement ``n``: into a directory or prefix of its own beside the targets'."""
    route = world.route
    if route.key == "local_local":
        _, both = cp_sync([source.path(r) for r in world.relpaths], world.work / f"cp-{n}")
        sample.baseline_s.append(both)
    elif route.target == "local":
        dest = world.work / f"copy-{n}"
        secs = copy_files(source, pafs.LocalFileSystem(), str(dest))
        sample.baseline_s.append(secs)
        sample.baseline_sync_s.append(secs + sync_tree(dest))
    else:
        sample.baseline_s.append(copy_files(source, world.fs_of[_BUCKET[route.target][0]], baseline_root(world, n)))


def baseline_root(world: World, n: int) -> str:
    return f"{_BUCKET[world.route.target][1]}/{world.prefix}/copy-{n}"


def clean(world: World, target: str, n: int) -> None:
    """Delete this measurement's copies (segrep's and the baseline's): moto holds objects in memory."""
    dest = site(world, target)
    marker = marker_path(dest.root)  # the site's identity marker stays: without it the next round finds it DOWN
    with dest.fs.open_input_stream(marker) as f:
        identity = f.read()
    if world.route.target == "local":
        for d in (Path(dest.root), world.work / f"cp-{n}", world.work / f"cpv-{n}", world.work / f"copy-{n}"):
            shutil.rmtree(d, ignore_errors=True)
        Path(dest.root).mkdir(parents=True)
    else:
        dest.fs.delete_dir_contents(dest.root, missing_dir_ok=True)
        world.fs_of[_BUCKET[world.route.target][0]].delete_dir_contents(baseline_root(world, n), missing_dir_ok=True)
    with dest.fs.open_output_stream(marker) as out:
        out.write(identity)


def measure(world: World, n: int, cache: str, sample: Samples, first: str, check: bool) -> None:
    """Segrep and the baseline, in the order given, into fresh places; then the check and the clean-up."""
    target = TARGET
    restore_catalog(world)
    source = site(world, LEADER if world.route.source == "local" else S3_LEADER)
    files = [source.path(r) for r in world.relpaths] if world.route.source == "local" else []
    verified = ("verified",) if world.route.key == "local_local" else ()
    for who in (first, "baseline" if first == "segrep" else "segrep", *verified):
        os.sync()
        (evict if cache == "cold" else warm)(files)
        if who == "segrep":
            whole, step, cpu = segrep_copy(world, target)
            sample.segrep_s.append(whole)
            sample.segrep_cpu_s.append(cpu)
            sample.copy_step_s.append(step)
        elif who == "verified":
            expected = {Path(r).name: world.sha256[r] for r in world.relpaths}
            sample.verified_s.append(cp_verify_sync(files, world.work / f"cpv-{n}", expected))
        else:
            before = _cpu_with_children()
            baseline(world, n, sample, source)
            sample.baseline_cpu_s.append(_cpu_with_children() - before)
    if check:
        check_copies(world, target)
    clean(world, target, n)


# -- the run -------------------------------------------------------------------------------------------------------


def run_route(world: World, args: argparse.Namespace, rng: random.Random) -> list[Samples]:
    route = world.route
    caches = caches_of(route)
    samples = {cache: Samples(route.key, cache) for cache in caches}
    for rep in range(args.repeats):
        for c, cache in enumerate(caches):
            sample = samples[cache]
            measure(world, rep * len(caches) + c, cache, sample, rng.choice(("segrep", "baseline")), args.check)
            log(
                f"{route.label} ({cache}) repeat {rep + 1}: segrep {sample.segrep_s[-1]:.2f} s "
                f"(copy step {sample.copy_step_s[-1]:.2f}), {route.baseline} {sample.baseline_s[-1]:.2f} s"
            )
    return list(samples.values())


def run_all(
    work: Path, source: Path, eps: dict[str, S3Endpoint], args: argparse.Namespace
) -> tuple[list[Samples], int, int]:
    """Every route asked for, each in a world of its own; (samples, segments, bytes)."""
    rows = demo_data.normalized(pq.read_table(source)).sort_by([(k, "ascending") for k in PK])
    rng = random.Random(args.seed)
    samples: list[Samples] = []
    shape = (0, 0)
    for route in (r for r in ROUTES if r.key in args.routes):
        world = build_world(route, work, source, rows, eps, args)
        try:
            samples += run_route(world, args, rng)
        finally:
            if route.source == "s3":
                lead = site(world, S3_LEADER)
                lead.fs.delete_dir_contents(lead.root, missing_dir_ok=True)
            world.catalog.dispose()
            shutil.rmtree(world.work / "data", ignore_errors=True)
        shape = (len(world.relpaths), world.total_bytes)
    return samples, *shape


def figures(sample: Samples, total_bytes: int) -> Figures:
    route = next(r for r in ROUTES if r.key == sample.route)

    def mbps(values: list[float]) -> float:
        return total_bytes / statistics.median(values) / 1e6

    sync = mbps(sample.baseline_sync_s) if sample.baseline_sync_s else None
    ratio = statistics.median(sample.baseline_s) / statistics.median(sample.segrep_s)
    verified = statistics.median(sample.verified_s) / statistics.median(sample.segrep_s) if sample.verified_s else None

    def cpu_per_gb(values: list[float]) -> float | None:
        return statistics.median(values) / (total_bytes / 1e9) if values else None

    return Figures(
        sample.route,
        sample.cache,
        mbps(sample.segrep_s),
        mbps(sample.copy_step_s),
        mbps(sample.baseline_s),
        sync,
        ratio,
        route.goal,
        mbps(sample.verified_s) if sample.verified_s else None,
        verified,
        cpu_per_gb(sample.segrep_cpu_s),
        cpu_per_gb(sample.baseline_cpu_s),
    )


def print_table(figs: list[Figures], segments: int, total_bytes: int) -> None:
    print(f"\nTPC-H lineitem, {segments} segments, {total_bytes / 1e6:,.0f} MB; medians\n")
    print(
        "| path | segrep: whole round (copy step), MB/s | baseline (same run), MB/s | ratio | target | result "
        "| CPU s/GB: segrep, baseline |"
    )
    print("|---|---|---|---|---|---|---|")
    for f in figs:
        route = next(r for r in ROUTES if r.key == f.route)
        label = (
            f"{route.label}, {f.cache}{'-ish' if f.cache == 'cold' else ''} cache"
            if len(caches_of(route)) > 1
            else route.label
        )
        base = f"{route.baseline} {f.baseline_MBps:,.0f}"
        if f.baseline_sync_MBps is not None:
            base += f" (+ sync {f.baseline_sync_MBps:,.0f})"
        if f.verified_MBps is not None:  # not the target's baseline: what the same check costs cp
            base += f"; cp + sha256 + sync {f.verified_MBps:,.0f} (ratio {f.verified_ratio:.2f})"
        cpu = f"{f.segrep_cpu_s_per_GB or 0:.2f}, {f.baseline_cpu_s_per_GB or 0:.2f}"
        print(
            f"| {label} | {f.segrep_MBps:,.0f} ({f.copy_step_MBps:,.0f}) | {base} | {f.ratio:.2f} | "
            f"≥ {f.goal} | {'MET' if f.met else '**NOT MET**'} | {cpu} |"
        )


@contextlib.contextmanager
def endpoints(work: Path) -> Iterator[dict[str, S3Endpoint]]:
    """The two moto servers, each site's keys in the environment under its endpoint's prefix."""
    (work / "moto").mkdir()
    with contextlib.contextmanager(start_s3_endpoints)(work / "moto") as (a, b):
        eps = {"a": a, "b": b}
        for name, ep in eps.items():
            os.environ.update(ep.env(ENV_PREFIX[name]))
        yield eps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (1 = 6M lineitem rows)")
    ap.add_argument("--batches", type=int, default=10, help="write batches (= segments per partition, 4 partitions)")
    ap.add_argument("--repeats", type=int, default=5, help="measurements per path (medians reported)")
    ap.add_argument("--seed", type=int, default=13, help="draws who goes first in each measurement, and the run's key")
    ap.add_argument("--routes", nargs="+", choices=[r.key for r in ROUTES], default=[r.key for r in ROUTES])
    ap.add_argument("--no-check", dest="check", action="store_false", help="skip re-reading the copies afterwards")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    ap.add_argument("--tpch-dir", type=Path, default=Path("data/tpch"))
    ap.add_argument("--work-dir", type=Path, default=None, help="parent of the scratch directory (default: /tmp)")
    ap.add_argument("--background-load", type=int, default=0, metavar="N", help="N CPU-bound processes meanwhile")
    args = ap.parse_args()

    source = demo_data.generate_tpch("lineitem", args.scale, args.tpch_dir / f"sf{args.scale:g}").resolve()
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="segrep-bench-os-", dir=args.work_dir) as tmp:
        work = Path(tmp)
        with endpoints(work) as eps, background_load(args.background_load):
            (samples, segments, total), secs = timed(run_all, work, source, eps, args)
    figs = [figures(s, total) for s in samples]
    print_table(figs, segments, total)
    load_end = os.getloadavg()
    print(load_footer(secs, args.background_load, load_start, load_end))
    if args.json:
        doc = {
            "date": dt.datetime.now().isoformat(timespec="seconds"),
            "args": args_doc(args),
            "segments": segments,
            "bytes": total,
            "loadavg": [load_start, load_end],
            "figures": [asdict(f) | {"met": f.met} for f in figs],
            "samples": [asdict(s) for s in samples],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        log(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
