"""Rebuild a site's segment lists from its files (DESIGN section 4: a site is self-describing).

Each segment file's footer carries its catalog entry. For every placement at the site, the segment rows are
replaced by what the files say, in chain order (a segment after its base), and the root is the head of the
chain: the segment no other segment builds on or includes. Acks are not stored in files and are left as
they are (a later round re-learns any that are missing through SEGMENT_EXISTS). The whole rebuild is one
transaction; files that do not belong to a known placement are reported and make it refuse.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import delete, select

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.segments import segment_row
from segrep.core.errors import CorruptSegmentError, RefusedError, SegrepError
from segrep.storage.atomic import FileFacts
from segrep.storage.segment_meta import SegmentEntry
from segrep.storage.site import Site


@dataclass
class RebuildReport:
    site: str
    dry_run: bool
    placements: dict[int, tuple[int, str | None]] = field(default_factory=dict)  # id -> (segments, root)
    forks: dict[int, list[str]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        verb = "would rebuild" if self.dry_run else "rebuilt"
        out = [f"{verb} {len(self.placements)} placement(s) at site {self.site}"]
        for pid, (n, root) in sorted(self.placements.items()):
            out.append(f"  placement {pid}: {n} segment(s), root {root or 'NULL'}")
            for fork in self.forks.get(pid, []):
                out.append(f"    fork head {fork} (not on the chain; the leader procedure merges it)")
        return out


def rebuild_site(catalog: Catalog, site_name: str, *, dry_run: bool = False) -> RebuildReport:
    with catalog.read() as s:
        site_row = q.site_by_name(s, site_name)
        site = Site(site_row.name, site_row.uri)
        placements = {
            (pl.partition_id): pl
            for pl in s.scalars(
                select(m.Placement).where(m.Placement.site_id == site_row.site_id, m.Placement.removed_us.is_(None))
            )
        }
        tables = {t.table_id: t.name for t in s.scalars(select(m.Table))}
        parts = {p.partition_id: p for p in s.scalars(select(m.Partition))}
    found: dict[int, list[tuple[SegmentEntry, str, FileFacts, int]]] = defaultdict(list)
    problems: list[str] = []
    for relpath in site.list_segment_files():
        try:
            entry = SegmentEntry.from_meta(site.read_meta(relpath))
        except (CorruptSegmentError, ValueError, TypeError, KeyError) as exc:
            problems.append(f"{relpath}: unreadable segment metadata ({exc})")
            continue
        part = parts.get(entry.partition_id)
        pl = placements.get(entry.partition_id)
        expected = f"{entry.table}/{entry.partition_id}/{entry.segment_id}.parquet"
        if relpath != expected:
            problems.append(f"{relpath}: metadata says it is {expected}")
        elif part is None or tables.get(part.table_id) != entry.table:
            problems.append(f"{relpath}: table {entry.table} has no partition {entry.partition_id} in the catalog")
        elif pl is None:
            problems.append(f"{relpath}: site {site_name} holds no placement of partition {entry.partition_id}")
        else:
            info = site.fs.get_file_info(site.path(relpath))
            mtime_us = int(info.mtime_ns // 1000) if info.mtime_ns else 0
            found[pl.placement_id].append((entry, relpath, site.facts(relpath), mtime_us))
    if problems:
        raise RefusedError(f"cannot rebuild site {site_name}: " + "; ".join(problems[:10]))

    report = RebuildReport(site=site_name, dry_run=dry_run)
    ordered: dict[int, list[tuple[SegmentEntry, str, FileFacts, int]]] = {}
    roots: dict[int, str | None] = {}
    for pl in placements.values():
        items = found.get(pl.placement_id, [])
        ordered[pl.placement_id] = _chain_order(items)
        heads = _heads([e for e, *_ in items])
        heads.sort(key=lambda e: (e.max_version, e.segment_id))
        roots[pl.placement_id] = heads[-1].segment_id if heads else None
        report.placements[pl.placement_id] = (len(items), roots[pl.placement_id])
        if len(heads) > 1:
            report.forks[pl.placement_id] = [h.segment_id for h in heads[:-1]]
    if dry_run:
        return report
    with catalog.write() as s:
        for pl in placements.values():
            s.execute(delete(m.Segment).where(m.Segment.placement_id == pl.placement_id))
            for entry, relpath, facts, mtime_us in ordered[pl.placement_id]:
                s.add(segment_row(entry, pl.placement_id, relpath, facts, mtime_us))
            s.flush()
            row = s.get(m.Placement, pl.placement_id)
            if row is None:
                raise SegrepError(f"placement {pl.placement_id} vanished during the rebuild")
            row.root_segment_id = roots[pl.placement_id]
    return report


def _heads(entries: list[SegmentEntry]) -> list[SegmentEntry]:
    """Segments that nothing else in the list builds on or includes: candidate roots."""
    covered = {e.base_segment_id for e in entries} | {i for e in entries for i in e.included_segment_ids}
    return [e for e in entries if e.segment_id not in covered]


def _chain_order(
    items: list[tuple[SegmentEntry, str, FileFacts, int]],
) -> list[tuple[SegmentEntry, str, FileFacts, int]]:
    """Order segments so each comes after its base (Kahn's algorithm; ties by version, then id)."""
    by_id = {it[0].segment_id: it for it in items}
    children: dict[str, list[str]] = defaultdict(list)
    ready: list[tuple[int, str]] = []
    for entry, *_ in items:
        if entry.base_segment_id in by_id:
            children[entry.base_segment_id].append(entry.segment_id)
        else:
            heapq.heappush(ready, (entry.min_version, entry.segment_id))
    out = []
    while ready:
        _, sid = heapq.heappop(ready)
        out.append(by_id[sid])
        for child in children[sid]:
            heapq.heappush(ready, (by_id[child][0].min_version, child))
    return out
