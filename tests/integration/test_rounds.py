"""Replication rounds without Spark (DESIGN sections 6, 7, 9), on SQLite and PostgreSQL.

Every round here runs the real engine (plan -> fast-forward per target -> commit) with a ``submit`` that fails
the test if Spark is asked for: nothing in these scenarios needs a merge. Replicas are compared with the leader
through ``read_table`` (sorted), and with an independent model of the writes where the interval matters.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog.models import Base
from segrep.cli.format import format_report, last_round, status_note
from segrep.cli.main import main
from segrep.core import hlc
from segrep.core.chain import visible_segments
from segrep.data.reader import read_table
from segrep.data.writer import write_batch
from segrep.replication.commit import commit_round
from segrep.replication.fast_forward import CopyItem, CopyOutcome, copy_one, fast_forward_target
from segrep.replication.plan import plan_round
from segrep.replication.round import TargetUnreachable
from segrep.replication.run import run_round
from segrep.replication.status import status_rows
from segrep.spark.results import CommitSummary
from segrep.storage.site import Site
from segrep.storage.transfer import copy_verified
from tests.conftest import Env, make_env

TABLE = "events"
REPLICAS = ("dr", "edge")
TENANTS = ("a", "b", "x", "y")  # 'a' and 'b' fall in partition [-inf, m), 'x' and 'y' in [m, +inf)


# -- helpers shared by the round tests (imported by test_round_faults and the Spark tests) -------------------


def batch(keys: Iterable[int], tag: str) -> pa.Table:
    keys = list(keys)
    return pa.table(
        {
            "tenant": [TENANTS[k % len(TENANTS)] for k in keys],
            "seq": keys,
            "payload": [f"{tag}{k}" for k in keys],
            "at": pa.array([None] * len(keys), pa.timestamp("us")),
        }
    )


class Model:
    """What the leader should hold: key -> payload, replayed independently of the engine."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, int], str] = {}

    def upsert(self, env: Env, keys: Iterable[int], tag: str) -> int:
        """Write; return the oldest row version of the new segments."""
        keys = list(keys)
        result = write_batch(env.catalog, TABLE, batch(keys, tag))
        for k in keys:
            self.rows[(TENANTS[k % len(TENANTS)], k)] = f"{tag}{k}"
        return min(seg.version for seg in result.segments)

    def delete(self, env: Env, keys: Iterable[int]) -> None:
        keys = list(keys)
        write_batch(env.catalog, TABLE, batch(keys, "").select(["tenant", "seq"]), delete=True)
        for k in keys:
            self.rows.pop((TENANTS[k % len(TENANTS)], k), None)

    def snapshot(self) -> list[tuple[str, int, str]]:
        return sorted((t, s, p) for (t, s), p in self.rows.items())


def sorted_table(catalog: Catalog, site: str | None = None, *, as_of: int | None = None) -> pa.Table:
    return read_table(catalog, TABLE, site, as_of=as_of).sort_by([("tenant", "ascending"), ("seq", "ascending")])


def triples(catalog: Catalog, site: str | None = None) -> list[tuple[str, int, str]]:
    t = sorted_table(catalog, site)
    return list(zip(t["tenant"].to_pylist(), t["seq"].to_pylist(), t["payload"].to_pylist(), strict=True))


def assert_replicas_equal_leader(catalog: Catalog, sites: Iterable[str] = REPLICAS) -> pa.Table:
    leader = sorted_table(catalog)
    for site in sites:
        got = sorted_table(catalog, site)
        assert got.equals(leader), f"{site}: {got.num_rows} rows, leader {leader.num_rows}"
    return leader


def no_spark(*args: Any, **kwargs: Any) -> None:
    pytest.fail(f"Spark was launched although nothing needed it: {args}")


def placement_id(catalog: Catalog, site: str, partition_id: int, table: str = TABLE) -> int:
    with catalog.read() as s:
        return s.scalars(
            select(m.Placement.placement_id)
            .join(m.Site, m.Site.site_id == m.Placement.site_id)
            .where(m.Site.name == site, m.Placement.partition_id == partition_id, m.Placement.removed_us.is_(None))
        ).one()


def partitions(catalog: Catalog, table: str = TABLE) -> list[int]:
    with catalog.read() as s:
        return list(
            s.scalars(
                select(m.Partition.partition_id)
                .join(m.Table, m.Table.table_id == m.Partition.table_id)
                .where(m.Table.name == table)
                .order_by(m.Partition.partition_id)
            )
        )


def segment_rows(catalog: Catalog, site: str) -> list[tuple[int, str, str, str]]:
    """(partition, segment id, sha256, relpath) of every segment in the site's lists, with duplicates."""
    with catalog.read() as s:
        return sorted(
            s.execute(
                select(m.Segment.partition_id, m.Segment.segment_id, m.Segment.sha256, m.Segment.relpath)
                .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
                .join(m.Site, m.Site.site_id == m.Placement.site_id)
                .where(m.Site.name == site)
            ).all()
        )


def assert_each_segment_once(catalog: Catalog, sites: Iterable[str] = REPLICAS) -> None:
    for site in sites:
        ids = [(pid, seg) for pid, seg, _h, _r in segment_rows(catalog, site)]
        assert len(ids) == len(set(ids)), f"{site} lists a segment twice: {ids}"


def assert_files_match_catalog(env: Env) -> None:
    """Invariant 1: every committed segment file exists with the sha256 the catalog recorded."""
    with env.catalog.read() as s:
        rows = s.execute(
            select(m.Site.name, m.Segment.relpath, m.Segment.sha256, m.Segment.byte_size)
            .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
            .join(m.Site, m.Site.site_id == m.Placement.site_id)
        ).all()
    for site, relpath, sha, size in rows:
        data = (env.site_dir(site) / relpath).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (size, sha), f"{site}/{relpath} changed"


def lease_count(catalog: Catalog) -> int:
    with catalog.read() as s:
        return int(s.scalar(select(func.count()).select_from(m.Lease)) or 0)


def safe_times(catalog: Catalog, table: str = TABLE) -> dict[str, int]:
    with catalog.read() as s:
        return dict(
            s.execute(
                select(m.Site.name, m.SafeTime.safe_time_us)
                .join(m.Site, m.Site.site_id == m.SafeTime.site_id)
                .join(m.Table, m.Table.table_id == m.SafeTime.table_id)
                .where(m.Table.name == table)
            ).all()
        )


def catalog_state(env: Env, skip: tuple[str, ...] = ("rounds", "round_targets")) -> dict[str, list[str]]:
    """Every catalog row (but the round bookkeeping) and every file under the sites, with its hash."""
    with env.catalog.read() as s:
        rows = {t.name: sorted(map(repr, s.execute(select(t)).all())) for t in Base.metadata.sorted_tables
                if t.name not in skip}  # fmt: skip
    rows["files"] = sorted(
        f"{p.relative_to(env.root)} {hashlib.sha256(p.read_bytes()).hexdigest()}"
        for p in (env.root / "data" / "sites").rglob("*")
        if p.is_file()
    )
    return rows


def set_leader(catalog: Catalog, site: str, table: str = TABLE, partition_ids: Iterable[int] | None = None) -> None:
    """A leader change done directly in the catalog: the placement at ``site`` leads, epoch + 1."""
    wanted = None if partition_ids is None else set(partition_ids)
    with catalog.write() as s:
        site_id = s.scalars(select(m.Site.site_id).where(m.Site.name == site)).one()
        parts = s.scalars(
            select(m.Partition).join(m.Table, m.Table.table_id == m.Partition.table_id).where(m.Table.name == table)
        ).all()
        for part in parts:
            if wanted is not None and part.partition_id not in wanted:
                continue
            pl = s.scalars(
                select(m.Placement).where(
                    m.Placement.partition_id == part.partition_id,
                    m.Placement.site_id == site_id,
                    m.Placement.removed_us.is_(None),
                )
            ).one()
            if part.leader_placement_id != pl.placement_id:
                part.leader_placement_id = pl.placement_id
                part.epoch += 1


def raw_winners(catalog: Catalog, table: str, site: str | None = None) -> dict[tuple[Any, ...], tuple[int, int, bool]]:
    """Per primary key, the winning (version, origin, deleted) of the placement(s) at ``site`` (default: the
    leaders), tombstones included: what a write "being readable" there is checked against."""
    from segrep.data.reader import placement_files

    info, placements = placement_files(catalog, table, site)
    pk = list(info.primary_key)
    out: dict[tuple[Any, ...], tuple[int, int, bool]] = {}
    for pf in placements:
        for seg in pf.segments:
            t = pf.site.read_segment(seg.relpath, columns=[*pk, "_version", "_origin", "_deleted"])
            cols = [t[c].to_pylist() for c in (*pk, "_version", "_origin", "_deleted")]
            for *key, version, origin, deleted in zip(*cols, strict=True):
                k = tuple(key)
                if k not in out or (version, origin) > out[k][:2]:
                    out[k] = (version, origin, deleted)
    return out


def assert_safe_time_honest(catalog: Catalog, table: str, site: str, safe_us: int) -> None:
    """Invariant 4: every write the leaders hold with a version at or before the safe time is readable at
    ``site``: the site resolves that key to the same write or a newer one (a newer one can be the site's own
    fork, not merged yet)."""
    leader = raw_winners(catalog, table)
    there = raw_winners(catalog, table, site)
    for key, (version, origin, _deleted) in leader.items():
        if version <= safe_us:
            got = there.get(key)
            assert got is not None and got[:2] >= (version, origin), (
                f"safe time {safe_us} at {site} claims {key} at version {version}, but {site} has {got}"
            )


def assert_acks_are_prefixes(catalog: Catalog, table: str) -> None:
    """Invariant 5, in the form the catalog can check (offers themselves are not recorded): what a replica
    holds (lists, or references through its chain) of the leader's visible chain, in offer order, is a prefix.
    A segment taken before its predecessor (only possible if it was offered before the predecessor was
    acked) would show as a hole.

    The acked sets themselves are not checked this way: after a leader change the new leader's acks are the
    notes made while it was a replica or merged a push (holder = it), which say "has these rows", not "took
    these in order"; the next round offers the older segments first and they are acked as SEGMENT_EXISTS."""
    from segrep.catalog.snapshot import snapshot
    from segrep.core.chain import is_referenced

    with catalog.read() as s:
        snap = snapshot(s, table)
        for part in snap.partitions:
            order = [ref.segment_id for ref in visible_segments(part.chain(part.leader))]
            for replica in part.replicas:
                chain = part.chain(replica)
                listed = {x.segment_id for x in part.segments.get(replica.placement_id, [])}

                def holds(seg: str, chain: Any = chain, listed: set[str] = listed) -> bool:
                    return seg in listed or is_referenced(chain, seg)

                flags = [holds(seg) for seg in order]
                where = f"partition {part.partition.partition_id}, replica {replica.placement_id}"
                assert flags == sorted(flags, reverse=True), f"{where} holds {flags} of the leader's {order}"


def round_until_idle(env: Env, max_rounds: int = 6, **kwargs: Any) -> list[dict[str, Any]]:
    """Rounds (until now) until one copies nothing and merges nothing; return their reports."""
    reports = []
    for _ in range(max_rounds):
        rep = run_round(env.catalog, env.defs, TABLE, submit=kwargs.pop("submit", no_spark), **kwargs)
        reports.append(rep)
        busy = any(t.segments_copied or t.outcomes for t in rep.targets.values())
        if not busy and not rep.merges.items and rep.status == "ok":
            return reports
    pytest.fail(f"no idle round after {max_rounds}: {[format_report(r) for r in reports]}")


# -- tests ------------------------------------------------------------------------------------------------------


def test_two_targets_converge_and_a_second_round_does_nothing(env: Env) -> None:
    model = Model()
    model.upsert(env, range(100), "a")
    model.upsert(env, range(50, 150), "b")
    model.delete(env, range(0, 20))
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert rep.status == "ok" and rep.failed == [] and rep.spark_apps == 0
    for site in REPLICAS:
        t = rep.targets[site]
        assert t.status == "ok"
        assert t.outcomes == {"FAST_FORWARD": 6}, t  # 3 batches x 2 partitions
        assert t.segments_copied == 6 and t.bytes_copied > 0
    leader = assert_replicas_equal_leader(env.catalog)
    assert triples(env.catalog) == model.snapshot() and leader.num_rows == 130
    assert_each_segment_once(env.catalog)
    assert_files_match_catalog(env)
    assert set(rep.safe_time_us) == set(REPLICAS)
    assert all(v == rep.end_us - 1 for v in rep.safe_time_us.values())

    before = catalog_state(env, skip=("rounds", "round_targets", "safe_times", "checkpoints"))
    again = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert again.round_id != rep.round_id and again.status == "ok" and again.spark_apps == 0
    for site in REPLICAS:
        t = again.targets[site]
        assert (t.outcomes, t.segments_copied, t.bytes_copied) == ({}, 0, 0)
    assert again.merges.items == 0
    text = format_report(again)
    assert text.count("nothing to offer; copied 0 segments, 0 bytes") == 2, text
    assert "spark applications: 0" in text
    assert catalog_state(env, skip=("rounds", "round_targets", "safe_times", "checkpoints")) == before
    assert all(again.safe_time_us[s] >= rep.safe_time_us[s] for s in REPLICAS)
    assert lease_count(env.catalog) == 0


def test_interval_end_limits_what_is_offered_and_safe_time_never_decreases(env: Env) -> None:
    first, second = Model(), Model()
    first.upsert(env, range(40), "a")
    t = hlc.now_us()
    second.rows = dict(first.rows)
    second.upsert(env, range(30, 60), "b")
    rep = run_round(env.catalog, env.defs, TABLE, t, submit=no_spark)
    assert rep.end_us == t and rep.status == "ok"
    for site in REPLICAS:
        assert triples(env.catalog, site) == first.snapshot(), site  # nothing of the second write
        assert rep.targets[site].outcomes == {"FAST_FORWARD": 2}
        assert rep.safe_time_us[site] <= t
        # invariant 4: everything the leader holds up to the safe time is readable at the target
        assert sorted_table(env.catalog, site, as_of=rep.safe_time_us[site]).equals(
            sorted_table(env.catalog, as_of=rep.safe_time_us[site])
        )
    previous = safe_times(env.catalog)
    assert previous == rep.safe_time_us

    earlier = run_round(env.catalog, env.defs, TABLE, t - 10_000_000, submit=no_spark)
    assert earlier.status == "ok"
    assert all(earlier.targets[s].segments_copied == 0 for s in REPLICAS)
    assert earlier.safe_time_us == previous  # an earlier interval never lowers it
    assert safe_times(env.catalog) == previous
    for site in REPLICAS:
        assert triples(env.catalog, site) == first.snapshot()

    later = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    for site in REPLICAS:
        assert later.safe_time_us[site] > previous[site]
        assert triples(env.catalog, site) == second.snapshot()
    assert_replicas_equal_leader(env.catalog)


def test_a_round_with_nothing_to_do_launches_no_spark(env: Env) -> None:
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)  # empty table
    assert rep.spark_apps == 0 and rep.status == "ok" and rep.merges == CommitSummary()
    assert not (env.root / "data" / "work" / "rounds" / TABLE / str(rep.end_us) / "merge-manifest.json").exists()
    assert all(rep.targets[s].outcomes == {} for s in REPLICAS)
    write_batch(env.catalog, TABLE, batch(range(10), "a"))
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).spark_apps == 0
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert rep.spark_apps == 0 and rep.merges.items == 0
    orders = run_round(env.catalog, env.defs, "orders", submit=no_spark)  # another table, one replica
    assert orders.spark_apps == 0 and set(orders.targets) == {"dr"}


class FlippingInput:
    """A readable stream that flips one byte of what it passes on (a bit error on the wire)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.offset = 0

    def __enter__(self) -> FlippingInput:
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.close()

    def read(self, n: int = -1) -> bytes:
        chunk = self.inner.read(n)
        if chunk and self.offset <= 100 < self.offset + len(chunk):
            data = bytearray(chunk)
            data[100 - self.offset] ^= 0x01
            chunk = bytes(data)
        self.offset += len(chunk)
        return chunk


class FlippingFS:
    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def open_input_stream(self, path: str) -> FlippingInput:
        return FlippingInput(self.fs.open_input_stream(path))


def corrupting_copier(items: list[CopyItem]) -> list[CopyOutcome]:
    """The real verified copy, reading the source through a link that flips a byte."""
    out = []
    for item in items:
        source = Site(item.source, item.source_uri)
        source.fs = FlippingFS(source.fs)  # type: ignore[assignment]
        try:
            copy_verified(source, Site(item.target, item.target_uri), item.relpath, item.byte_size, item.sha256)
        except Exception as exc:  # the verification failure is the point
            out.append(CopyOutcome(item.relpath, False, invalid=str(exc)))
        else:
            out.append(CopyOutcome(item.relpath, True))
    return out


def test_corruption_in_transit_is_invalid_backs_off_and_a_retry_replicates(env: Env) -> None:
    write_batch(env.catalog, TABLE, batch(range(30), "a"))
    plan = plan_round(env.catalog, env.defs, TABLE)
    probe = corrupting_copier([_item_for_first_segment(env)])[0]  # the flipping link really corrupts
    assert not probe.ok and "does not match the catalog" in (probe.invalid or ""), probe
    assert not [p for p in (env.root / "scratch").rglob("*") if p.is_file()]

    report = fast_forward_target(env.catalog, env.defs, TABLE, "dr", plan.end_us, copier=corrupting_copier)
    assert report.status == "declined" and report.outcomes == {"INVALID": 2}, report  # one per partition
    assert report.segments_copied == 0 or report.outcomes.get("FAST_FORWARD", 0) == report.segments_copied
    leader_segments = {seg for _p, seg, _h, _r in segment_rows(env.catalog, "primary")}
    dr_segments = {seg for _p, seg, _h, _r in segment_rows(env.catalog, "dr")}
    assert not dr_segments & leader_segments  # the corrupt segment was not registered (and none after it)
    dr_dir = env.site_dir("dr") / TABLE
    assert not dr_dir.exists() or not [p for p in dr_dir.rglob("*") if p.is_file()], list(dr_dir.rglob("*"))
    with env.catalog.read() as s:
        backoff = s.scalars(select(m.Backoff).join(m.Site, m.Site.site_id == m.Backoff.site_id)
                            .where(m.Site.name == "dr")).one()  # fmt: skip
        assert backoff.failures == 1 and backoff.last_reason == "INVALID" and backoff.next_attempt_us > hlc.now_us()
    assert lease_count(env.catalog) == 0

    edge = fast_forward_target(env.catalog, env.defs, TABLE, "edge", plan.end_us)  # another target is unaffected
    assert edge.status == "ok" and edge.segments_copied == 2
    rep = commit_round(env.catalog, env.defs, TABLE, plan.end_us, merge_ran=False)
    assert rep.status == "partial" and rep.targets["dr"].status == "declined"
    assert "dr" not in rep.safe_time_us or rep.safe_time_us["dr"] < plan.end_us - 1
    row = next(r for r in status_rows(env.catalog, TABLE) if r.target == "dr")
    assert row.declines == {"INVALID": 2} and "backing off (INVALID)" in status_note(row) and row.pending_segments == 2

    held_off = run_round(env.catalog, env.defs, TABLE, submit=no_spark)  # still inside the back-off window
    assert held_off.targets["dr"].status == "backoff" and held_off.targets["dr"].segments_copied == 0

    retry = run_round(env.catalog, env.defs, TABLE, reoffer=True, submit=no_spark)
    assert retry.status == "ok" and retry.targets["dr"].segments_copied == 2, format_report(retry)
    assert_replicas_equal_leader(env.catalog)
    assert_files_match_catalog(env)
    with env.catalog.read() as s:
        assert s.scalar(select(func.count()).select_from(m.Backoff)) == 0  # success clears the back-off


def _item_for_first_segment(env: Env) -> CopyItem:
    with env.catalog.read() as s:
        seg = s.scalars(select(m.Segment).order_by(m.Segment.entry_id).limit(1)).one()
    scratch = env.root / "scratch"
    return CopyItem("primary", str(env.site_dir("primary")), "edge", str(scratch), seg.relpath, seg.byte_size,
                    seg.sha256)  # fmt: skip


def test_corrupting_copier_through_run_round(env: Env) -> None:
    """The same through the copier given to run_round (both targets corrupt): nothing lands anywhere."""
    write_batch(env.catalog, TABLE, batch(range(10), "a"))
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark, copier=corrupting_copier)
    assert rep.status == "partial" and rep.failed == []
    assert {rep.targets[s].status for s in REPLICAS} == {"declined"}
    assert segment_rows(env.catalog, "dr") == [] and segment_rows(env.catalog, "edge") == []
    rep = run_round(
        env.catalog, env.defs, TABLE, reoffer=True, submit=no_spark, copier=lambda items: [copy_one(i) for i in items]
    )
    assert rep.status == "ok"
    assert_replicas_equal_leader(env.catalog)


def take_down(env: Env, site: str) -> Path:
    """Replace the site's directory by a regular file: every write there fails with an OSError."""
    d = env.site_dir(site)
    d.mkdir(parents=True, exist_ok=True)  # a site nothing was copied to yet has no directory
    aside = d.with_name(f"{site}.away")
    d.rename(aside)
    d.write_text("down for maintenance\n")
    return aside


def bring_up(env: Env, site: str, aside: Path) -> None:
    env.site_dir(site).unlink()
    aside.rename(env.site_dir(site))


def test_outage_fails_one_target_and_a_backfill_catches_up_in_order(outage_env: Env) -> None:
    env = outage_env
    model = Model()
    model.upsert(env, range(20), "a")
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).status == "ok"
    expected_at: list[list[tuple[str, int, str]]] = []
    ends: list[int] = []
    first_missing = []
    for n in range(3):
        first_missing.append(model.upsert(env, range(10 * n, 10 * n + 25), f"w{n}_"))
        if n == 1:
            model.delete(env, range(0, 5))
        ends.append(hlc.now_us())
        expected_at.append(model.snapshot())
    safe_before = safe_times(env.catalog)

    aside = take_down(env, "dr")
    for end, expected in zip(ends, expected_at, strict=True):
        rep = run_round(env.catalog, env.defs, TABLE, end, submit=no_spark)
        assert rep.status == "failed" and rep.failed == ["dr"], format_report(rep)
        assert rep.targets["dr"].status == "failed" and rep.targets["edge"].status == "ok"
        assert "dr" in rep.targets["dr"].error or "Error" in rep.targets["dr"].error
        assert triples(env.catalog, "edge") == expected  # edge proceeds interval by interval
        # dr's safe time may reach the instant before the oldest write it lacks, never further (nor back)
        assert safe_before["dr"] <= rep.safe_time_us["dr"] < first_missing[0]
        assert ": failed" in format_report(rep).splitlines()[0]
    with pytest.raises(TargetUnreachable, match="target dr"):
        fast_forward_target(env.catalog, env.defs, TABLE, "dr", ends[-1])
    with env.catalog.read() as s:
        backoff = s.scalars(select(m.Backoff)).one()
        assert backoff.failures == 4 and backoff.last_reason.startswith("unreachable")
    row = next(r for r in status_rows(env.catalog, TABLE) if r.target == "dr")
    assert row.last_status == "failed" and last_round(row).endswith("failed") and row.pending_segments > 0
    code, out, err = cli(env, "status", TABLE)
    assert code == 0, err
    dr_line = next(line for line in out.splitlines() if line.split()[:2] == [TABLE, "dr"])
    assert "failed" in dr_line, out
    assert not list(Path(aside).rglob(".*tmp*"))  # no partial copy left behind

    bring_up(env, "dr", aside)
    last_safe = safe_times(env.catalog)["dr"]
    for end, expected in zip(ends, expected_at, strict=True):  # the backfill: the same intervals, in order
        rep = run_round(env.catalog, env.defs, TABLE, end, submit=no_spark)
        assert rep.status == "ok", format_report(rep)
        assert triples(env.catalog, "dr") == expected
        safe = rep.safe_time_us["dr"]
        assert last_safe <= safe <= end
        last_safe = safe
        leader_then = sorted_table(env.catalog, as_of=safe)
        assert sorted_table(env.catalog, "dr", as_of=safe).equals(leader_then)
        assert_safe_time_honest(env.catalog, TABLE, "dr", safe)
        assert_acks_are_prefixes(env.catalog, TABLE)
    round_until_idle(env)
    assert_replicas_equal_leader(env.catalog)
    assert_each_segment_once(env.catalog)
    assert_files_match_catalog(env)
    assert lease_count(env.catalog) == 0


def test_fast_forward_and_commit_twice_change_nothing(env: Env) -> None:
    model = Model()
    model.upsert(env, range(30), "a")
    model.upsert(env, range(10, 40), "b")
    plan = plan_round(env.catalog, env.defs, TABLE)
    first = fast_forward_target(env.catalog, env.defs, TABLE, "dr", plan.end_us)
    assert first.segments_copied == 4
    after_first = catalog_state(env)
    second = fast_forward_target(env.catalog, env.defs, TABLE, "dr", plan.end_us)
    assert second.status == "ok" and second.segments_copied == 0 and second.outcomes == {}
    assert catalog_state(env) == after_first
    again = fast_forward_target(env.catalog, env.defs, TABLE, "dr", plan.end_us, reoffer=True)
    assert again.segments_copied == 0 and again.outcomes == {"SEGMENT_EXISTS": 4}
    assert catalog_state(env) == after_first

    fast_forward_target(env.catalog, env.defs, TABLE, "edge", plan.end_us)
    one = commit_round(env.catalog, env.defs, TABLE, plan.end_us, merge_ran=False)
    after_commit = catalog_state(env)
    two = commit_round(env.catalog, env.defs, TABLE, plan.end_us, merge_ran=False)
    assert catalog_state(env) == after_commit
    assert replace(one, round_id=0) == replace(two, round_id=0)
    with env.catalog.read() as s:
        assert s.scalar(select(func.count()).select_from(m.Round)) == 1
        assert s.scalar(select(func.count()).select_from(m.RoundTarget)) == 2
    assert triples(env.catalog, "dr") == triples(env.catalog, "edge") == model.snapshot()
    assert_each_segment_once(env.catalog)


def _fast_forward_in_thread(
    url: str, env: Env, end: int, barrier: threading.Barrier, results: list[Any], i: int
) -> None:
    cat = Catalog(url)  # its own engine and connections, as a second worker would have
    try:
        barrier.wait()
        results[i] = fast_forward_target(cat, env.defs, TABLE, "dr", end, reoffer=True)
    except Exception as exc:  # reported by the test
        results[i] = exc
    finally:
        cat.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("rounds", ["same round", "two rounds"])
def test_two_concurrent_fast_forwards_commit_each_segment_once(pg_server: str, tmp_path: Path, rounds: str) -> None:
    """Two task runs at once against one target, on PostgreSQL (row locks, separate connections): the same
    round run twice (a retried task racing its first try) or two rounds whose leases collide (INFLIGHT)."""
    from tests.conftest import pg_schema_url

    urls = pg_schema_url(pg_server)
    url = next(urls)
    try:
        env = make_env(tmp_path, url)
        model = Model()
        for n in range(4):
            for k in range(3):
                model.upsert(env, range(100 * n + 10 * k, 100 * n + 10 * k + 15), f"r{n}k{k}_")
            plan = plan_round(env.catalog, env.defs, TABLE)
            ends = [plan.end_us, plan.end_us if rounds == "same round" else hlc.now_us()]
            barrier = threading.Barrier(2)
            results: list[Any] = [None, None]
            threads = [
                threading.Thread(target=_fast_forward_in_thread, args=(url, env, ends[i], barrier, results, i))
                for i in range(2)
            ]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            assert all(not isinstance(r, Exception) for r in results), results
            copied = sum(r.segments_copied for r in results)
            assert copied >= 6, results  # 3 writes x 2 partitions, each committed by one of the two (or both)
            if rounds == "two rounds":  # a lease held by the other round is INFLIGHT, never a second copy
                assert copied == 6, results
            assert_each_segment_once(env.catalog, ["dr"])
            assert triples(env.catalog, "dr") == model.snapshot(), n
            assert_replicas_equal_leader(env.catalog, ["dr"])
            assert lease_count(env.catalog) == 0
        with env.catalog.read() as s:
            dup = s.execute(
                select(m.Segment.placement_id, m.Segment.segment_id, func.count())
                .group_by(m.Segment.placement_id, m.Segment.segment_id)
                .having(func.count() > 1)
            ).all()
            assert dup == []
        assert_files_match_catalog(env)
        env.catalog.dispose()
    finally:
        urls.close()


# -- the command line -----------------------------------------------------------------------------------------


def cli(env: Env, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["--config", str(env.config), "--catalog", env.url, *args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_cli_round_and_status(env: Env) -> None:
    model = Model()
    model.upsert(env, range(25), "a")
    code, out, err = cli(env, "status", TABLE)
    assert code == 0, err
    assert len([line for line in out.splitlines() if line.startswith(TABLE)]) == 2  # one row per target
    assert " 2 " in next(line for line in out.splitlines() if line.split()[:2] == [TABLE, "dr"])  # pending segs

    code, out, err = cli(env, "round", TABLE, "--target", "edge")
    assert code == 0, err
    assert out.splitlines()[0].startswith("round ") and out.splitlines()[0].endswith(": ok")
    assert "  edge: ok (FAST_FORWARD 2; copied 2 segments" in out and "\n  dr:" not in out
    assert "spark applications: 0" in out
    assert triples(env.catalog, "edge") == model.snapshot() and triples(env.catalog, "dr") == []

    code, out, err = cli(env, "round", TABLE, "--json")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["status"] == "ok" and rep["targets"]["dr"]["segments_copied"] == 2 and rep["spark_apps"] == 0
    assert rep["targets"]["edge"]["segments_copied"] == 0
    assert_replicas_equal_leader(env.catalog)

    code, out, err = cli(env, "status", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["splits"] == []
    rows = {(r["table"], r["target"]): r for r in doc["replication"]}
    assert set(rows) == {(TABLE, "dr"), (TABLE, "edge"), ("orders", "dr")}
    for site in REPLICAS:
        r = rows[(TABLE, site)]
        assert r["pending_segments"] == 0 and r["safe_time_us"] == rep["safe_time_us"][site]
        assert r["last_status"] == "ok" and r["last_round"].endswith(" ok")
    assert rows[("orders", "dr")]["safe_time_us"] is None

    aside = take_down(env, "edge")
    model.upsert(env, range(25, 30), "b")
    code, out, err = cli(env, "round", TABLE)
    assert code == 1
    assert err.strip().splitlines() == [f"segrep: error: round of {TABLE}: target(s) edge failed; re-run to retry"]
    assert "dr: ok" in out and "edge: failed" in out
    bring_up(env, "edge", aside)


ROUND_BAD_CASES = [
    (["round", "nope"], "unknown table 'nope'"),
    (["round", "../etc"], "invalid table name '../etc'"),
    (["round", TABLE, "--target", "mars"], "unknown site 'mars'"),
    (["round", TABLE, "--target", "primary"], "site 'primary' holds no replica of events"),
    (["round", TABLE, "--target", "a/b"], "invalid site name 'a/b'"),
    (["round", TABLE, "--until", "yesterday-ish"], "--until 'yesterday-ish' is not an ISO-8601 time"),
    (["round", TABLE, "--until", "2026-13-45"], "--until '2026-13-45' is not an ISO-8601 time"),
    (["status", "nope"], "unknown table 'nope'"),
]


@pytest.mark.parametrize(("args", "message"), ROUND_BAD_CASES, ids=[" ".join(c[0][1:]) for c in ROUND_BAD_CASES])
def test_cli_round_bad_input_is_one_line_and_writes_nothing(env: Env, args: list[str], message: str) -> None:
    write_batch(env.catalog, TABLE, batch(range(5), "a"))
    before = catalog_state(env, skip=())
    code, out, err = cli(env, *args)
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("segrep: error: ") and message in err, err
    assert "Traceback" not in out + err
    assert catalog_state(env, skip=()) == before
    assert not (env.root / "data" / "work").exists()


def test_outage_status_rows_name_the_failure(env: Env) -> None:
    """Without a zero retry delay the failed target is also reported as backing off."""
    write_batch(env.catalog, TABLE, batch(range(5), "a"))
    aside = take_down(env, "dr")
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert rep.failed == ["dr"]
    row = next(r for r in status_rows(env.catalog, TABLE) if r.target == "dr")
    assert status_note(row).startswith("backing off (unreachable") and row.last_status == "failed"
    bring_up(env, "dr", aside)
    held = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert held.targets["dr"].status == "backoff"
    retry = run_round(env.catalog, env.defs, TABLE, reoffer=True, submit=no_spark)
    assert retry.status == "ok"
    assert_replicas_equal_leader(env.catalog)
