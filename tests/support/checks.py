"""Reads of what the catalog and the sites hold, and the invariants of DESIGN section 9 checked on them."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import func, select

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.models import Base
from segrep.core.chain import Chain, referenced_ids, visible_segments
from segrep.data.reader import read_table
from tests.support.env import Env
from tests.support.tables import REPLICAS, TABLE

# What a catalog rebuild must restore of each list entry: everything but the entry id and commit time.
SEGMENT_FIELDS = (
    "placement_id",
    "segment_id",
    "partition_id",
    "base_segment_id",
    "included_segment_ids",
    "is_major",
    "row_count",
    "deleted_rows",
    "byte_size",
    "sha256",
    "crc64nvme",
    "min_version",
    "max_version",
    "key_min",
    "key_max",
    "origin_site_id",
    "epoch",
    "schema_fingerprint",
    "relpath",
)


def segment_facts(seg: m.Segment) -> tuple[Any, ...]:
    return tuple(getattr(seg, f) for f in SEGMENT_FIELDS)


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


def assert_files_match_catalog(env: Env, away: Mapping[str, Path] | None = None) -> None:
    """Invariant 1: every committed segment file exists with the sha256 the catalog recorded (a site that is
    down, ``away``, is read where its directory was moved to)."""
    moved = away or {}
    with env.catalog.read() as s:
        rows = s.execute(
            select(m.Site.name, m.Segment.relpath, m.Segment.sha256, m.Segment.byte_size)
            .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
            .join(m.Site, m.Site.site_id == m.Placement.site_id)
        ).all()
    for site, relpath, sha, size in rows:
        data = (moved.get(site, env.site_dir(site)) / relpath).read_bytes()
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
        rows = {
            t.name: sorted(map(repr, s.execute(select(t)).all()))
            for t in Base.metadata.sorted_tables
            if t.name not in skip
        }
    rows["files"] = sorted(
        f"{p.relative_to(env.root)} {hashlib.sha256(p.read_bytes()).hexdigest()}"
        for p in (env.root / "data" / "sites").rglob("*")
        if p.is_file()
    )
    return rows


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


def chain_before_cut(
    env: Env, table: str, site: str, cut_partitions: Iterable[int]
) -> tuple[set[str], dict[tuple[Any, ...], list[int]]]:
    """What a failover's cut read at its new leader ``site``: the segment ids the chain references, and per
    primary key the versions of the rows its visible segments hold (tombstones too). Taken after the cut from
    the catalog: in ``cut_partitions`` the chain is read from the cut major's base, i.e. as it was when the
    cut read it."""
    cut = set(cut_partitions)
    with env.catalog.read() as s:
        info = q.table_info(s, table)
        site_id = q.site_by_name(s, site).site_id
        pids = [p.partition_id for p in q.serving_partitions(s, info)]
        placements = [pl for pl in q.active_placements(s, pids) if pl.site_id == site_id]
        lists = q.segments_of(s, [pl.placement_id for pl in placements])
    referenced: set[str] = set()
    versions: dict[tuple[Any, ...], list[int]] = {}
    pk = list(info.primary_key)
    for pl in placements:
        segs = lists[pl.placement_id]
        by_id = {seg.segment_id: seg for seg in segs}
        root = pl.root_segment_id
        if pl.partition_id in cut and root is not None:
            root = by_id[root].base_segment_id
        chain = Chain.of((q.to_ref(seg) for seg in segs), root)
        referenced |= referenced_ids(chain)
        for ref in visible_segments(chain):
            t = pq.read_table(env.site_dir(site) / by_id[ref.segment_id].relpath, columns=[*pk, "_version"])
            for *key, version in zip(*(t[c].to_pylist() for c in (*pk, "_version")), strict=True):
                versions.setdefault(tuple(key), []).append(version)
    return referenced, versions


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


def leaders(catalog: Catalog, table: str = TABLE) -> dict[int, tuple[str, int]]:
    """Partition id -> (leader site, epoch) of the table's partitions that have a leader."""
    with catalog.read() as s:
        rows = s.execute(
            select(m.Partition.partition_id, m.Site.name, m.Partition.epoch)
            .join(m.Placement, m.Placement.placement_id == m.Partition.leader_placement_id)
            .join(m.Site, m.Site.site_id == m.Placement.site_id)
            .join(m.Table, m.Table.table_id == m.Partition.table_id)
            .where(m.Table.name == table)
        )
        return {pid: (site, epoch) for pid, site, epoch in rows}
