"""Generated merge work: segments with chosen versions, origins and tombstones written straight into a catalog
and its sites, and a merge manifest over them, so both merge engines (Spark's ``spark.jobs`` and the
in-process ``spark.in_process``) can be fed the same manifest.

A case has one item per partition of ``mix`` (two partitions, split at ``m``): a ``merge`` of pushed segments
held by dr and edge into primary's chain (several origins, ties on ``_version``, leases held by the round,
``origin_forks``, sometimes a key range), a ``major`` of primary's chain (a tombstone cutoff, an as-of), or a
``split`` rewrite of one segment for a key range. Rows alike in key, version and origin are one write and hold
the same values wherever they occur (a real write is never two different rows).
"""

from __future__ import annotations

import datetime as dt
import math
import sqlite3
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import strategies as st
from sqlalchemy import inspect, select

from segrep.catalog import Catalog
from segrep.catalog import leases as ls
from segrep.catalog import models as m
from segrep.catalog.segments import register_segment
from segrep.catalog.site_identity import open_site
from segrep.catalog.snapshot import PartitionSnapshot, TableSnapshot, snapshot
from segrep.core import hlc
from segrep.core import schema as sch
from segrep.core.ids import new_segment_id
from segrep.core.schema_versions import FIRST_VERSION, version_of_file
from segrep.spark.items import file_ref, round_item
from segrep.spark.manifest import Manifest, MergeItem
from segrep.storage.segment_meta import SegmentEntry, entry_stats
from segrep.storage.site import segment_relpath
from tests.support.env import ORDERS_YAML, Env

TABLE = "mix"
MIX_YAML = (
    ORDERS_YAML[: ORDERS_YAML.index("tables:\n")]
    + """tables:
  mix:
    columns:
      g: string
      k: int64
      d: decimal(15,2)
      t: timestamp
      f: float64
      b: bool
      s: string
      day: date
    primary_key: [g, k]
    partition_key: g
    split_points: [m]
    leader: primary
    replicas: [dr, edge]
"""
)
GROUPS = (("a", "b", "c"), ("m", "q", "x"))  # the values of g in each partition
VERSIONS = st.integers(1, 12)  # few versions: ties on _version (broken by _origin) are common
# NaN only as the canonical quiet NaN: Spark canonicalizes a NaN's payload bits (which no reader can use) and
# Arrow keeps them, so a NaN with a payload made the engines' outputs differ in bits only (found 2026-11-28)
FLOATS = st.one_of(st.floats(allow_nan=False, allow_infinity=True, width=64), st.sampled_from([0.0, -0.0, math.nan]))


@dataclass(frozen=True)
class ItemCase:
    kind: str  # merge | major | split
    leader: list[list[dict[str, Any]]]  # primary's chain, oldest first: each segment's rows
    incoming: list[tuple[str, list[dict[str, Any]]]]  # merge and split: (holding site, rows)
    forks: dict[str, int]
    cutoff: int | None
    as_of: int | None
    key_range: tuple[str | None, str | None] | None  # merge and split: the partition_key range kept
    is_major: bool


@st.composite
def rows_of(draw: st.DrawFn, part: int, min_rows: int = 0, max_rows: int = 10) -> list[dict[str, Any]]:
    """One segment's rows: unique keys of the partition (few: segments overlap), values (nulls for a tombstone)
    drawn at random."""
    key = st.tuples(st.sampled_from(GROUPS[part]), st.integers(0, 3))
    keys = draw(st.lists(key, min_size=min_rows, max_size=max_rows, unique=True))
    out = []
    for g, k in keys:
        deleted = draw(st.booleans().map(lambda b: b and draw(st.booleans())))  # about a quarter tombstones
        row: dict[str, Any] = {"g": g, "k": k, "d": None, "t": None, "f": None, "b": None, "s": None, "day": None}
        if not deleted:
            row |= {
                "d": Decimal(draw(st.integers(-(10**12), 10**12))) / 100,
                "t": draw(st.none() | st.datetimes(dt.datetime(1900, 1, 1), dt.datetime(2200, 1, 1))),
                "f": draw(st.none() | FLOATS),
                "b": draw(st.none() | st.booleans()),
                "s": draw(st.none() | st.text(max_size=6)),
                "day": draw(st.dates(dt.date(1900, 1, 1), dt.date(2200, 1, 1))),
            }
            if row["t"] is not None:
                row["t"] = row["t"].replace(tzinfo=dt.UTC)
        row |= {
            sch.VERSION_COL: draw(VERSIONS),
            sch.DELETED_COL: deleted,
            sch.ORIGIN_COL: draw(st.sampled_from([1, 2, 3])),
        }
        out.append(row)
    return out


@st.composite
def item_cases(draw: st.DrawFn, part: int) -> ItemCase:
    kind = draw(st.sampled_from(["merge", "merge", "major", "split"]))
    leader = draw(st.lists(rows_of(part), min_size=0 if kind == "merge" else 1, max_size=3))
    incoming: list[tuple[str, list[dict[str, Any]]]] = []
    if kind != "major":
        many = 1 if kind == "split" else 3
        pushed = st.tuples(st.sampled_from(["dr", "edge"]), rows_of(part, min_rows=2))
        incoming = draw(st.lists(pushed, min_size=many, max_size=many))  # a merge: three pushed segments
    forks = draw(st.dictionaries(st.sampled_from(["1", "2", "3"]), VERSIONS, min_size=1)) if kind == "merge" else {}
    key_range = None
    if kind == "split" or (kind == "merge" and draw(st.booleans())):
        bounds = st.none() | st.sampled_from(GROUPS[part])
        key_range = (draw(bounds), draw(bounds))
    return ItemCase(
        kind,
        leader,
        incoming,
        forks,
        draw(st.none() | VERSIONS) if kind == "major" else None,
        draw(st.none() | VERSIONS) if kind == "major" else None,
        key_range,
        draw(st.booleans()),
    )


@st.composite
def cases(draw: st.DrawFn) -> list[ItemCase | None]:
    """An item for each partition, or none for one of them (never for both)."""
    first, second = draw(st.none() | item_cases(0)), draw(st.none() | item_cases(1))
    return [first, second] if first or second else [draw(item_cases(0)), None]


def one_write_one_row(case: list[ItemCase | None]) -> list[ItemCase | None]:
    """Rows alike in key, version and origin get the values of the first of them (one write, one row)."""
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}

    def same(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for row in rows:
            ident = (row["g"], row["k"], row[sch.VERSION_COL], row[sch.ORIGIN_COL])
            out.append(seen.setdefault(ident, row))
        return out

    return [
        None
        if c is None
        else replace(c, leader=[same(r) for r in c.leader], incoming=[(site, same(r)) for site, r in c.incoming])
        for c in case
    ]


def write_case(env: Env, case: list[ItemCase | None], key: str) -> Manifest:
    """Write the case's segments and register them (leases held by ``key`` for what a merge pushes); the
    manifest of its items."""
    with env.catalog.read() as s:
        snap = snapshot(s, TABLE)
    items = []
    for part, spec in zip(snap.partitions, case, strict=True):
        if spec is None:
            continue
        for rows in spec.leader:
            add_segment(env.catalog, snap, part, part.leader, rows)
        held = []
        for site, rows in spec.incoming:
            placement = next(p for p in part.replicas if snap.sites[p.site_id].name == site)
            held.append((placement, add_segment(env.catalog, snap, part, placement, rows)))
        if spec.kind == "merge":
            with env.catalog.write() as s:
                for _placement, seg_id in held:
                    ls.acquire(s, part.leader.placement_id, seg_id, key, hlc.now_us() + 3600 * 10**6)
        items.append((part.partition.partition_id, spec, held))
    with env.catalog.read() as s:
        snap = snapshot(s, TABLE)
    return Manifest(key, [_item(snap, key, pid, spec, held) for pid, spec, held in items])


def _item(snap: TableSnapshot, key: str, pid: int, spec: ItemCase, held: list[tuple[m.Placement, str]]) -> MergeItem:
    part = next(p for p in snap.partitions if p.partition.partition_id == pid)
    refs = [file_ref(snap.sites[pl.site_id], pl, part.segment(pl.placement_id, seg_id)) for pl, seg_id in held]
    item = round_item(snap, part, key, "major" if spec.kind == "major" else "merge", refs)
    ranged: dict[str, Any] = {}
    if spec.key_range is not None:
        ranged = {"partition_key": "g", "partition_begin": spec.key_range[0], "partition_end": spec.key_range[1]}
    if spec.kind == "merge":
        return replace(item, origin_forks=spec.forks, **ranged)
    if spec.kind == "major":
        return replace(item, tombstone_cutoff_us=spec.cutoff, as_of_us=spec.as_of)
    included = [r.segment_id for r in item.visible][:2]
    return replace(item, kind="split", is_major=spec.is_major, included_segment_ids=included, **ranged)


def add_segment(
    catalog: Catalog,
    snap: TableSnapshot,
    part: PartitionSnapshot,
    placement: m.Placement,
    rows: list[dict[str, Any]],
    layout: pa.Schema | None = None,
) -> str:
    """A segment of ``rows`` at the placement's site, registered on top of its chain; its id. ``layout`` is
    the file's schema (default: the table's segment layout, without schema metadata)."""
    info = snap.info
    table = pa.Table.from_pylist(rows, schema=layout or sch.segment_schema(info.schema))
    site_row = snap.sites[placement.site_id]
    with catalog.read() as s:
        root = s.get(m.Placement, placement.placement_id).root_segment_id  # type: ignore[union-attr]
    entry = SegmentEntry(
        segment_id=new_segment_id(),
        table=info.name,
        partition_id=part.partition.partition_id,
        base_segment_id=root,
        is_major=False,
        origin_site_id=site_row.site_id,
        epoch=part.partition.epoch,
        schema_fingerprint=info.row.schema_fingerprint,
        schema_version=stated.version if (stated := version_of_file(table.schema)) else FIRST_VERSION,
        partition_begin=part.partition.begin_key,
        partition_end=part.partition.end_key,
        **entry_stats(table, info.primary_key),
    )
    relpath = segment_relpath(info.name, part.partition.partition_id, entry.segment_id)
    facts = open_site(catalog, site_row).write_segment(relpath, table, entry.to_meta())
    with catalog.write() as s:
        pl = s.get(m.Placement, placement.placement_id)
        assert pl is not None
        register_segment(s, pl, entry, relpath, facts, hlc.now_us(), expected_root=root)
        partition = s.get(m.Partition, part.partition.partition_id)
        assert partition is not None
        partition.last_version = max(partition.last_version, entry.max_version)
    return entry.segment_id


CATALOG_TABLES = (m.Partition, m.Placement, m.Segment, m.Ack, m.Lease)


def catalog_state(catalog: Catalog) -> dict[str, list[tuple[Any, ...]]]:
    """The rows a commit may change, without the times it stamps (``*_us`` columns but the versions)."""
    out = {}
    with catalog.read() as s:
        for model in CATALOG_TABLES:
            cols = [c for c in inspect(model).columns if not c.name.endswith("_us")]
            out[model.__tablename__] = sorted((tuple(row) for row in s.execute(select(*cols)).all()), key=repr)
    return out


def copy_catalog(url: str, to: Path) -> None:
    """A consistent copy of a SQLite catalog (the backup API: no half-written page)."""
    path = url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as src, sqlite3.connect(to) as dst:
        src.backup(dst)


def restore_catalog(catalog: Catalog, url: str, backup: Path) -> None:
    catalog.dispose()
    path = url.removeprefix("sqlite:///")
    with sqlite3.connect(backup) as src, sqlite3.connect(path) as dst:
        src.backup(dst)
