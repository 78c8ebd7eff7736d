"""``segrep failover --at safe-time``: the promoted tables cut at one instant T, the smallest safe time of those
tables at the new site, so that they are consistent with each other (YugabyteDB restores to the safe time).

At the new leader, each partition whose visible chain holds rows newer than T gets a major segment built as of
T (the Spark merge job's ``as_of_us``), on top of its chain: readers and followers see the rows as of T. The
newer rows are not destroyed: they are written first to the new leader site's rollback area
(``.rollback/<table>/<partition>/<failover id>-cut.parquet``), listed by ``segrep rollback list``. Writes stay
paused (``paused_us``, set by the promotion) until the cut is committed, so no new write lands under it.
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
from segrep.catalog.site_identity import open_site
from segrep.catalog.snapshot import snapshot
from segrep.config.definitions import Definitions
from segrep.core import hlc
from segrep.core import schema as sch
from segrep.core.chain import visible_segments
from segrep.core.errors import RefusedError, SegrepError
from segrep.data.reader import expected_segment
from segrep.replication.rollback import rollback_relpath, stored_rows, write_rollback
from segrep.spark.items import round_item
from segrep.spark.launch import Submit
from segrep.spark.manifest import Manifest, MergeItem
from segrep.spark.results import commit_results
from segrep.storage.workdir import compaction_paths


@dataclass(frozen=True)
class CutReport:
    table: str
    cut_us: int
    partitions_cut: int
    rows_set_aside: int
    rollback_files: list[str]


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


def cut_table(
    catalog: Catalog, defs: Definitions, table: str, cut_us: int, failover_id: int, submit: Submit
) -> CutReport:
    """Set aside the rows newer than ``cut_us`` at the table's (new) leaders and fold each such partition as of
    ``cut_us``, on Spark; then lift the pause. SegrepError (writes still paused, nothing lost) if a fold fails."""
    key = f"{table}-cut-{failover_id}"
    with catalog.read() as s:
        snap = snapshot(s, table)
    info = snap.info
    items: list[MergeItem] = []
    files: list[str] = []
    set_aside = 0
    for part in snap.partitions:
        leader_segs = [
            part.segment(part.leader.placement_id, ref.segment_id) for ref in visible_segments(part.chain(part.leader))
        ]
        newer = [seg for seg in leader_segs if seg.max_version > cut_us]
        if not newer:
            continue
        site_row = snap.sites[part.leader.site_id]
        site = open_site(s, site_row)
        relpath = rollback_relpath(table, part.partition.partition_id, failover_id, "cut")
        written = stored_rows(site, relpath)  # a re-run after a failed fold reads nothing again
        if written is None:
            rows = pa.concat_tables(
                [site.read_checked(seg.relpath, expected_segment(info, seg), info.primary_key) for seg in newer]
            )
            rows = rows.filter(pc.greater(rows[sch.VERSION_COL], pa.scalar(cut_us, pa.int64())))
            versions = [int(v) for v in rows[sch.VERSION_COL].to_pylist()]
            write_rollback(
                site,
                relpath,
                rows.select([*info.schema.names, *sch.INTERNAL_COLUMNS]),
                table=table,
                partition_id=part.partition.partition_id,
                failover_id=failover_id,
                segments=newer,
                min_version=min(versions, default=None),
                max_version=max(versions, default=None),
                cut_us=cut_us,
            )
            written = rows.num_rows
        files.append(f"{site_row.name}:{relpath}")
        set_aside += written
        items.append(replace(round_item(snap, part, key, "major", []), as_of_us=cut_us))
    if items:
        mpath, rpath = compaction_paths(defs, table, key)
        Manifest(key, items).write(mpath)
        submit("merge", ["--manifest", str(mpath), "--result", str(rpath)], name=f"segrep-cut-{table}")
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
    return CutReport(table, cut_us, len(items), set_aside, files)
