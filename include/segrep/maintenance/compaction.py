"""Compaction: fold a partition's minor chain into a new major segment at the leader (DESIGN section 7).

The major segment holds the last-writer-wins rows of the leader's visible chain; its ``base_segment_id`` is
the newest folded minor (the root when planned) and ``included_segment_ids`` lists the folded segments, as
in the seed. A tombstone is dropped only once its version is older than the table's tombstone grace period
(at least the maximum retention), so a replica back from a long absence cannot resurrect the row with a late
merge. The fold runs as the same merge job as round merges (in process when small, else on Spark:
``spark.merge_runner``); the commit is conditional on the root not having moved, so compaction is safe while
rounds and writes run (a moved root just means "plan again"). Replicas take the major by fast-forward: a
follower always accepts a major segment.

Before tombstones go, every replica still holding rows the leader has not merged that are older than the
cutoff (a fork written while it led, then away longer than the grace) is marked ``needs_bootstrap``: pushed
later, those rows would beat the missing tombstones and resurrect deleted rows, so it re-bootstraps instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.snapshot import REPLICATING_STATES, PartitionSnapshot, TableSnapshot, snapshot
from segrep.config.definitions import Definitions, Policy
from segrep.core import hlc
from segrep.core.chain import visible_segments
from segrep.core.errors import NotFoundError, RefusedError
from segrep.publish.outcome import Publication
from segrep.replication.offers import pushes_from
from segrep.replication.publication import publish
from segrep.spark import launch
from segrep.spark.items import round_item
from segrep.spark.manifest import Manifest, MergeItem
from segrep.spark.merge_runner import MergeLimits, run_merge_manifest
from segrep.spark.results import CommitSummary, ItemProblem, commit_results
from segrep.storage.workdir import compaction_paths


@dataclass(frozen=True)
class Candidate:
    partition_id: int
    minors: int
    minor_bytes: int
    reason: str


@dataclass
class CompactionPlan:
    table: str
    key: str
    candidates: list[Candidate] = field(default_factory=list)
    manifest: str | None = None
    result: str | None = None
    needs_bootstrap: list[str] = field(default_factory=list)  # replicas stopped from pushing (see above)


@dataclass
class CompactionReport:
    """A compaction run: the partitions that were due, the replicas sent to re-bootstrap, the commit."""

    table: str
    candidates: list[Candidate]
    needs_bootstrap: list[str]
    commit: CommitSummary
    # each site's Iceberg publication after the commit (a major starts a clean snapshot)
    published: Publication | None = None

    @property
    def committed(self) -> int:
        return self.commit.committed

    @property
    def dropped(self) -> list[ItemProblem]:
        return self.commit.dropped

    @property
    def spark_apps(self) -> int:
        return self.commit.spark_apps

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def minor_tail(part: PartitionSnapshot) -> tuple[int, int]:
    """Number and bytes of the minor segments on top of the leader's newest major."""
    minors = [
        part.segment(part.leader.placement_id, ref.segment_id)
        for ref in visible_segments(part.chain(part.leader))
        if not ref.is_major
    ]
    return len(minors), sum(seg.byte_size for seg in minors)


def due(part: PartitionSnapshot, policy: Policy, *, force: bool = False) -> Candidate | None:
    """Whether the partition's minor chain has reached the table's thresholds (segment count or bytes)."""
    count, size = minor_tail(part)
    pid = part.partition.partition_id
    if count == 0:
        return None
    if force:
        return Candidate(pid, count, size, "forced")
    if count >= policy.compact_min_segments:
        return Candidate(pid, count, size, f"{count} minor segments >= {policy.compact_min_segments}")
    if size >= policy.compact_min_bytes:
        return Candidate(pid, count, size, f"{size} bytes of minor segments >= {policy.compact_min_bytes}")
    return None


def plan_compaction(
    catalog: Catalog,
    defs: Definitions,
    table: str,
    *,
    partitions: list[int] | None = None,
    force: bool = False,
    now_us: int | None = None,
) -> CompactionPlan:
    """Pick the partitions due for compaction and write the manifest of their major items."""
    now = hlc.now_us() if now_us is None else now_us
    policy = defs.policy(table)
    key = f"{table}-compact-{now}"
    with catalog.read() as s:
        if partitions is not None:
            _require_partitions(s, table, partitions)
        snap: TableSnapshot = snapshot(s, table, partitions)
    plan = CompactionPlan(table, key)
    items: list[MergeItem] = []
    cutoff = now - policy.tombstone_grace_s * 1_000_000
    for part in snap.partitions:
        candidate = due(part, policy, force=force)
        if candidate is None:
            continue
        plan.candidates.append(candidate)
        item = round_item(snap, part, key, "major", [])
        items.append(replace(item, tombstone_cutoff_us=cutoff))
    if items:
        plan.needs_bootstrap = _stop_stale_pushers(catalog, table, [c.partition_id for c in plan.candidates], cutoff)
        mpath, rpath = compaction_paths(defs, table, key)
        Manifest(key, items).write(mpath)
        plan.manifest, plan.result = str(mpath), str(rpath)
    return plan


def _require_partitions(s: Session, table: str, wanted: list[int]) -> None:
    """Refuse partition ids the table does not have, or has retired (a split's parent): compacting nothing
    and saying "not due" would hide the typo."""
    info = q.table_info(s, table)
    states = {p.partition_id: p.state for p in q.partitions_of(s, info)}
    unknown = sorted(set(wanted) - set(states))
    if unknown:
        raise NotFoundError(
            f"table {table} has no partition {', '.join(map(str, unknown))}; "
            f"its partitions: {', '.join(map(str, sorted(states)))} (segrep table describe {table})"
        )
    inactive = sorted(pid for pid in wanted if states[pid] not in {str(x) for x in REPLICATING_STATES})
    if inactive:
        raise RefusedError(
            f"table {table}: partition(s) {', '.join(f'{pid} ({states[pid]})' for pid in inactive)} "
            "hold no chain to compact"
        )


def _stop_stale_pushers(catalog: Catalog, table: str, partition_ids: list[int], cutoff: int) -> list[str]:
    """Mark ``needs_bootstrap`` on replicas whose unmerged segments hold rows older than the tombstone cutoff,
    in partitions whose visible chain may hold tombstones that old (under the partition lock rounds take)."""
    notes = []
    with catalog.write() as s:
        for pid in partition_ids:
            s.get(m.Partition, pid, with_for_update=True)
            for part in snapshot(s, table, [pid]).partitions:
                visible = [
                    part.segment(part.leader.placement_id, r.segment_id)
                    for r in visible_segments(part.chain(part.leader))
                ]
                if not any(seg.deleted_rows and seg.min_version < cutoff for seg in visible):
                    continue  # no tombstone can expire here
                for replica in part.replicas:
                    stale = [seg for seg in pushes_from(part, replica, hlc.FOREVER_US) if seg.min_version < cutoff]
                    if stale:
                        replica.needs_bootstrap = True
                        notes.append(
                            f"partition {pid}: placement {replica.placement_id} holds {len(stale)} unmerged "
                            "segment(s) older than the tombstone grace; it needs a bootstrap"
                        )
    return notes


def compact(
    catalog: Catalog,
    defs: Definitions,
    table: str,
    *,
    partitions: list[int] | None = None,
    force: bool = False,
    submit: Callable[..., None] | None = None,
) -> CompactionReport:
    """Plan, fold (one merge job for every partition due, in process or on Spark by the policy; ``submit``
    defaults to :func:`segrep.spark.launch.submit`, looked up when called), commit. Returns a report."""
    plan = plan_compaction(catalog, defs, table, partitions=partitions, force=force)
    if plan.manifest is None or plan.result is None:
        return CompactionReport(table, plan.candidates, plan.needs_bootstrap, CommitSummary())
    run_merge_manifest(
        plan.manifest,
        plan.result,
        submit=submit or launch.submit,
        limits=MergeLimits.of(defs.policy(table)),
        name=f"segrep-compact-{table}",
    )
    result = commit_results(catalog, Path(plan.manifest), Path(plan.result))
    published = publish(catalog, defs, table)
    return CompactionReport(table, plan.candidates, plan.needs_bootstrap, result, published)
