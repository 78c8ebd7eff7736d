"""``segrep failover --at safe-time``: the promoted tables cut at one instant T, the smallest safe time of those
tables at the new site, so that they are consistent with each other (YugabyteDB restores to the safe time).

At the new leader, each partition whose visible chain holds rows newer than T gets a major segment built as of
T (the merge job's ``as_of_us``), on top of its chain: readers and followers see the rows as of T. The
newer rows are not destroyed: they are written first to the new leader site's rollback area
(``.rollback/<table>/<partition>/<failover id>-cut.parquet``), listed by ``segrep rollback list``. Writes stay
paused (``paused_us``, set by the promotion) until the cut is committed, so no new write lands under it.
A dry run (:func:`assess_cut`) counts what the cut would set aside with the functions the cut chooses with.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.link_lease import LinkLimits, LinkPacing
from segrep.catalog.link_limits import limits_or_definitions
from segrep.catalog.site_identity import open_site
from segrep.catalog.snapshot import PartitionSnapshot, TableSnapshot, snapshot
from segrep.config.definitions import Definitions
from segrep.core import hlc
from segrep.core import schema as sch
from segrep.core.chain import visible_segments
from segrep.core.errors import RefusedError, SegrepError
from segrep.core.links import CopyPriority
from segrep.core.projection import stamp
from segrep.data.reader import checked_read
from segrep.replication.rollback import rollback_relpath, stored_rows, write_rollback
from segrep.spark.items import round_item
from segrep.spark.launch import Submit
from segrep.spark.link_pacing import paced_merge
from segrep.spark.manifest import Manifest, MergeItem
from segrep.spark.merge_runner import MergeLimits, run_merge_manifest
from segrep.spark.results import commit_results
from segrep.storage.site import Site
from segrep.storage.workdir import compaction_paths


@dataclass(frozen=True)
class PartitionCut:
    """One partition's rows newer than the cut at the new leader: what the cut sets aside there (a dry run:
    what it would), and the segments they come from."""

    partition_id: int
    site: str
    rows: int
    segment_ids: list[str]
    relpath: str | None  # the rollback file; None in a dry run (the failover's id, not known yet, names it)


@dataclass(frozen=True)
class CutReport:
    table: str
    cut_us: int
    partitions_cut: int
    rows_set_aside: int
    rollback_files: list[str]
    partitions: list[PartitionCut]


@dataclass(frozen=True)
class _Newer:
    """A partition whose chain at the new leader holds rows newer than the cut."""

    part: PartitionSnapshot
    site: Site
    segments: list[m.Segment]  # its visible segments with rows newer than the cut (max version past it)


def common_safe_time(s: Session, tables: list[str], site: str) -> int:
    """The smallest safe time of ``tables`` at ``site``; RefusedError if one has none there yet."""
    site_id = q.site_by_name(s, site).site_id
    times = []
    for table in tables:
        info = q.table_info(s, table)
        safe = s.scalar(
            select(m.SafeTime.safe_time_us).where(m.SafeTime.table_id == info.table_id, m.SafeTime.site_id == site_id)
        )
        if safe is None:
            raise RefusedError(f"table {table} has no safe time at {site} yet: it cannot be cut there (--at latest)")
        times.append(int(safe))
    return min(times)


def assess_cut(catalog: Catalog, table: str, site: str, cut_us: int) -> CutReport:
    """What :func:`cut_table` would set aside at ``site`` (``--dry-run``): the same partitions, segments and
    rows, chosen by the same two functions (:func:`_newer_than_cut`, :func:`_rows_past_cut`), counted from
    the new leader's files (a segment's version range cannot tell how many of its rows are past the cut)."""
    with catalog.read() as s:
        snap = snapshot(s, table)
    parts = [
        PartitionCut(
            x.part.partition.partition_id,
            x.site.name,
            _rows_past_cut(snap.info, x.site, x.segments, cut_us).num_rows,
            [seg.segment_id for seg in x.segments],
            None,
        )
        for x in _newer_than_cut(catalog, snap, site, cut_us)
    ]
    return CutReport(table, cut_us, len(parts), sum(p.rows for p in parts), [], parts)


def cut_table(
    catalog: Catalog,
    defs: Definitions,
    table: str,
    site: str,
    cut_us: int,
    failover_id: int,
    submit: Submit,
    links: LinkLimits | None = None,
) -> CutReport:
    """Set aside the rows newer than ``cut_us`` at the table's new leader ``site`` and fold each such partition
    as of ``cut_us`` (one merge job, in process or on Spark); then lift the pause. SegrepError (writes still
    paused, nothing lost) if a fold fails. The fold's inputs that cross a link with limits (``links``, default
    the definitions') are read at a failback's share of it (``spark.link_pacing``), as every other copier's;
    its own inputs are the new leader's chain at ``site``, so as the chain is built now none crosses one."""
    key = f"{table}-cut-{failover_id}"
    with catalog.read() as s:
        snap = snapshot(s, table)
    info = snap.info
    items: list[MergeItem] = []
    parts: list[PartitionCut] = []
    for x in _newer_than_cut(catalog, snap, site, cut_us):
        pid = x.part.partition.partition_id
        relpath = rollback_relpath(table, pid, failover_id, "cut")
        written = stored_rows(x.site, relpath)  # a re-run after a failed fold reads nothing again
        if written is None:
            rows = _rows_past_cut(info, x.site, x.segments, cut_us)
            versions = [int(v) for v in rows[sch.VERSION_COL].to_pylist()]
            write_rollback(
                x.site,
                relpath,
                rows,
                table=table,
                partition_id=pid,
                failover_id=failover_id,
                segments=x.segments,
                min_version=min(versions, default=None),
                max_version=max(versions, default=None),
                cut_us=cut_us,
            )
            written = rows.num_rows
        parts.append(PartitionCut(pid, x.site.name, written, [seg.segment_id for seg in x.segments], relpath))
        items.append(replace(round_item(snap, x.part, key, "major", []), as_of_us=cut_us))
    files = [f"{p.site}:{p.relpath}" for p in parts]
    if items:
        mpath, rpath = compaction_paths(defs, table, key)
        Manifest(key, items).write(mpath)
        limits = MergeLimits.of(defs.policy(table))
        pacing = LinkPacing(catalog, CopyPriority.FAILBACK, limits_or_definitions(links, defs))
        with pacing, paced_merge(mpath, pacing):
            run_merge_manifest(mpath, rpath, submit=submit, limits=limits, name=f"segrep-cut-{table}")
        summary = commit_results(catalog, mpath, rpath)
        if summary.committed != len(items):
            problems = "; ".join(f"{p.item}: {p.reason}" for p in (*summary.invalid, *summary.dropped))
            raise SegrepError(
                f"the cut of {table} at {hlc.iso(cut_us)} was not committed ({problems}); writes stay paused: run "
                f"segrep failover {table} --at safe-time again (the rows newer than the cut are in {', '.join(files)})"
            )
    with catalog.write() as s:
        s.execute(
            update(m.Partition)
            .where(m.Partition.table_id == info.table_id)
            .values(paused_us=None)
            .execution_options(synchronize_session=False)
        )
    return CutReport(table, cut_us, len(items), sum(p.rows for p in parts), files, parts)


def _newer_than_cut(catalog: Catalog, snap: TableSnapshot, site: str, cut_us: int) -> list[_Newer]:
    """Per partition, the visible segments of its placement at ``site`` (the new leader: its leader once
    promoted, a replica before) that hold rows newer than the cut. The cut and its dry run both choose here,
    so the dry run names what the cut sets aside. The chain is the placement's own, as the leader's is read."""
    site_id = snap.site_id(site)
    row = snap.sites[site_id]
    store = open_site(catalog, row)
    out = []
    for part in snap.partitions:
        at_site = (pl for pl in part.replicas if pl.site_id == site_id)
        placement = part.leader if part.leader.site_id == site_id else next(at_site, None)
        if placement is None:
            pid = part.partition.partition_id
            raise RefusedError(f"table {snap.info.name}: partition {pid} has no live placement at {site} to cut")
        chain = q.chain_of(placement, part.segments.get(placement.placement_id, []))
        held = {seg.segment_id: seg for seg in part.segments.get(placement.placement_id, [])}
        newer = [held[ref.segment_id] for ref in visible_segments(chain) if held[ref.segment_id].max_version > cut_us]
        if newer:
            out.append(_Newer(part, store, newer))
    return out


def _rows_past_cut(info: q.TableInfo, site: Site, segments: list[m.Segment], cut_us: int) -> pa.Table:
    """The rows of ``segments`` (as written: version, origin, tombstone) newer than the cut, read checked."""
    rows = pa.concat_tables([checked_read(info, site, seg) for seg in segments])
    rows = rows.filter(pc.greater(rows[sch.VERSION_COL], pa.scalar(cut_us, pa.int64())))
    return stamp(rows, info.versions.target)  # at the table's target version, which the file says
