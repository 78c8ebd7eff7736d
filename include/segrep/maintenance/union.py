"""Repair mends the leader from its replicas before anything is mended from the leader (DESIGN section 13).

The union rule: a partition's committed history is the union of what every site holds. A replica may list
a segment the leader neither lists nor references through its chain (the leader's file was lost and a
rebuild dropped it while the replicas were away; a leader that lost its newest segment and went on). Such a
segment is never discarded, and the replica is never rebuilt from a leader that lacks it:
- one that makes the leader's chain whole again (the missing link of its walk, or the next segment on its
  root) is fetched to the leader from a replica whose copy is intact (verified copy, ``storage.transfer``)
  and listed there again, in one transaction that also moves the root (conditionally) and records that the
  replicas holding it hold it;
- any other is a fork of the leader's chain: the acks that claim the leader holds it are dropped, so the next
  round pushes it and the leader merges it (LWW), as for any replica's fork.
A failover's rollback loss (``on_return: rollback``) is not the table's history: it is set aside, not mended.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import bindparam, select

from segrep.catalog import Catalog
from segrep.catalog import leases as ls
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.link_lease import LinkLimits, LinkPacing, unlimited
from segrep.catalog.segments import entry_of, insert_segments, move_root_to, segment_values
from segrep.catalog.site_identity import open_site
from segrep.catalog.snapshot import PartitionSnapshot, snapshot
from segrep.core import hlc
from segrep.core.chain import Chain, referenced_ids
from segrep.core.errors import ConflictError
from segrep.core.links import CopyPriority
from segrep.maintenance.scrub import SegmentCopy, check_copy
from segrep.storage.atomic import FileFacts
from segrep.storage.pacing import Pacer
from segrep.storage.transfer import copy_verified


@dataclass(frozen=True)
class LeaderLack:
    """A segment replicas hold that the partition's leader lacks."""

    partition_id: int
    segment_id: str
    holders: tuple[str, ...]  # the replica sites listing it
    row_count: int
    min_version: int
    max_version: int
    relinks: bool  # it makes the leader's chain whole again (fetched there); else a fork the next round merges
    source: str | None = None  # a replica whose copy is intact; None: none is
    fetched: bool = False  # fetched to the leader (a dry run: would be); not when ``--site`` leaves its leader out

    def describe(self) -> str:
        return (
            f"segment {self.segment_id} of partition {self.partition_id} ({self.row_count} row(s), versions "
            f"{self.min_version}..{self.max_version}), held at {', '.join(self.holders)}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "holders": list(self.holders)}


@dataclass
class LeaderMends:
    lacks: list[LeaderLack] = field(default_factory=list)

    def unmended(self, dry_run: bool) -> set[tuple[int, str]]:
        """(partition, replica site) pairs that still hold what the leader lacks once the mends are done (a dry
        run does none): those replicas are never re-bootstrapped from the leader."""
        return {(x.partition_id, site) for x in self.lacks if dry_run or not x.fetched for site in x.holders}


def lacking_at_leader(part: PartitionSnapshot) -> dict[str, list[tuple[m.Placement, m.Segment]]]:
    """Segment id -> the replica placements (with their rows) listing a segment the leader neither lists nor
    references through its chain, a failover's set-aside loss excepted."""
    leader = part.leader
    has = {x.segment_id for x in part.segments.get(leader.placement_id, [])} | referenced_ids(part.chain(leader))
    out: dict[str, list[tuple[m.Placement, m.Segment]]] = defaultdict(list)
    for replica in part.replicas:
        for seg in part.segments.get(replica.placement_id, []):
            if seg.segment_id not in has and seg.segment_id not in part.set_aside:
                out[seg.segment_id].append((replica, seg))
    return out


def mend_leaders(
    catalog: Catalog,
    table: str,
    *,
    site: str | None,
    pacer: Pacer,
    dry_run: bool,
    links: LinkLimits = unlimited,
) -> LeaderMends:
    """Find what each partition's leader lacks that a replica holds, and (unless ``dry_run``) fetch what makes
    its chain whole; ``site`` limits the fetches to leaders at that site (every lack is still reported). A
    fetch over a defined link (``links``) goes at a failback's share of it: the leader takes back rows only a
    replica held."""
    with LinkPacing(catalog, CopyPriority.FAILBACK, links) as pacing:
        return _mend_leaders(catalog, table, site, pacer, dry_run, pacing)


def _mend_leaders(
    catalog: Catalog, table: str, site: str | None, pacer: Pacer, dry_run: bool, pacing: LinkPacing
) -> LeaderMends:
    with catalog.read() as s:
        snap = snapshot(s, table, include_stalled=True)
    mends = LeaderMends()
    for part in snap.partitions:
        lacking = lacking_at_leader(part)
        if not lacking:
            continue
        leader_site = snap.sites[part.leader.site_id]
        root, relinked = _whole_chain(part, {sid: pairs[0][1] for sid, pairs in lacking.items()})
        fetch = site is None or leader_site.name == site
        sources = {sid: _intact_copy(snap.sites, part, pairs, pacer) for sid, pairs in lacking.items()}
        done: list[tuple[m.Segment, list[m.Placement]]] = []
        for sid, pairs in sorted(lacking.items(), key=lambda kv: (kv[1][0][1].min_version, kv[0])):
            seg = pairs[0][1]
            source = sources[sid] if sid in relinked else None
            holders = tuple(sorted(snap.sites[pl.site_id].name for pl, _ in pairs))
            lack = LeaderLack(
                part.partition.partition_id,
                sid,
                holders,
                seg.row_count,
                seg.min_version,
                seg.max_version,
                sid in relinked,
                None if source is None else source.site,
                fetch and source is not None,
            )
            mends.lacks.append(lack)
            if fetch and not dry_run and source is not None:
                target = open_site(catalog, leader_site)
                link = pacing.pacer(source.site, leader_site.name)
                copy_verified(source.storage(), target, seg.relpath, seg.byte_size, seg.sha256, seg.crc64nvme, link)
                done.append((source.segment, [pl for pl, _ in pairs]))
        if not dry_run:
            forks = {sid: [pl for pl, _ in pairs] for sid, pairs in lacking.items() if sid not in relinked}
            whole = len(done) == len(relinked) and fetch
            _commit(catalog, table, part, done, root if whole else None, forks)
    return mends


def _whole_chain(part: PartitionSnapshot, lacking: dict[str, m.Segment]) -> tuple[str | None, set[str]]:
    """The leader's root once the lacking segments are listed again (moved on along those based on it, newest
    first when several are), and which of them that chain references."""
    leader_segs = part.segments.get(part.leader.placement_id, [])
    root = part.leader.root_segment_id
    used: set[str] = set()
    while True:
        nexts = [x for x in lacking.values() if x.base_segment_id == root and x.segment_id not in used]
        if not nexts:
            break
        root = max(nexts, key=lambda x: (x.max_version, x.segment_id)).segment_id
        used.add(root)
    chain = Chain.of([q.to_ref(x) for x in [*leader_segs, *lacking.values()]], root)
    return root, referenced_ids(chain) & set(lacking)


def _intact_copy(
    sites: dict[int, m.Site], part: PartitionSnapshot, pairs: list[tuple[m.Placement, m.Segment]], pacer: Pacer
) -> SegmentCopy | None:
    """A replica's copy of the segment whose file matches its catalog row, or None."""
    for pl, seg in sorted(pairs, key=lambda x: sites[x[0].site_id].name):
        row = sites[pl.site_id]
        copy = SegmentCopy(row.name, row.uri, pl.placement_id, part.partition.partition_id, False, seg)
        problem, _ = check_copy(copy, pacer, None)
        if problem is None:
            return copy
    return None


def _commit(
    catalog: Catalog,
    table: str,
    part: PartitionSnapshot,
    fetched: list[tuple[m.Segment, list[m.Placement]]],
    root: str | None,
    forks: dict[str, list[m.Placement]],
) -> None:
    """One transaction, only if the partition's leadership and the leader's root are as read: the fetched
    segments listed at the leader (the root moved on where they extend it), the replicas holding them noted
    as holding them, the acks claiming the leader holds a fork dropped, and the partition planned afresh."""
    leader_id, epoch, start = part.leader.placement_id, part.partition.epoch, part.leader.root_segment_id
    if not fetched and not forks:
        return
    now = hlc.now_us()
    with catalog.write() as s:
        row = q.locked_partition(s, part.partition.partition_id)
        leader = q.placement(s, leader_id)
        if row is None or leader is None or row.leader_placement_id != leader_id or row.epoch != epoch:
            raise ConflictError(f"partition {part.partition.partition_id} changed leader during repair; run it again")
        if leader.root_segment_id != start:
            raise ConflictError(f"partition {part.partition.partition_id}: the leader's chain moved during repair")
        listed = set(
            s.scalars(_LISTED, {"placement": leader_id, "ids": [seg.segment_id for seg, _ in fetched] or [""]})
        )
        rows = [
            segment_values(
                entry_of(seg, table, row),
                leader_id,
                seg.relpath,
                FileFacts(seg.byte_size, seg.sha256, seg.crc64nvme),
                now,
            )
            for seg, _ in fetched
            if seg.segment_id not in listed
        ]
        insert_segments(s, rows)
        if root is not None and root != start:
            move_root_to(s, leader_id, root, expected_root=start)
        for seg, holders in fetched:
            for pl in holders:
                ls.record_ack(s, leader_id, seg.segment_id, pl.placement_id, now)
        for sid, holders in forks.items():
            ls.drop_acks(s, holders=[pl.placement_id for pl in holders], segments=sid, targets=leader_id)
        q.reset_watermarks(s, part.partition.partition_id)


_LISTED = select(m.Segment.segment_id).where(
    m.Segment.placement_id == bindparam("placement"), m.Segment.segment_id.in_(bindparam("ids", expanding=True))
)
