"""Model-based test of any topology (issue 15 item 4): N sites, a topology drawn by hypothesis, writes at
several sites to the same keys, rounds with crashes and sites going down.

Each example draws 3 or 4 sites and a shape: a cascade tree, a daisy chain, broadcast, or geo-partitioned
leaders (each partition led by its own site), and independently whether the table takes writes at any site
(active-active: with broadcast, the ring/mesh of the issue). Rules:
- a write of a few of ten keys at a site (any site when active-active; else at the partitions' leaders);
- a round, with at most one fault: a crash at a named fault point (retried with the same interval end, as
  Airflow retries), or one site unreachable for the round.
After every step: committed files match their sha256; each site's stored safe time never decreases and
every key whose last write of all is at or before it resolves there to exactly that write; a replica's acks
are a prefix of its sender's offer order; no placement lists a segment twice, and a round without faults
offers no site a segment it already holds (no SEGMENT_EXISTS). At the end, faults off, rounds run until idle:
every site equals the independent last-writer-wins replay of every write. The statistics (topologies drawn,
conflicts, rounds) are printed for the closing note.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from segrep.core import hlc
from segrep.data.reader import read_table
from segrep.data.writer import write_batch
from segrep.replication.orchestrator import run_round
from tests.support.checks import (
    assert_acks_are_prefixes,
    assert_each_segment_once,
    assert_files_match_catalog,
    leaders,
    lease_count,
)
from tests.support.env import make_env
from tests.support.machines import check_safe_times, faulted_round, run_machine
from tests.support.spark import spark_submit_in

pytestmark = pytest.mark.spark

TABLE = "kv"
ALL_SITES = ("primary", "dr", "edge", "far")
KEYS = range(10)
POINTS = ("before_copy", "after_commit_before_ack", "in_merge_job", "before_checkpoint")
FAULTS = ("none", "none", "none", *POINTS, "down")
SHAPES = ("broadcast", "tree", "chain", "geo")


def topology_yaml(shape: str, n: int, any_site: bool) -> str:
    """The definitions of a two-partition table (split at 5) over the first ``n`` sites in ``shape``."""
    sites = ALL_SITES[:n]
    replicas: dict[str, str | None] = dict.fromkeys(sites[1:])
    leaders_ = ""
    if shape == "tree":  # primary -> dr -> {edge, far}
        replicas.update({s: "dr" for s in sites[2:]})
    elif shape == "chain":  # primary -> dr -> edge -> far
        replicas.update({s: sites[i] for i, s in enumerate(sites[2:], start=1)})
    elif shape == "geo":  # dr leads partition 1; the last site is fed by the one before it
        leaders_ = "    leaders: {1: dr}\n"
        if n > 3:
            replicas[sites[-1]] = sites[-2]
    body = ", ".join(f"{s}: {{from: {f}}}" if f else f"{s}: {{}}" for s, f in replicas.items())
    site_lines = "".join(f"  {s}: {{id: {i + 1}, uri: sites/{s}}}\n" for i, s in enumerate(sites))
    writes = "    writes: any_site\n" if any_site else ""
    return (
        f"data_dir: data\nsites:\n{site_lines}tables:\n  {TABLE}:\n    columns: {{k: int64, v: string}}\n"
        f"    primary_key: [k]\n    split_points: [5]\n    leader: primary\n{leaders_}"
        f"    replicas: {{{body}}}\n{writes}    policy: {{retry_delay_s: 0}}\n"
    )


class TopologyMachine(RuleBasedStateMachine):
    spark: ClassVar[Any] = None
    stats: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="segrep-topology-"))
        self.env: Any = None
        self.sites: tuple[str, ...] = ()
        self.any_site = False
        self.expected: dict[int, tuple[int, int, bool, str]] = {}  # key -> winning (version, origin, deleted, v)
        self.safe: dict[str, int] = {}
        self.pending_end: int | None = None
        self.counter = 0
        self.submit = spark_submit_in(self.spark)
        self.log: list[str] = []

    @initialize(shape=st.sampled_from(SHAPES), n=st.sampled_from([3, 4]), any_site=st.booleans())
    def build(self, shape: str, n: int, any_site: bool) -> None:
        self.sites, self.any_site = ALL_SITES[:n], any_site
        text = topology_yaml(shape, n, any_site)
        self.env = make_env(self.tmp, f"sqlite:///{self.tmp}/catalog.db", text)
        self.ids = {s: i + 1 for i, s in enumerate(self.sites)}
        self.stats[f"topology {shape} x{n}{' active-active' if any_site else ''}"] += 1
        self.log.append(text)

    @precondition(lambda self: self.env is not None)
    @rule(
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True),
        deleting=st.booleans(),
        at=st.integers(0, 3),
    )
    def write(self, keys: list[int], deleting: bool, at: int) -> None:
        site = self.sites[at % len(self.sites)] if self.any_site else None
        self.counter += 1
        rows = pa.table({"k": pa.array(keys, pa.int64()), "v": [f"w{self.counter}k{k}" for k in keys]})
        result = write_batch(
            self.env.catalog, TABLE, rows.select(["k"]) if deleting else rows, delete=deleting, site=site
        )
        by_pid = {seg.partition_id: (seg.version, self.ids[seg.site]) for seg in result.segments}
        pids = sorted(leaders(self.env.catalog, TABLE))
        for k in keys:
            version, origin = by_pid[pids[0] if k < 5 else pids[1]]
            old = self.expected.get(k)
            if old is None or (version, origin) > old[:2]:
                self.expected[k] = (version, origin, deleting, f"w{self.counter}k{k}")
        self.stats["writes at a follower" if site and site not in _leader_sites(self.env) else "writes"] += 1
        self.log.append(f"write {keys} at {site or 'leaders'} delete={deleting}")

    @precondition(lambda self: self.env is not None)
    @rule(fault=st.sampled_from(FAULTS), at=st.integers(0, 3))
    def replication_round(self, fault: str, at: int) -> None:
        site = self.sites[at % len(self.sites)]
        end = self.pending_end or hlc.now_us()
        self.log.append(f"round end={end} fault={fault} site={site}")
        report = faulted_round(self.env, TABLE, end, fault, site, points=POINTS, stats=self.stats, submit=self.submit)
        if report is None:
            self.pending_end = end
            return
        retried, self.pending_end = self.pending_end, None
        self.log.append("  " + str(report).replace("\n", "\n  "))
        self.count(report)
        if fault == "none" and retried is None:
            echoes = {t: r.outcomes.get("SEGMENT_EXISTS", 0) for t, r in report.targets.items()}
            assert not any(echoes.values()), f"offered a segment a site held already: {echoes}\n" + "\n".join(self.log)

    def count(self, report: Any) -> None:
        self.stats["rounds"] += 1
        self.stats["merges committed"] += report.merges.committed
        for c in report.merges.conflicts:
            self.stats["conflicting rows"] += c.rows
        for target in report.targets.values():
            for source, n in target.bytes_from.items():
                self.stats["bytes from primary" if source == "primary" else "bytes from other sites"] += n
            for outcome, n in (target.outcomes or {}).items():
                self.stats[outcome] += n

    # -- invariants ------------------------------------------------------------------------------------------

    @precondition(lambda self: self.env is not None)
    @invariant()
    def files_and_acks(self) -> None:
        assert_files_match_catalog(self.env)
        assert_acks_are_prefixes(self.env.catalog, TABLE)
        assert_each_segment_once(self.env.catalog, self.sites)

    @precondition(lambda self: self.env is not None)
    @invariant()
    def safe_time_never_decreases_and_is_honest(self) -> None:
        self.safe = check_safe_times(self.env.catalog, TABLE, self.expected, self.safe, self.log)

    # -- quiescence --------------------------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            if self.env is not None:
                self.quiesce()
        finally:
            if self.env is not None:
                self.env.catalog.dispose()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def quiesce(self) -> None:
        for _ in range(12):
            retry, self.pending_end = self.pending_end, None
            report = run_round(self.env.catalog, self.env.defs, TABLE, retry, submit=self.submit)
            self.count(report)
            self.log.append("  quiesce " + str(report).replace("\n", "\n  "))
            busy = any(t.outcomes or t.status != "ok" for t in report.targets.values())
            if not busy and not report.merges.items and retry is None:
                break
        else:
            pytest.fail("no idle round:\n" + "\n".join(self.log))
        self.safe_time_never_decreases_and_is_honest()
        want = sorted((k, v) for k, (_ver, _o, deleted, v) in self.expected.items() if not deleted)
        for site in self.sites:
            got = read_table(self.env.catalog, TABLE, site).sort_by("k")
            pairs = list(zip(got["k"].to_pylist(), got["v"].to_pylist(), strict=True))
            assert pairs == want, (site, pairs, want, "\n".join(self.log))
        assert lease_count(self.env.catalog) == 0


def _leader_sites(env: Any) -> set[str]:
    return {site for site, _epoch in leaders(env.catalog, TABLE).values()}


def test_topologies_state_machine(spark: Any) -> None:
    TopologyMachine.spark = spark
    run_machine(TopologyMachine, "SEGREP_TOPOLOGY_EXAMPLES", 4)
