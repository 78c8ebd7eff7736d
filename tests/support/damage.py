"""Damage planted at a site for the verify and repair tests: files flipped, truncated, deleted or swapped, a
segment rewritten with other rows (its footer and catalog row made to match, so only a comparison with the
leader can tell), and a segment taken out of a replica's list while its acks stay (a chain the protocol
believes complete)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import select, update

from segrep.catalog import models as m
from segrep.storage.segment_meta import entry_stats
from segrep.storage.site import Site
from tests.support.env import Env
from tests.support.tables import TABLE


@dataclass(frozen=True)
class Copy:
    site: str
    partition_id: int
    segment_id: str
    relpath: str
    path: Path
    placement_id: int


def copies_at(env: Env, site: str, table: str = TABLE) -> list[Copy]:
    """Every segment copy the catalog lists at ``site`` for ``table``, in list order."""
    with env.catalog.read() as s:
        rows = s.execute(
            select(m.Segment, m.Placement.placement_id)
            .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
            .join(m.Site, m.Site.site_id == m.Placement.site_id)
            .join(m.Partition, m.Partition.partition_id == m.Placement.partition_id)
            .join(m.Table, m.Table.table_id == m.Partition.table_id)
            .where(m.Site.name == site, m.Table.name == table, m.Placement.removed_us.is_(None))
            .order_by(m.Segment.entry_id)
        ).all()
    return [
        Copy(site, seg.partition_id, seg.segment_id, seg.relpath, env.site_dir(site) / seg.relpath, pid)
        for seg, pid in rows
    ]


def copy_holding(env: Env, site: str, key: int) -> Copy:
    """The oldest copy at ``site`` whose file holds a row with ``seq == key``."""
    return next(c for c in copies_at(env, site) if key in pq.read_table(c.path, columns=["seq"]).column(0).to_pylist())


def flip_bit(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def delete(path: Path) -> None:
    path.unlink()


def swap(a: Path, b: Path) -> None:
    tmp = a.with_name(a.name + ".swap")
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)


def rewrite_segment(env: Env, copy: Copy, change: Callable[[pa.Table], pa.Table], table: str = TABLE) -> None:
    """Rewrite one copy's file with ``change(rows)`` (segment layout), its footer entry and its catalog row made
    to match: every check of that copy alone passes."""
    with env.catalog.read() as s:
        site_row = s.scalars(select(m.Site).where(m.Site.name == copy.site)).one()
        pk = list(s.scalars(select(m.Table.primary_key).where(m.Table.name == table)).one())
    site = Site(site_row.name, site_row.uri)
    meta = site.read_meta(copy.relpath)
    rows = change(pq.read_table(copy.path).replace_schema_metadata(None))
    stats = entry_stats(rows, pk)
    facts = site.write_segment(copy.relpath, rows, {**meta, **stats})
    with env.catalog.write() as s:
        s.execute(
            update(m.Segment)
            .where(m.Segment.placement_id == copy.placement_id, m.Segment.segment_id == copy.segment_id)
            .values(byte_size=facts.byte_size, sha256=facts.sha256, crc64nvme=facts.crc64nvme, **stats)
        )


def change_payload(key: int, payload: str) -> Callable[[pa.Table], pa.Table]:
    def change(rows: pa.Table) -> pa.Table:
        seq = rows.column("seq").to_pylist()
        values = rows.column("payload").to_pylist()
        values[seq.index(key)] = payload
        return rows.set_column(rows.schema.get_field_index("payload"), "payload", pa.array(values, pa.string()))

    return change


def drop_row(key: int) -> Callable[[pa.Table], pa.Table]:
    def change(rows: pa.Table) -> pa.Table:
        seq = rows.column("seq").to_pylist()
        return rows.filter(pa.array([k != key for k in seq]))

    return change


def add_row_like(key: int, new_key: int) -> Callable[[pa.Table], pa.Table]:
    """A row for ``new_key`` (same tenant and version as ``key``'s row, so the same file keeps it in range)."""

    def change(rows: pa.Table) -> pa.Table:
        seq = rows.column("seq").to_pylist()
        extra = rows.slice(seq.index(key), 1).to_pylist()[0]
        extra.update({"seq": new_key, "payload": f"extra{new_key}"})
        out = pa.concat_tables([rows, pa.Table.from_pylist([extra], schema=rows.schema)])
        return out.sort_by([("tenant", "ascending"), ("seq", "ascending")])

    return change


def forget_root(env: Env, site: str, partition_id: int) -> str:
    """Take the newest segment out of the placement's list at ``site`` (root back to its base), leaving the
    leader's acks: rounds think the replica holds it. Returns its id."""
    with env.catalog.write() as s:
        pl = s.scalars(
            select(m.Placement)
            .join(m.Site, m.Site.site_id == m.Placement.site_id)
            .where(m.Site.name == site, m.Placement.partition_id == partition_id, m.Placement.removed_us.is_(None))
        ).one()
        root = s.scalars(
            select(m.Segment).where(
                m.Segment.placement_id == pl.placement_id, m.Segment.segment_id == pl.root_segment_id
            )
        ).one()
        gone = root.segment_id
        pl.root_segment_id = root.base_segment_id
        s.delete(root)
    return gone
