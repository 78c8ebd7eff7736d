"""Partition snapshots built by hand, for the planning functions that decide over one
(:mod:`segrep.replication.offers`, :mod:`segrep.replication.safetime`): placements by site, each one's segment
list, and the acks, without a catalog. A segment is described once (its chain links, row versions and commit
time) and listed by every placement that holds it, as the catalog lists one segment per holder."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from segrep.catalog import models as m
from segrep.catalog.snapshot import PartitionSnapshot
from segrep.core.states import PartitionState, PlacementState

SITE_IDS = {"primary": 1, "dr": 2, "edge": 3}


@dataclass(frozen=True)
class Facts:
    """What every copy of one segment shares."""

    base: str | None
    included: tuple[str, ...]
    major: bool
    min_version: int
    max_version: int
    committed_us: int


class Scenario:
    """One partition (id 1) with a leader and replicas. Segments get row versions ``100 n .. 100 n + 50`` and
    commit time ``100 n + 60`` in the order they are described (``n`` from 1), unless given."""

    def __init__(self, *, epoch: int = 1, state: PartitionState = PartitionState.LIVE) -> None:
        self.partition = m.Partition(partition_id=1, table_id=1, state=str(state), epoch=epoch)
        self.placements: dict[str, m.Placement] = {}
        self.leader_site: str | None = None
        self.facts: dict[str, Facts] = {}
        self.lists: dict[str, list[str]] = defaultdict(list)
        self.acks: dict[tuple[str, str], set[str]] = defaultdict(set)

    @classmethod
    def placed(cls, leader: str, *replicas: str, state: PartitionState = PartitionState.LIVE) -> Scenario:
        """A scenario with the leader's placement at ``leader`` and a LIVE replica at each of ``replicas``."""
        sc = cls(state=state)
        sc.place(leader, leader=True)
        for site in replicas:
            sc.place(site)
        return sc

    def place(
        self, site: str, *, leader: bool = False, state: PlacementState = PlacementState.LIVE, feeder: str | None = None
    ) -> m.Placement:
        """The placement of the partition at ``site`` (placement id = 10 x the site id)."""
        pl = m.Placement(
            placement_id=10 * SITE_IDS[site],
            partition_id=1,
            site_id=SITE_IDS[site],
            state=str(state),
            root_segment_id=None,
            needs_bootstrap=False,
            settled_entry_id=0,
            settled_epoch=0,
            feeder_site_id=SITE_IDS[feeder] if feeder else None,
            feeder_fallback_us=None,
        )
        self.placements[site] = pl
        if leader:
            self.leader_site = site
            self.partition.leader_placement_id = pl.placement_id
        return pl

    def seg(
        self,
        segment_id: str,
        base: str | None,
        *,
        included: Iterable[str] = (),
        major: bool = False,
        versions: tuple[int, int] | None = None,
        committed_us: int | None = None,
    ) -> Facts:
        n = len(self.facts) + 1
        lo, hi = versions if versions is not None else (100 * n, 100 * n + 50)
        facts = Facts(base, tuple(included), major, lo, hi, 100 * n + 60 if committed_us is None else committed_us)
        self.facts[segment_id] = facts
        return facts

    def holds(self, site: str, *segment_ids: str, root: str | None = None) -> None:
        """``site``'s list gets these segments (in this order); its root is ``root``, else the last one."""
        self.lists[site] += segment_ids
        self.placements[site].root_segment_id = root if root is not None else self.lists[site][-1]

    def ack(self, holder: str, segment_ids: Iterable[str], *targets: str) -> None:
        """``targets`` hold these segments of ``holder``'s list (acks are by placement)."""
        for sid in segment_ids:
            self.acks[(holder, sid)] |= set(targets)

    def snapshot(self, *, set_aside: Iterable[str] = (), gave_up: Iterable[str] = ()) -> PartitionSnapshot:
        assert self.leader_site is not None, "no leader placed"
        segments: dict[int, list[m.Segment]] = {}
        entry = 0
        for site, ids in self.lists.items():
            pl = self.placements[site]
            rows = []
            for sid in ids:
                entry += 1
                f = self.facts[sid]
                rows.append(
                    m.Segment(
                        entry_id=entry,
                        placement_id=pl.placement_id,
                        segment_id=sid,
                        partition_id=1,
                        base_segment_id=f.base,
                        included_segment_ids=list(f.included),
                        is_major=f.major,
                        min_version=f.min_version,
                        max_version=f.max_version,
                        committed_us=f.committed_us,
                    )
                )
            segments[pl.placement_id] = rows
        acks = {
            (self.placements[holder].placement_id, sid): {self.placements[t].placement_id for t in targets}
            for (holder, sid), targets in self.acks.items()
        }
        leader = self.placements[self.leader_site]
        replicas = [pl for site, pl in self.placements.items() if site != self.leader_site]
        return PartitionSnapshot(
            self.partition, leader, replicas, segments, acks, frozenset(set_aside), frozenset(gave_up)
        )
