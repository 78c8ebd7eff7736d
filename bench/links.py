"""Benchmark: links between sites (issue 36 item 5): a cap holds across every copier, a round keeps its RPO
beside a bootstrap, a window change reaches running copies, and a defined but unlimited link costs nothing.

Run by hand (`python bench/links.py`, or `make bench-links`); prints a markdown table with each target and MET /
NOT MET, and with ``--json PATH`` writes the figures there. Each measurement runs on loopback for a pair of local
sites and for the two-endpoint S3 pair (moto, ``tests.support.s3``: primary on endpoint a, dr and edge on
endpoint b; ``--skip-s3`` leaves it out). Three tables of incompressible rows (about 1 kB each) are written at
primary: ``hot`` (2 x ``--mb``, replicated to dr, ``rpo: 30s``), ``cold`` (2 x ``--mb``, replicated to edge,
bootstrapped onto dr) and ``scrub`` (``--mb``, scrubbed from dr). The S3 pair uses ``--s3-cap`` and sizes scaled
by it, so that its runs last as long as the local ones.

What crosses a link is recorded where it is paid: every ``Pacer.consume`` of a link lease's pacer (a probe
wraps ``LinkLease`` and ``Pacer.consume``), with the lease's class. The measures:

1. cap: a round of ``hot``, a bootstrap of ``cold`` onto dr and a scrub of ``scrub``'s files at primary read
   from dr (``verify(files=True, reader="dr")``) run together under a cap C on primary -> dr. The aggregate
   rate over every sliding 10 s window stays at or below C + 10 %, and at or above C - 10 % over the windows
   while all three send;
2. RPO: rounds of ``hot`` every ``--round-every`` seconds, each after a new write, while ``cold`` is
   bootstrapped onto dr under the cap; the lag (now - dr's safe time) after each round and the most any write
   waited (a round's end - the previous round's safe time) stay within the table's RPO;
3. window: a round of ``cold`` to edge under the definitions' link primary -> edge (cap C, a Saturday window of
   C / 4), the definitions' clock moved into the window and out again while it copies; from each change until
   the rate paid over 2 s (all of it after the change: the figure is never below 2 s) is within 10 % of the
   new cap: at most 5 s;
4. unlimited: a round of each table to its empty replica (hot to dr, cold and scrub to edge), one after the
   other, with no link vs with a link defined but unlimited on every pair (unlimited for now: no slot is taken,
   the limits are looked up per file), ``--repeats`` each in alternating order after an unmeasured warm-up:
   medians within 5 %.

Every scenario starts from the tables written and the replicas empty: the SQLite catalog is restored (backup
API) and dr's and edge's files are deleted (their identity markers kept).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support (the moto servers)

from benchkit import args_doc, background_load, load_footer, log, timed, verdict
from object_store import ENV_PREFIX, copy_catalog, endpoints

from segrep.catalog import Catalog
from segrep.catalog import link_slots as lk
from segrep.catalog.apply import apply_definitions
from segrep.catalog.link_lease import LinkLease, LinkLimits, unlimited
from segrep.catalog.link_limits import definitions_limits
from segrep.catalog.migrate import upgrade
from segrep.config.definitions import Definitions, load_definitions
from segrep.core import hlc
from segrep.core.links import CopyPriority
from segrep.data.writer import write_batch
from segrep.maintenance.bootstrap import bootstrap
from segrep.maintenance.verify import verify
from segrep.replication.join import catch_up, target_state
from segrep.replication.orchestrator import run_round
from segrep.replication.reports import RoundReport, RoundStatus
from segrep.storage.identity import marker_path
from segrep.storage.pacing import Pacer
from segrep.storage.site import Site
from tests.support.s3 import S3Endpoint

MiB = 1024 * 1024
ROW_BYTES = 1000  # a row's payload: 500 random bytes as hex
FRIDAY = dt.datetime(2026, 11, 27, 12, tzinfo=dt.UTC)  # outside the window
SATURDAY = dt.datetime(2026, 11, 28, 12, tzinfo=dt.UTC)  # inside it
REPLICAS = ("dr", "edge")


def never_spark(*args: Any, **kwargs: Any) -> None:
    raise SystemExit(f"Spark was launched although the policy keeps every copy in process: {args}")


# -- what crosses the links ----------------------------------------------------------------------------------------


@dataclass
class Probe:
    """Every chunk a link lease's pacer paid for: (monotonic time, class, bytes)."""

    sent: list[tuple[float, CopyPriority, int]] = field(default_factory=list)
    leases: dict[int, tuple[Pacer, CopyPriority]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @contextlib.contextmanager
    def installed(self) -> Iterator[Probe]:
        init, consume = LinkLease.__init__, Pacer.consume

        def lease_init(lease: LinkLease, *args: Any, **kwargs: Any) -> None:
            init(lease, *args, **kwargs)
            with self.lock:
                self.leases[id(lease.pacer)] = (lease.pacer, lease.what)  # the pacer kept: its id stays its own

        def paid(pacer: Pacer, n: int) -> None:
            consume(pacer, n)
            held = self.leases.get(id(pacer))
            if held is not None and held[0] is pacer:
                with self.lock:
                    self.sent.append((time.monotonic(), held[1], n))

        LinkLease.__init__ = lease_init  # type: ignore[method-assign,assignment]
        Pacer.consume = paid  # type: ignore[method-assign,assignment]
        try:
            yield self
        finally:
            LinkLease.__init__ = init  # type: ignore[method-assign]
            Pacer.consume = consume  # type: ignore[method-assign]

    def chunks(self, what: CopyPriority | None = None) -> list[tuple[float, int]]:
        with self.lock:
            return sorted((t, n) for t, w, n in self.sent if what is None or w == what)


def windows(chunks: list[tuple[float, int]], span: float) -> list[tuple[float, float, float]]:
    """(start, end, bytes/s) of every window from one chunk to the first at least ``span`` later: the bytes
    paid after the first chunk up to the last, over the time between them."""
    times = [t for t, _ in chunks]
    sums = list(accumulate((n for _, n in chunks), initial=0))
    out = []
    for i, t0 in enumerate(times):
        j = bisect.bisect_left(times, t0 + span)
        if j >= len(times):
            break
        out.append((t0, times[j], (sums[j + 1] - sums[i + 1]) / (times[j] - t0)))
    return out


# -- the world -------------------------------------------------------------------------------------------------------


@dataclass
class World:
    """One site pair's catalog, definitions and sites; ``pristine``: the catalog once the tables were written."""

    kind: str  # "local" or "s3"
    root: Path
    catalog: Catalog
    config: Path
    doc: dict[str, Any]
    cap: int
    sizes: dict[str, int]  # table -> bytes at primary
    pristine: Path

    @property
    def defs(self) -> Definitions:
        return load_definitions(self.config)

    def site(self, name: str) -> Site:
        return Site(name, self.defs.site(name).uri)


def definitions_doc(kind: str, cap: int, eps: dict[str, S3Endpoint], prefix: str) -> dict[str, Any]:
    def where(name: str, endpoint: str) -> dict[str, Any]:
        if kind == "local":
            return {"uri": f"sites/{name}"}
        ep = eps[endpoint]
        return {
            "uri": f"s3://segrep-a/{prefix}/{name}",
            "storage_options": {"endpoint": ep.url, "region": ep.region, "retries": 3},
            "credentials": {"env_prefix": ENV_PREFIX[endpoint]},
        }

    sites = {"primary": where("primary", "a"), "dr": where("dr", "b"), "edge": where("edge", "b")}
    for n, body in enumerate(sites.values(), start=1):
        body["id"] = n
    policy = {"retry_delay_s": 0, "spark_copy_threshold_bytes": 2**40}

    def table(replicas: list[str], **extra: Any) -> dict[str, Any]:
        return {
            "columns": {"k": "int64", "v": "string"},
            "primary_key": ["k"],
            "leader": "primary",
            "replicas": replicas,
            "policy": {**policy, **extra},
        }

    window = {"days": "sat", "from": "00:00", "to": "24:00", "max_bytes_per_second": cap // 4}
    return {
        "data_dir": "data",
        "sites": sites,
        "tables": {"hot": table(["dr"], rpo="30s"), "cold": table(["edge"]), "scrub": table(["edge"])},
        "links": [{"from": "primary", "to": "edge", "max_bytes_per_second": cap, "windows": [window]}],
    }


def rows(first: int, n: int, rng: np.random.Generator) -> pa.Table:
    payload = rng.bytes(n * ROW_BYTES // 2)
    values = [payload[i * ROW_BYTES // 2 : (i + 1) * ROW_BYTES // 2].hex() for i in range(n)]
    return pa.table({"k": pa.array(range(first, first + n), pa.int64()), "v": values})


def write_table(catalog: Catalog, table: str, nbytes: int, rng: np.random.Generator, segment_bytes: int) -> None:
    """About ``nbytes`` of rows in segments of about ``segment_bytes``."""
    n, per = max(nbytes // ROW_BYTES, 1), max(segment_bytes // ROW_BYTES, 1)
    for first in range(0, n, per):
        write_batch(catalog, table, rows(first, min(per, n - first), rng))


def tree_bytes(site: Site, path: str) -> int:
    infos = site.fs.get_file_info(pafs.FileSelector(site.path(path), recursive=True, allow_not_found=True))
    return sum(i.size or 0 for i in infos if i.type == pafs.FileType.File)


def build_world(kind: str, work: Path, cap: int, mb: float, eps: dict[str, S3Endpoint]) -> World:
    root = work / kind
    root.mkdir()
    config = root / "segrep.yaml"
    doc = definitions_doc(kind, cap, eps, f"bench-links-{uuid.uuid4().hex[:8]}")
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    catalog = Catalog(f"sqlite:///{root}/catalog.db")
    upgrade(catalog)
    defs = load_definitions(config)
    apply_definitions(catalog, defs)
    rng = np.random.default_rng(36)
    base = int(mb * 1e6)
    segment = max(base // 6, 64 * 1024)
    world = World(kind, root, catalog, config, doc, cap, {}, root / "catalog-pristine.db")
    for table, nbytes in (("hot", 2 * base), ("cold", 2 * base), ("scrub", base)):
        _, secs = timed(write_table, catalog, table, nbytes, rng, segment)
        world.sizes[table] = tree_bytes(world.site("primary"), table)
        log(f"{kind}: {table} written, {world.sizes[table] / 1e6:.0f} MB in {secs:.1f} s")
    copy_catalog(root / "catalog.db", world.pristine)
    return world


def reset(world: World) -> None:
    """The tables written, nothing replicated: the catalog and definitions restored, the replicas emptied."""
    world.catalog.dispose()
    copy_catalog(world.pristine, world.root / "catalog.db")
    world.config.write_text(yaml.safe_dump(world.doc, sort_keys=False))
    for name in REPLICAS:
        site = world.site(name)
        marker = marker_path(site.root)  # the identity marker stays: without it the next round finds it DOWN
        with site.fs.open_input_stream(marker) as f:
            identity = f.read()
        if site.local:
            shutil.rmtree(site.root, ignore_errors=True)
            Path(site.root).mkdir(parents=True)
        else:
            site.fs.delete_dir_contents(site.root, missing_dir_ok=True)
        with site.fs.open_output_stream(marker) as out:
            out.write(identity)


def primary_to_dr(cap: int | None) -> LinkLimits:
    """A link primary -> dr with ``cap`` (None: defined, unlimited); no other link."""

    def limits(source: str, target: str) -> lk.Limits | None:
        return lk.Limits(cap_bytes_per_s=cap) if (source, target) == ("primary", "dr") else None

    return limits


def round_ok(report: RoundReport, what: str) -> None:
    if report.status != RoundStatus.OK:
        raise SystemExit(f"{what}: {report}")


def join_dr(world: World, links: LinkLimits) -> None:
    """``cold`` bootstrapped onto dr, across ``links``, until it has joined."""
    doc = yaml.safe_load(world.config.read_text())
    doc["tables"]["cold"]["replicas"] = ["edge", "dr"]
    world.config.write_text(yaml.safe_dump(doc, sort_keys=False))
    defs = world.defs
    apply_definitions(world.catalog, defs)
    bootstrap(world.catalog, defs, "cold", "dr")
    catch_up(world.catalog, defs, "cold", "dr", submit=never_spark, links=links)
    if not target_state(world.catalog, "cold", "dr").caught_up:
        raise SystemExit("the bootstrap of cold onto dr did not join")


def run_together(*jobs: Callable[[], None]) -> None:
    errors: list[BaseException] = []

    def guarded(job: Callable[[], None]) -> None:
        try:
            job()
        except BaseException as e:  # reported once every job has ended
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


# -- 1: the cap across a round, a bootstrap and a scrub --------------------------------------------------------------


@dataclass
class CapFigures:
    cap_Bps: int
    span_s: float  # the sliding windows' length
    seconds: float
    bytes: int
    max_window_Bps: float | None  # None: the run was shorter than one window
    min_busy_window_Bps: float | None  # over the windows while all three send (None: none fits)
    busy_s: float
    per_class_bytes: dict[str, int]

    @property
    def upper_met(self) -> bool:
        return self.max_window_Bps is not None and self.max_window_Bps <= 1.1 * self.cap_Bps

    @property
    def lower_met(self) -> bool:
        return self.min_busy_window_Bps is not None and self.min_busy_window_Bps >= 0.9 * self.cap_Bps


def measure_cap(world: World, span: float) -> CapFigures:
    reset(world)
    links = primary_to_dr(world.cap)
    defs = world.defs
    probe = Probe()
    with probe.installed():
        started = time.monotonic()
        run_together(
            lambda: round_ok(
                run_round(world.catalog, defs, "hot", target="dr", submit=never_spark, links=links), "hot"
            ),
            lambda: join_dr(world, links),
            lambda: scrubbed(verify(world.catalog, "scrub", files=True, record=False, reader="dr", links=links)),
        )
        secs = time.monotonic() - started
    chunks = probe.chunks()
    firsts = [probe.chunks(w)[0][0] for w in (CopyPriority.ROUND, CopyPriority.BOOTSTRAP, CopyPriority.SCRUB)]
    lasts = [probe.chunks(w)[-1][0] for w in (CopyPriority.ROUND, CopyPriority.BOOTSTRAP, CopyPriority.SCRUB)]
    busy_from, busy_to = max(firsts), min(lasts)
    all_windows = windows(chunks, span)
    busy = [r for t0, t1, r in all_windows if t0 >= busy_from and t1 <= busy_to]
    per_class = {w.name.lower(): sum(n for _, n in probe.chunks(w)) for w in CopyPriority}
    return CapFigures(
        world.cap,
        span,
        secs,
        sum(n for _, n in chunks),
        max((r for _, _, r in all_windows), default=None),
        min(busy) if busy else None,
        max(0.0, busy_to - busy_from),
        {k: v for k, v in per_class.items() if v},
    )


def scrubbed(report: Any) -> None:
    if report.scrub.problems:
        raise SystemExit(f"the scrub found problems: {report}")


# -- 2: a round's lag beside a bootstrap -----------------------------------------------------------------------------


@dataclass
class LagFigures:
    rpo_s: int
    rounds: int
    lag_after_s: list[float]  # now - dr's safe time, just after each round
    max_wait_s: float  # the most a write waited: a round's end - the previous round's safe time
    bootstrap_s: float

    @property
    def met(self) -> bool:
        return self.rounds >= 2 and max(self.lag_after_s) <= self.rpo_s and self.max_wait_s <= self.rpo_s


def measure_lag(world: World, every_s: float) -> LagFigures:
    reset(world)
    links = primary_to_dr(world.cap)
    defs = world.defs
    rpo = defs.table("hot").policy.rpo_s
    if rpo is None:
        raise SystemExit("hot has no RPO in its policy")
    # hot at dr first (not measured): the rounds then carry each new write, as scheduled rounds do
    round_ok(run_round(world.catalog, defs, "hot", target="dr", submit=never_spark), "hot")
    done = threading.Event()
    joined: list[float] = []

    def the_bootstrap() -> None:
        try:
            _, secs = timed(join_dr, world, links)
            joined.append(secs)
        finally:
            done.set()

    lags: list[float] = []
    waits: list[float] = []
    rng = np.random.default_rng(7)
    first = 10**9
    previous_safe = hlc.now_us()
    worker = threading.Thread(target=the_bootstrap)
    worker.start()
    try:
        while not done.is_set():
            write_batch(world.catalog, "hot", rows(first, 1000, rng))  # about 1 MB
            first += 1000
            report = run_round(world.catalog, defs, "hot", target="dr", submit=never_spark, links=links)
            round_ok(report, "hot")
            now = hlc.now_us()
            safe = report.safe_time_us["dr"]
            lags.append((now - safe) / 1e6)
            waits.append((now - previous_safe) / 1e6)
            previous_safe = safe
            done.wait(every_s)
    finally:
        worker.join()
    if not joined:
        raise SystemExit("the bootstrap did not finish")
    return LagFigures(rpo, len(lags), lags, max(waits), joined[0])


# -- 3: a window change reaching a running copy ----------------------------------------------------------------------


@dataclass
class WindowFigures:
    caps_Bps: list[int]  # before, in the window, after
    took_s: list[float | None]  # per change: until the rate over 2 s was within 10 % of the new cap

    @property
    def met(self) -> bool:
        return all(t is not None and t <= 5.0 for t in self.took_s)


def measure_window(world: World, span: float = 2.0) -> WindowFigures:
    reset(world)
    defs = world.defs
    now = [FRIDAY]
    links = definitions_limits(defs, clock=lambda: now[0])
    caps = [world.cap, world.cap // 4, world.cap]
    # three phases of equal length over the table: at the cap, in the window, at the cap again
    phase = world.sizes["cold"] / (world.cap * 2 + world.cap / 4) * 0.9
    probe = Probe()
    changes: list[float] = []
    finished = threading.Event()

    def the_round() -> None:
        try:
            round_ok(run_round(world.catalog, defs, "cold", target="edge", submit=never_spark, links=links), "cold")
        finally:
            finished.set()

    with probe.installed():
        worker = threading.Thread(target=the_round)
        worker.start()
        while not probe.chunks() and not finished.is_set():  # the phases start with the first byte
            time.sleep(0.01)
        for when in (SATURDAY, FRIDAY):
            if finished.wait(phase):
                break
            now[0] = when
            changes.append(time.monotonic())
        worker.join()
    chunks = probe.chunks()
    took: list[float | None] = []
    for k in range(2):
        if k >= len(changes):
            took.append(None)
            continue
        cap, until = caps[k + 1], changes[k + 1] if k + 1 < len(changes) else float("inf")
        after = [c for c in chunks if changes[k] <= c[0] < until]
        hit = next((t1 for _, t1, r in windows(after, span) if abs(r - cap) <= 0.1 * cap), None)
        took.append(None if hit is None else hit - changes[k])
    return WindowFigures(caps, took)


# -- 4: no cap, today's throughput -----------------------------------------------------------------------------------


@dataclass
class UnlimitedFigures:
    bytes: int
    no_link_s: list[float] = field(default_factory=list)
    unlimited_link_s: list[float] = field(default_factory=list)
    no_link_cpu_s: list[float] = field(default_factory=list)  # this process's CPU (every thread) per copy
    unlimited_link_cpu_s: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:  # > 1: the unlimited link is faster
        return statistics.median(self.no_link_s) / statistics.median(self.unlimited_link_s)

    @property
    def paired_ratio(self) -> float:
        """The median of each repeat's own ratio (the two copies ran back to back: a shared machine's load
        drifts less within a pair than over the run)."""
        return statistics.median(a / b for a, b in zip(self.no_link_s, self.unlimited_link_s, strict=True))

    @property
    def cpu_ratio(self) -> float:
        return statistics.median(self.no_link_cpu_s) / statistics.median(self.unlimited_link_cpu_s)

    @property
    def met(self) -> bool:
        return abs(self.ratio - 1) <= 0.05


def every_link_unlimited(source: str, target: str) -> lk.Limits | None:
    """A link defined between every pair, without a cap: a slot taken on each, copies unpaced."""
    return lk.Limits()


COPIES = (("hot", "dr"), ("cold", "edge"), ("scrub", "edge"))  # every table written, each to its replica


def copy_all(world: World, links: LinkLimits) -> float:
    """Seconds for a round of each table to its empty replica, one after the other."""
    defs = world.defs
    started = time.perf_counter()
    for table, target in COPIES:
        round_ok(run_round(world.catalog, defs, table, target=target, submit=never_spark, links=links), table)
    return time.perf_counter() - started


def measure_unlimited(world: World, repeats: int) -> UnlimitedFigures:
    figs = UnlimitedFigures(sum(world.sizes.values()))
    reset(world)
    copy_all(world, unlimited)  # a warm-up, not measured
    for rep in range(repeats):
        order = ("none", "unlimited") if rep % 2 == 0 else ("unlimited", "none")
        for which in order:
            reset(world)
            probe = Probe()
            cpu = time.process_time()
            with probe.installed():
                secs = copy_all(world, every_link_unlimited if which == "unlimited" else unlimited)
            cpu = time.process_time() - cpu
            if probe.leases:  # a link unlimited for now takes no slot: nothing but the lookup differs
                raise SystemExit(f"{which}: {len(probe.leases)} link lease(s) taken")
            (figs.unlimited_link_s if which == "unlimited" else figs.no_link_s).append(secs)
            (figs.unlimited_link_cpu_s if which == "unlimited" else figs.no_link_cpu_s).append(cpu)
        log(
            f"{world.kind} unlimited repeat {rep + 1}: no link {figs.no_link_s[-1]:.2f} s, "
            f"unlimited link {figs.unlimited_link_s[-1]:.2f} s"
        )
    return figs


# -- the run -----------------------------------------------------------------------------------------------------------


@dataclass
class PairFigures:
    kind: str
    sizes: dict[str, int]
    unlimited: UnlimitedFigures
    cap: CapFigures
    lag: LagFigures
    window: WindowFigures


def run_pair(world: World, args: argparse.Namespace) -> PairFigures:
    unlimited = measure_unlimited(world, args.repeats)
    log(f"{world.kind}: unlimited ratio {unlimited.ratio:.3f}")
    cap = measure_cap(world, args.window)
    log(
        f"{world.kind}: cap {cap.cap_Bps / MiB:.1f} MiB/s, max over {args.window:g} s "
        f"{mibps(cap.max_window_Bps)}, {cap.seconds:.0f} s"
    )
    lag = measure_lag(world, args.round_every)
    log(f"{world.kind}: {lag.rounds} rounds beside the bootstrap, most waited {lag.max_wait_s:.1f} s")
    window = measure_window(world)
    log(f"{world.kind}: window changes took {window.took_s}")
    return PairFigures(world.kind, world.sizes, unlimited, cap, lag, window)


def mibps(x: float | None) -> str:
    return "n/a" if x is None else f"{x / MiB:.2f} MiB/s"


def table_rows(p: PairFigures) -> list[list[str]]:
    c, lag, w, u = p.cap, p.lag, p.window, p.unlimited
    took = ", ".join("never" if t is None else f"{t:.1f} s" for t in w.took_s)
    cap = c.cap_Bps
    return [
        [
            f"{p.kind}: cap, round + bootstrap + scrub, max over {c.span_s:g} s windows ({c.seconds:.0f} s run)",
            mibps(c.max_window_Bps),
            f"cap {mibps(cap)}",
            "n/a" if c.max_window_Bps is None else f"{c.max_window_Bps / cap:.3f}",
            "≤ cap + 10 %",
            verdict(c.upper_met),
        ],
        [
            f"{p.kind}: cap, min over {c.span_s:g} s windows while all three send ({c.busy_s:.0f} s)",
            mibps(c.min_busy_window_Bps),
            f"cap {mibps(cap)}",
            "n/a" if c.min_busy_window_Bps is None else f"{c.min_busy_window_Bps / cap:.3f}",
            "≥ cap - 10 %",
            verdict(c.lower_met),
        ],
        [
            f"{p.kind}: round lag beside a bootstrap ({lag.rounds} rounds, bootstrap {lag.bootstrap_s:.0f} s)",
            f"after rounds ≤ {max(lag.lag_after_s):.1f} s; most waited {lag.max_wait_s:.1f} s",
            "",
            f"{lag.max_wait_s / lag.rpo_s:.2f}",
            f"≤ RPO {lag.rpo_s} s",
            verdict(lag.met),
        ],
        [
            f"{p.kind}: window change {mibps(w.caps_Bps[0])} → {mibps(w.caps_Bps[1])} → {mibps(w.caps_Bps[2])}",
            took,
            "",
            "",
            "≤ 5 s each",
            verdict(w.met),
        ],
        [
            f"{p.kind}: no cap, rounds of 3 tables, {u.bytes / 1e6:.0f} MB (medians)",
            f"unlimited link {u.bytes / statistics.median(u.unlimited_link_s) / 1e6:.0f} MB/s",
            f"no link {u.bytes / statistics.median(u.no_link_s) / 1e6:.0f} MB/s",
            f"{u.ratio:.3f} (paired {u.paired_ratio:.3f}; CPU {u.cpu_ratio:.3f})",
            "1 ± 0.05",
            verdict(u.met),
        ],
    ]


def print_table(pairs: list[PairFigures]) -> None:
    print("\n| measure | segrep | baseline (same run) | ratio | target | result |")
    print("|---|---|---|---|---|---|")
    for p in pairs:
        for row in table_rows(p):
            print("| " + " | ".join(row) + " |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=48.0, help="MB of the scrubbed table (hot and cold: twice that)")
    ap.add_argument("--cap", type=float, default=8.0, help="cap of the local pair's link, MiB/s")
    ap.add_argument("--s3-cap", type=float, default=4.0, help="cap of the S3 pair's link, MiB/s (sizes scaled)")
    ap.add_argument("--window", type=float, default=10.0, help="seconds of the sliding windows of measure 1")
    ap.add_argument("--round-every", type=float, default=2.0, help="seconds between rounds in measure 2")
    ap.add_argument("--repeats", type=int, default=9, help="copies per side in measure 4 (medians)")
    ap.add_argument("--skip-s3", action="store_true", help="the local pair only")
    ap.add_argument("--skip-local", action="store_true", help="the S3 pair only")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    ap.add_argument("--work-dir", type=Path, default=None, help="parent of the scratch directory (default: /tmp)")
    ap.add_argument("--background-load", type=int, default=0, metavar="N", help="N CPU-bound processes meanwhile")
    args = ap.parse_args()

    load_start = os.getloadavg()
    pairs: list[PairFigures] = []
    with tempfile.TemporaryDirectory(prefix="segrep-bench-links-", dir=args.work_dir) as tmp:
        work = Path(tmp)
        stores: contextlib.AbstractContextManager[dict[str, S3Endpoint]] = (
            contextlib.nullcontext({}) if args.skip_s3 else endpoints(work)
        )
        with stores as eps, background_load(args.background_load):
            started = time.monotonic()
            kinds = [] if args.skip_local else [("local", args.cap, args.mb)]
            if not args.skip_s3:
                kinds.append(("s3", args.s3_cap, args.mb * args.s3_cap / args.cap))
            for kind, cap, mb in kinds:
                world = build_world(kind, work, int(cap * MiB), mb, eps)
                try:
                    pairs.append(run_pair(world, args))
                finally:
                    world.catalog.dispose()
            secs = time.monotonic() - started
    print_table(pairs)
    load_end = os.getloadavg()
    print(load_footer(secs, args.background_load, load_start, load_end))
    if args.json:
        doc = {
            "date": dt.datetime.now().isoformat(timespec="seconds"),
            "args": args_doc(args),
            "loadavg": [load_start, load_end],
            "pairs": [
                asdict(p)
                | {
                    "met": {
                        "cap_upper": p.cap.upper_met,
                        "cap_lower": p.cap.lower_met,
                        "lag": p.lag.met,
                        "window": p.window.met,
                        "unlimited": p.unlimited.met,
                    }
                }
                for p in pairs
            ],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        log(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
