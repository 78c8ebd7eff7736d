"""Garbage collection with retention (DESIGN sections 6, 7, 9.7; EventQL 3.5 and 3.7; xCluster log retention).

What may go, per placement of each partition:
- leader: a weakly referenced segment once a major covering it is acked by every LIVE or JOINING replica
  (:func:`segrep.core.chain.leader_action`); a fork at the leader is never deleted (rounds merge it);
- follower: a segment the leader holds that is no longer strongly referenced here
  (:func:`segrep.core.chain.follower_action`); one the leader lacks is kept (it will be pushed);
- a REMOVED placement (replaced or re-bootstrapped): every segment the leader holds or acked;
- orphan files (on storage, unknown to the catalog, temporary names of crashed writes) older than the grace;
  on an S3 site also the incomplete multipart uploads a killed copy or write left, older than the grace.
An offline replica holds GC for up to the table's ``max_retention_s`` (measured from its last ack); past that
it is marked ``needs_bootstrap``, stops holding GC, gets no more offers and ``segrep status`` says so.

Each partition is decided and its catalog rows deleted in one transaction under the partition's row lock
(the same lock offers and commits take), and only then are files removed: a crash leaves orphans, which a
later run removes, never a catalog row pointing at a missing file. A file is removed only when no catalog row
at that site still references its path, and (an open table, ``policy: {publish: iceberg}``) the site's current
published snapshot does not list it: a publication that failed or has not run yet leaves that snapshot what
engines read (``publish.published_files``; a snapshot that cannot be read keeps every file of the table there).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs
from sqlalchemy import delete, func, select

from segrep.catalog import Catalog
from segrep.catalog import leases as ls
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.site_identity import open_site
from segrep.catalog.snapshot import PartitionSnapshot, snapshot
from segrep.config.definitions import Definitions, Policy
from segrep.core import hlc
from segrep.core.chain import LocalAction, follower_action, is_referenced, leader_action
from segrep.publish.policy import enabled
from segrep.storage.s3 import abort_stale_uploads
from segrep.storage.site import Site
from segrep.storage.stores import STORE_ERRORS, first_line

if TYPE_CHECKING:
    from segrep.publish.published_files import PublishedFiles

_TMP_RE = re.compile(r"\.[0-9a-f]{32}\.parquet\.tmp-[0-9a-f]+")


@dataclass(frozen=True)
class Deletion:
    site: str
    relpath: str
    reason: str
    placement_id: int | None = None  # None: an orphan file
    segment_id: str | None = None


@dataclass
class GcReport:
    deletions: list[Deletion] = field(default_factory=list)
    held: list[str] = field(default_factory=list)  # why something that looks collectable stays
    needs_bootstrap: list[str] = field(default_factory=list)
    files_removed: int = 0
    uploads_aborted: list[str] = field(default_factory=list)  # site:relpath of incomplete S3 uploads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _acked_by_all(part: PartitionSnapshot, replicas: Iterable[m.Placement]) -> set[str]:
    ids = [r.placement_id for r in replicas]
    lid = part.leader.placement_id
    return {
        seg.segment_id
        for seg in part.segments.get(lid, [])
        if all(r in part.acks.get((lid, seg.segment_id), ()) for r in ids)
    }


def _last_ack_us(s: Any, leader_id: int, replica: m.Placement) -> int:
    last = s.scalar(
        select(func.max(m.Ack.acked_us)).where(
            m.Ack.holder_placement_id == leader_id, m.Ack.target_placement_id == replica.placement_id
        )
    )
    return int(last or replica.created_us)


def decide_partition(
    s: Any, part: PartitionSnapshot, sites: dict[int, m.Site], policy: Policy, now: int, report: GcReport
) -> list[Deletion]:
    """What this partition lets go of (and which replicas fall out of retention), without changing anything."""
    leader = part.leader
    chain = part.chain(leader)
    holding: list[m.Placement] = []
    would_go = {
        seg.segment_id
        for seg in part.segments.get(leader.placement_id, [])
        if leader_action(chain, seg.segment_id, _acked_by_all(part, [])) == LocalAction.DELETE
    }
    for replica in part.replicas:
        if replica.needs_bootstrap:
            continue  # already out of retention: it will be re-bootstrapped from the newest major
        # What it holds: what the leader saw it ack, and what its own list has (the same segment ids; after a
        # leader change the new leader has acks for nothing yet). What it still needs of what would go: a
        # segment none of whose covering majors it holds (one it never got because it took the major instead
        # needs nothing).
        holds = _acked_by_all(part, [replica]) | {x.segment_id for x in part.segments.get(replica.placement_id, [])}
        needed = {seg for seg in would_go if leader_action(chain, seg, holds) != LocalAction.DELETE}
        if not needed:
            holding.append(replica)  # it needs nothing that would otherwise go: holding it costs nothing
            continue
        age_s = (now - _last_ack_us(s, leader.placement_id, replica)) / 1e6
        name = sites[replica.site_id].name
        if age_s > policy.max_retention_s:
            report.needs_bootstrap.append(
                f"partition {part.partition.partition_id} at {name} (placement {replica.placement_id}): no ack "
                f"for {age_s:.0f} s > max_retention_s {policy.max_retention_s}; it needs a bootstrap"
            )
            replica.needs_bootstrap = True
            continue
        holding.append(replica)
        report.held.append(
            f"partition {part.partition.partition_id}: {len(needed)} segment(s) held for {name} "
            f"(last ack {age_s:.0f} s ago, retention {policy.max_retention_s} s)"
        )
    acked_all = _acked_by_all(part, holding)
    out: list[Deletion] = []
    lsite = sites[leader.site_id].name
    for seg in part.segments.get(leader.placement_id, []):
        action = leader_action(chain, seg.segment_id, acked_all)
        if action == LocalAction.DELETE:
            out.append(
                Deletion(
                    lsite,
                    seg.relpath,
                    "leader: weakly referenced, its covering major is acked by every replica",
                    leader.placement_id,
                    seg.segment_id,
                )
            )
    leader_has = {x.segment_id for x in part.segments.get(leader.placement_id, [])}
    for replica in part.replicas:
        fchain = part.chain(replica)
        rsite = sites[replica.site_id].name
        for seg in part.segments.get(replica.placement_id, []):
            acked = seg.segment_id in leader_has or leader.placement_id in part.acks.get(
                (replica.placement_id, seg.segment_id), ()
            )
            if follower_action(fchain, seg.segment_id, acked) == LocalAction.DELETE:
                if _local_write_still_read(s, part, replica, fchain, seg):
                    continue
                out.append(
                    Deletion(
                        rsite,
                        seg.relpath,
                        "follower: the leader holds it and it is no longer strongly referenced here",
                        replica.placement_id,
                        seg.segment_id,
                    )
                )
    return out


def _local_write_still_read(s: Any, part: PartitionSnapshot, replica: m.Placement, chain: Any, seg: m.Segment) -> bool:
    """A write made at this site (active-active) that its chain does not reference yet is part of what the
    site reads (read-your-writes) until the site holds the leader's merge of it: kept while the site's safe
    time is before the write (then every write up to it, this one's winners included, is on its chain)."""
    if seg.origin_site_id != replica.site_id or is_referenced(chain, seg.segment_id):
        return False
    safe = s.scalar(
        select(m.SafeTime.safe_time_us).where(
            m.SafeTime.table_id == part.partition.table_id, m.SafeTime.site_id == replica.site_id
        )
    )
    return safe is None or safe < seg.max_version


def _removed_placements(s: Any, part: PartitionSnapshot, sites: dict[int, m.Site], report: GcReport) -> list[Deletion]:
    removed = list(
        s.scalars(
            select(m.Placement).where(
                m.Placement.partition_id == part.partition.partition_id, m.Placement.removed_us.is_not(None)
            )
        )
    )
    if not removed:
        return []
    lid = part.leader.placement_id
    leader_has = {x.segment_id for x in part.segments.get(lid, [])}
    segs = q.segments_of(s, [pl.placement_id for pl in removed])
    acks = q.acks_of(s, [pl.placement_id for pl in removed])
    out = []
    for pl in removed:
        for seg in segs.get(pl.placement_id, []):
            if seg.segment_id in leader_has or lid in acks.get((pl.placement_id, seg.segment_id), ()):
                out.append(
                    Deletion(
                        sites[pl.site_id].name,
                        seg.relpath,
                        "removed placement: the leader holds it",
                        pl.placement_id,
                        seg.segment_id,
                    )
                )
            else:
                report.held.append(
                    f"segment {seg.segment_id} of removed placement {pl.placement_id}: the leader "
                    "lacks it (kept; a bootstrap with mode replace moved such data aside)"
                )
    return out


def collect(
    catalog: Catalog, defs: Definitions, table: str | None = None, *, dry_run: bool = False, now_us: int | None = None
) -> GcReport:
    """Run GC for one table or all; ``dry_run`` reports every file that would go, and why, changing nothing."""
    now = hlc.now_us() if now_us is None else now_us
    report = GcReport()
    with catalog.read() as s:
        names = [table] if table else list(s.scalars(select(m.Table.name).order_by(m.Table.name)))
        sites = q.sites_by_id(s)
        pids = {name: [p.partition_id for p in q.partitions_of(s, q.table_info(s, name))] for name in names}
    published = _Published(catalog, defs, sites)
    for name in names:
        policy = defs.policy(name)
        for pid in pids[name]:
            deletions = _partition_pass(catalog, name, pid, sites, policy, now, dry_run, report)
            report.deletions.extend(deletions)
            if not dry_run:
                report.files_removed += _remove_files(catalog, deletions, sites, report, published)
    orphan_sites = {site.site_id for site in sites.values()}
    for site_id in sorted(orphan_sites):
        site_row = sites[site_id]
        site = open_site(catalog, site_row)
        orphans = _orphans(catalog, site, site_id, names, now, defs, table, report)
        report.deletions.extend(orphans)
        _stale_uploads(site, names, now, defs, dry_run, report)
        if not dry_run:
            report.files_removed += _remove_files(catalog, orphans, sites, report, published)
    return report


def _partition_pass(
    catalog: Catalog,
    table: str,
    pid: int,
    sites: dict[int, m.Site],
    policy: Policy,
    now: int,
    dry_run: bool,
    report: GcReport,
) -> list[Deletion]:
    with catalog.write() as s:
        s.get(m.Partition, pid, with_for_update=True)
        snap = snapshot(s, table, [pid], include_stalled=True)
        if not snap.partitions:
            return []
        part = snap.partitions[0]
        deletions = decide_partition(s, part, sites, policy, now, report)
        deletions += _removed_placements(s, part, sites, report)
        if dry_run:
            s.rollback()
            return deletions
        for d in deletions:
            ls.drop_acks(s, holders=d.placement_id, segments=d.segment_id)
            s.execute(
                delete(m.Segment)
                .where(m.Segment.placement_id == d.placement_id, m.Segment.segment_id == d.segment_id)
                .execution_options(synchronize_session=False)
            )
    return deletions


class _Published:
    """Per table and site, the files the site's current published snapshot lists (read once per run): an
    open table's readers keep reading it until the next publication, which a failure may hold up."""

    def __init__(self, catalog: Catalog, defs: Definitions, sites: dict[int, m.Site]) -> None:
        self._catalog, self._defs = catalog, defs
        self._sites = {site.name: site for site in sites.values()}
        self._read: dict[tuple[str, str], PublishedFiles] = {}

    def keeps(self, d: Deletion) -> str | None:
        """Why ``d``'s file stays, or None. A segment's path begins with its table's name."""
        table = d.relpath.split("/", 1)[0]
        if table not in self._defs.tables or not enabled(self._defs, table):
            return None
        key = (table, d.site)
        if key not in self._read:
            # Imported by the first table that publishes: it brings pyiceberg (0.4 s), which a GC of tables
            # that do not publish never uses.
            from segrep.publish.published_files import published_files

            site = self._sites[d.site]
            self._read[key] = published_files(self._catalog, site, table, self._defs.iceberg_catalog)
        files = self._read[key]
        if files.unknown is not None:
            return f"the published snapshot of {table} at {d.site} could not be read ({files.unknown})"
        if d.relpath in files.relpaths:
            return f"the current published snapshot of {table} at {d.site} lists it (its next publication frees it)"
        return None


def _remove_files(
    catalog: Catalog,
    deletions: list[Deletion],
    sites: dict[int, m.Site],
    report: GcReport | None = None,
    published: _Published | None = None,
) -> int:
    """Delete files no catalog row at their site references any more (the rows went first) and no current
    published snapshot lists. A site that cannot be reached keeps its files (now orphans, removed by a later
    run); the other sites go on. A file a published snapshot lists is also left as an orphan."""
    by_name = {site.name: site for site in sites.values()}
    removed = 0
    for d in deletions:
        site = by_name[d.site]
        kept = None if published is None else published.keeps(d)
        if kept is not None:
            held = f"{d.site}:{d.relpath} kept: {kept}"
            if report is not None and held not in report.held:  # a kept file is an orphan in the same run
                report.held.append(held)
            continue
        with catalog.read() as s:
            still = s.scalar(
                select(func.count())
                .select_from(m.Segment)
                .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
                .where(m.Placement.site_id == site.site_id, m.Segment.relpath == d.relpath)
            )
        if not still:
            try:
                open_site(catalog, site).delete(d.relpath)
            except OSError as exc:
                if report is not None:
                    report.held.append(
                        f"{d.site}:{d.relpath} not removed ({type(exc).__name__}: {exc}); a later "
                        "run removes it as an orphan"
                    )
                continue
            removed += 1
    return removed


def _stale_uploads(site: Site, tables: list[str], now: int, defs: Definitions, dry_run: bool, report: GcReport) -> None:
    """Abort the incomplete multipart uploads under an S3 site's table prefixes older than the orphan grace."""
    if site.s3 is None:
        return
    for name in tables:
        cutoff = now - int(defs.policy(name).orphan_grace_s * 1_000_000)
        try:
            aborted = abort_stale_uploads(site.s3, name, cutoff, dry_run=dry_run)
        except STORE_ERRORS as exc:  # the site is down or refuses: its uploads wait for a later run
            report.held.append(f"incomplete uploads at {site.name} not listed ({first_line(exc)})")
            continue
        report.uploads_aborted += [f"{site.name}:{rel}" for rel in aborted]


def _orphans(
    catalog: Catalog,
    site: Site,
    site_id: int,
    tables: list[str],
    now: int,
    defs: Definitions,
    only: str | None,
    report: GcReport | None = None,
) -> list[Deletion]:
    """Files under the site's table directories that the catalog does not know, older than the grace."""
    with catalog.read() as s:
        known = set(
            s.scalars(
                select(m.Segment.relpath)
                .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
                .where(m.Placement.site_id == site_id)
            )
        )
    out = []
    for name in tables:
        grace_s = (defs.policy(name)).orphan_grace_s
        selector = pafs.FileSelector(site.path(name), recursive=True, allow_not_found=True)
        prefix = site.root.rstrip("/") + "/"
        try:
            infos = site.fs.get_file_info(selector)
        except OSError as exc:  # the site is down: its orphans wait for a later run
            if report is not None:
                report.held.append(f"orphans at {site.name} not listed ({type(exc).__name__}: {exc})")
            continue
        for info in infos:
            if info.type != pafs.FileType.File:
                continue
            rel = info.path[len(prefix) :] if info.path.startswith(prefix) else info.path
            base = rel.rsplit("/", 1)[-1]
            is_segment = re.fullmatch(rf"{re.escape(name)}/(0|[1-9][0-9]*)/[0-9a-f]{{32}}\.parquet", rel)
            if not (is_segment or _TMP_RE.fullmatch(base)) or rel in known:
                continue
            age_s = (now / 1e6) - info.mtime.timestamp() if info.mtime else 0
            if age_s >= grace_s:
                out.append(Deletion(site.name, rel, f"orphan: not in the catalog for {age_s:.0f} s >= {grace_s} s"))
    return out
