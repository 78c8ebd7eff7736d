"""Checkpoints and safe time, derived from acks (DESIGN section 2; xCluster's cdc_state and safe time).

Checkpoint (partition, target placement): the newest segment of the leader's offer order up to which the
target has acked everything, and that segment's newest row version.

Safe time (table, target site): every write committed at the leader at or before it is readable at the
target. For a round ending at ``end``, a partition vouches for ``end - 1`` if the target acked every segment
committed before ``end``; otherwise only for the instant before the oldest row version among the segments it
still lacks (a row is stamped before it commits, so any write committed at or before that instant lies in an
acked segment). The table's safe time is the minimum over partitions, and it only ever moves forward.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from segrep import hlc
from segrep.catalog import Catalog
from segrep.catalog import leases as ls
from segrep.catalog import models as m
from segrep.chain import visible_segments
from segrep.planner import PartitionSnapshot, snapshot
from segrep.protocol import PlacementState


def partition_vouches(part: PartitionSnapshot, replica: m.Placement, end_us: int) -> tuple[str | None, int, int]:
    """(checkpoint segment id, checkpoint max version, safe time this partition vouches for at the replica)."""
    acked = part.acked_by(part.leader, replica)
    checkpoint: m.Segment | None = None
    contiguous = True
    safe = end_us - 1
    for ref in visible_segments(part.chain(part.leader)):
        seg = part.segment(part.leader.placement_id, ref.segment_id)
        if seg.segment_id in acked:
            if contiguous:
                checkpoint = seg
            continue
        contiguous = False
        if seg.committed_us < end_us:
            safe = min(safe, seg.min_version - 1)
    if checkpoint is None:
        return None, 0, safe
    return checkpoint.segment_id, checkpoint.max_version, safe


def update_checkpoints_and_safe_time(catalog: Catalog, table: str, end_us: int) -> dict[str, int]:
    """Write every checkpoint of the table and advance each target site's safe time; return the safe times."""
    with catalog.write() as s:
        snap = snapshot(s, table)
        now = hlc.now_us()
        candidate: dict[int, int] = {}
        blocked: set[int] = set()
        for part in snap.partitions:
            for replica in part.replicas:
                seg_id, version, safe = partition_vouches(part, replica, end_us)
                _upsert_checkpoint(s, part.partition.partition_id, replica.placement_id, seg_id, version, now)
                if replica.state != PlacementState.LIVE:
                    blocked.add(replica.site_id)  # a joining replica is not readable yet
                candidate[replica.site_id] = min(candidate.get(replica.site_id, safe), safe)
        out: dict[str, int] = {}
        for site_id, safe in candidate.items():
            if site_id in blocked:
                continue
            out[snap.sites[site_id].name] = _advance(s, snap.info.table_id, site_id, safe, now)
    return out


def _upsert_checkpoint(
    s: Session, partition_id: int, target_id: int, seg_id: str | None, version: int, now: int
) -> None:
    # insert_ignore's "inserted" answer is not used: PostgreSQL drivers may report no row count for an
    # INSERT (SQLAlchemy gives -1), so the row is always read back under a lock and compared.
    values = {"partition_id": partition_id, "target_placement_id": target_id}
    ls.insert_ignore(s, m.Checkpoint, {**values, "segment_id": seg_id, "max_version": version, "updated_us": now})
    row = s.get(m.Checkpoint, (partition_id, target_id), with_for_update=True, populate_existing=True)
    if (row.segment_id, row.max_version) != (seg_id, version):
        row.segment_id, row.max_version, row.updated_us = seg_id, version, now


def _advance(s: Session, table_id: int, site_id: int, safe: int, now: int) -> int:
    """Raise the stored safe time to ``safe`` if that is later (never lower it); return the stored value."""
    ls.insert_ignore(s, m.SafeTime, {"table_id": table_id, "site_id": site_id, "safe_time_us": safe, "updated_us": now})
    row = s.scalars(
        select(m.SafeTime)
        .where(m.SafeTime.table_id == table_id, m.SafeTime.site_id == site_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one()
    if safe > row.safe_time_us:
        row.safe_time_us, row.updated_us = safe, now
    return row.safe_time_us
