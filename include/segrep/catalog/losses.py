"""What an old leader still holds of a failover's loss: the segments only it has, which nobody has taken in.

A failover records exactly what the new leader lacked (``failovers.loss``). Until the old leader's site
returns, those segments are known by the catalog only: with ``on_return: merge`` they wait there to be pushed
and merged, with ``rollback`` to be set aside. Rounds ask this to tell a site that is down from one that has
nothing to copy (the fast-forward probes one of these files), and status names them per site
("unmerged at <site>").
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session, aliased

from segrep.catalog import models as m


@dataclass(frozen=True)
class HeldLoss:
    """One segment of a failover's loss that a follower placement still lists and its partition's leader has
    not taken in (no ack from it: not merged, not set aside yet)."""

    site_id: int
    placement_id: int
    segment_id: str
    relpath: str
    on_return: str  # the policy of the failover that gave it up: merge | rollback


def losses_held(s: Session, table_id: int, site_id: int | None = None) -> list[HeldLoss]:
    """The table's held losses (at ``site_id`` only, if given), by site and segment: a few failover rows,
    then one query per 5,000 lost segment ids (bounded IN lists) against the placements' lists."""
    policy: dict[str, str] = {}
    for on_return, loss in s.execute(_LOSSES, {"table_id": table_id}):
        for entry in loss or ():
            for segment_id in entry["segment_ids"]:
                policy.setdefault(segment_id, on_return)
    ids = sorted(policy)
    out: list[HeldLoss] = []
    for off in range(0, len(ids), 5000):
        query = _HELD if site_id is None else _HELD_AT
        rows = s.execute(query, {"table_id": table_id, "segments": ids[off : off + 5000], "site_id": site_id})
        out += [HeldLoss(site, pl, seg, relpath, policy[seg]) for site, pl, seg, relpath in rows]
    return sorted(out, key=lambda x: (x.site_id, x.placement_id, x.segment_id))


_LOSSES = select(m.Failover.on_return, m.Failover.loss).where(m.Failover.table_id == bindparam("table_id"))
_LEADER_ACK = aliased(m.Ack)
_HELD = (
    select(m.Placement.site_id, m.Placement.placement_id, m.Segment.segment_id, m.Segment.relpath)
    .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
    .join(m.Partition, m.Partition.partition_id == m.Placement.partition_id)
    .where(
        m.Partition.table_id == bindparam("table_id"),
        m.Segment.segment_id.in_(bindparam("segments", expanding=True)),
        m.Placement.removed_us.is_(None),
        m.Partition.leader_placement_id != m.Placement.placement_id,
        ~select(_LEADER_ACK.segment_id)
        .where(
            _LEADER_ACK.holder_placement_id == m.Placement.placement_id,
            _LEADER_ACK.segment_id == m.Segment.segment_id,
            _LEADER_ACK.target_placement_id == m.Partition.leader_placement_id,
        )
        .exists(),
    )
)
_HELD_AT = _HELD.where(m.Placement.site_id == bindparam("site_id"))
