"""The old leader's return after a failover with ``on_return: rollback`` (TokuMX / MongoDB rollback).

The segments a failover gave up (recorded in its ``loss``) are never pushed to the new leader. When the old
leader's site can be read again, the rows of those segments that the new leader does not hold are written to
a rollback file at that site, ``.rollback/<table>/<partition>/<failover id>-<placement id>.parquet`` (the
rows with their version, origin and tombstone flag; the footer's manifest names the table, partition,
origin site, epochs, version range and segments), and the placement's chain is rewound to the newest
segment the new leader also holds: from there it fast-forwards from the new leader like any follower,
incrementally, with no bootstrap. Nothing is deleted: the rollback file stays until ``segrep rollback drop``;
the rewound segments' files become orphans only after their rows are in the rollback file, fsynced.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from segrep.catalog import Catalog
from segrep.catalog import leases as ls
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.site_identity import open_site
from segrep.catalog.snapshot import given_up_segments, snapshot
from segrep.core import hlc
from segrep.core import schema as sch
from segrep.core.chain import visible_segments
from segrep.core.errors import NotFoundError, SegrepError
from segrep.core.projection import stamp
from segrep.data.reader import checked_read
from segrep.storage.probe import STORE_ERRORS, describe
from segrep.storage.site import Site

ROLLBACK_DIR = ".rollback"


@dataclass(frozen=True)
class RolledBack:
    """One partition's set-aside rows at the returned site, or why it could not be done yet."""

    table: str
    partition_id: int
    site: str
    relpath: str | None
    rows: int
    segments: int
    problem: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# a site still away, failing, or holding a file that is not what the catalog says: tried again next round
_UNAVAILABLE: tuple[type[Exception], ...] = (*STORE_ERRORS, SegrepError)


def rollback_relpath(table: str, partition_id: int, failover_id: int, name: int | str) -> str:
    """Where a failover's set-aside rows of one partition go at a site (``name``: the returned placement's
    id, or ``cut`` for the rows newer than a safe-time cut)."""
    return f"{ROLLBACK_DIR}/{table}/{partition_id}/{failover_id}-{name}.parquet"


def stored_rows(site: Site, relpath: str) -> int | None:
    """The rows of a rollback file written already (a re-run after a crash), from its manifest; else None."""
    return int(rollback_manifest(site, relpath)["rows"]) if site.exists(relpath) else None


def write_rollback(
    site: Site,
    relpath: str,
    rows: pa.Table,
    *,
    table: str,
    partition_id: int,
    failover_id: int,
    segments: list[m.Segment],
    min_version: int | None,
    max_version: int | None,
    **extra: Any,
) -> None:
    """Write set-aside rows atomically (fsynced, as a segment is), their manifest in the footer: table,
    partition, failover, origin site, epochs, version range, segments, rows, when."""
    meta = {
        "table": table,
        "partition_id": partition_id,
        "failover_id": failover_id,
        "origin_site": site.name,
        "epochs": sorted({seg.epoch for seg in segments}),
        "min_version": min_version,
        "max_version": max_version,
        "segment_ids": [seg.segment_id for seg in segments],
        "rows": rows.num_rows,
        "written_us": hlc.now_us(),
        **extra,
    }
    site.write_segment(relpath, rows, meta)


def roll_back_returned(catalog: Catalog, table: str) -> list[RolledBack]:
    """Set aside, at every returned old leader that can be read, the segments its failover gave up."""
    with catalog.read() as s:
        pending = _pending(s, table)
    return [_roll_back(catalog, table, *item) for item in pending]


def _pending(s: Session, table: str) -> list[tuple[int, int, int, list[str]]]:
    """(failover id, partition id, placement id, segment ids) still in a follower's list, per placement."""
    info = q.table_info(s, table)
    lost = given_up_segments(s, info.table_id)
    if not lost:
        return []
    rows = s.execute(
        select(m.Segment.placement_id, m.Segment.partition_id, m.Segment.segment_id)
        .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
        .join(m.Partition, m.Partition.partition_id == m.Segment.partition_id)
        .where(
            m.Segment.segment_id.in_(list(lost)),
            m.Placement.removed_us.is_(None),
            m.Partition.table_id == info.table_id,
            m.Partition.leader_placement_id != m.Placement.placement_id,
        )
    ).all()
    grouped: dict[tuple[int, int, int], list[str]] = {}
    for placement_id, partition_id, segment_id in rows:
        grouped.setdefault((lost[segment_id], partition_id, placement_id), []).append(segment_id)
    return [(f, p, pl, ids) for (f, p, pl), ids in sorted(grouped.items())]


def _roll_back(
    catalog: Catalog, table: str, failover_id: int, partition_id: int, placement_id: int, seg_ids: list[str]
) -> RolledBack:
    with catalog.read() as s:
        info = q.table_info(s, table)
        (part,) = snapshot(s, table, [partition_id], include_stalled=True).partitions
        placement = s.get(m.Placement, placement_id)
        assert placement is not None
        sites = q.sites_by_id(s)
        site_row, leader_site = sites[placement.site_id], sites[part.leader.site_id]
        held = {x.segment_id: x for x in part.segments.get(placement_id, [])}
        lost = [held[sid] for sid in seg_ids if sid in held]
        leader_segs = [
            part.segment(part.leader.placement_id, ref.segment_id) for ref in visible_segments(part.chain(part.leader))
        ]
        root_before = placement.root_segment_id
        chain = q.chain_of(placement, part.segments.get(placement_id, []))
    site = open_site(catalog, site_row)
    relpath = rollback_relpath(table, partition_id, failover_id, placement_id)
    try:
        written = stored_rows(site, relpath)  # a re-run after a crash reads nothing again
        if written is None:
            rows = _set_aside_rows(info, site, lost, open_site(catalog, leader_site), leader_segs)
            low = min((seg.min_version for seg in lost), default=None)
            high = max((seg.max_version for seg in lost), default=None)
            write_rollback(
                site,
                relpath,
                rows,
                table=table,
                partition_id=partition_id,
                failover_id=failover_id,
                segments=lost,
                min_version=low,
                max_version=high,
            )
            written = rows.num_rows
    except _UNAVAILABLE as exc:  # the site is still away, or a file unreadable: next round
        return RolledBack(table, partition_id, site_row.name, None, 0, len(lost), describe(exc))
    new_root = chain.without(seg_ids).root
    with catalog.write() as s:
        pl = s.get(m.Placement, placement_id, with_for_update=True)
        if pl is None or pl.root_segment_id != root_before:
            return RolledBack(table, partition_id, site_row.name, relpath, written, len(lost), "moved; retried")
        s.execute(delete(m.Segment).where(m.Segment.placement_id == placement_id, m.Segment.segment_id.in_(seg_ids)))
        ls.drop_acks(s, holders=placement_id, segments=seg_ids)
        pl.root_segment_id = new_root
        q.reset_watermarks(s, partition_id)
    return RolledBack(table, partition_id, site_row.name, relpath, written, len(lost))


def _set_aside_rows(
    info: q.TableInfo, site: Site, lost: list[m.Segment], leader: Site, leader_segs: list[m.Segment]
) -> pa.Table:
    """The rows of ``lost`` (as written: version, origin, tombstone) that the new leader does not hold, at the
    table's target schema version (the file says it: ``core.projection.stamp``)."""
    target = info.versions.target
    columns = [*info.schema.names, *sch.INTERNAL_COLUMNS]
    mine = [checked_read(info, site, seg, columns) for seg in lost]
    rows = pa.concat_tables(mine) if mine else sch.segment_schema(info.schema).empty_table()
    if rows.num_rows == 0:
        return stamp(rows, target)
    low = min(seg.min_version for seg in lost)
    keys = [*info.primary_key, sch.VERSION_COL, sch.ORIGIN_COL]
    theirs = [checked_read(info, leader, seg, keys) for seg in leader_segs if seg.max_version >= low]
    if not theirs:
        return stamp(rows, target)
    return stamp(rows.join(pa.concat_tables(theirs), keys=keys, join_type="left anti"), target)


def rollback_manifest(site: Site, relpath: str) -> dict[str, Any]:
    """The manifest of a rollback file (its footer's metadata: the same place a segment keeps its entry)."""
    return dict(site.read_meta(relpath))


@dataclass(frozen=True)
class RollbackFile:
    """A rollback file at a site and its manifest."""

    site: str
    relpath: str
    table: str
    partition_id: int
    failover_id: int
    origin_site: str
    epochs: list[int]
    min_version: int | None
    max_version: int | None
    rows: int
    written_us: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def list_rollbacks(catalog: Catalog, table: str | None = None, site: str | None = None) -> list[RollbackFile]:
    """Every rollback file at every site (or at ``site``; of ``table``, if given), with its manifest. A site
    that cannot be read is skipped by the caller's choice: this raises its error (naming the site)."""
    with catalog.read() as s:
        if table is not None:
            q.table_info(s, table)
        sites = [q.site_by_name(s, site)] if site is not None else list(q.sites_by_id(s).values())
    out = []
    for row in sorted(sites, key=lambda x: x.name):
        storage = open_site(catalog, row)
        for relpath in _rollback_files(storage, table):
            meta = rollback_manifest(storage, relpath)
            out.append(
                RollbackFile(
                    row.name,
                    relpath,
                    meta["table"],
                    meta["partition_id"],
                    meta["failover_id"],
                    meta["origin_site"],
                    meta["epochs"],
                    meta["min_version"],
                    meta["max_version"],
                    meta["rows"],
                    meta["written_us"],
                )
            )
    return out


def _rollback_files(site: Site, table: str | None) -> list[str]:
    base = f"{site.root.rstrip('/')}/{ROLLBACK_DIR}" + (f"/{table}" if table else "")
    selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
    prefix = site.root.rstrip("/") + "/"
    return sorted(
        info.path[len(prefix) :] if info.path.startswith(prefix) else info.path
        for info in site.fs.get_file_info(selector)
        if info.type == pafs.FileType.File and info.path.endswith(".parquet")
    )


def drop_rollbacks(catalog: Catalog, table: str, site: str, failover_id: int | None = None) -> list[str]:
    """Delete the rollback files of ``table`` at ``site`` (of one failover, if given); return their paths.

    An unknown table, site or failover (or one of another table) is refused by name: "nothing matched" must
    mean there was nothing to drop, not that a typo matched nothing. Only ``site`` is read: another site
    being down does not stop a drop here."""
    with catalog.read() as s:
        info = q.table_info(s, table)
        row = q.site_by_name(s, site)
        if failover_id is not None:
            known = s.scalars(
                select(m.Failover.failover_id)
                .where(m.Failover.table_id == info.table_id)
                .order_by(m.Failover.failover_id)
            ).all()
            if failover_id not in known:
                raise NotFoundError(
                    f"no failover {failover_id} of table {table}; its failovers: {', '.join(map(str, known)) or 'none'}"
                )
    storage = open_site(catalog, row)
    gone = []
    for f in list_rollbacks(catalog, table, site):
        if failover_id is None or f.failover_id == failover_id:
            storage.delete(f.relpath)
            gone.append(f.relpath)
    return gone
