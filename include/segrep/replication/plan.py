"""The plan step of a round: create (or find) the round, predict every offer, lease pushes and write the merge
manifest. Every later step re-decides in its own transaction; the plan is advice, never a commitment.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace

from sqlalchemy.orm import Session

from segrep.catalog import Catalog
from segrep.catalog import leases as ls
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.site_identity import open_site
from segrep.catalog.snapshot import PartitionSnapshot, TableSnapshot, snapshot
from segrep.config.definitions import Definitions, Policy
from segrep.core import hlc
from segrep.core.errors import NotFoundError, SegrepError, SiteUnidentifiedError
from segrep.core.names import check_name
from segrep.core.states import Outcome
from segrep.replication.feeders import update_fallbacks
from segrep.replication.offers import leader_decision, offers_to, pushes_from
from segrep.replication.reports import PlanSummary, RoundPlan, TargetForecast
from segrep.replication.rollback import roll_back_returned
from segrep.replication.round import clamp_end, ensure_round, lease_ttl_us, round_key
from segrep.spark.items import file_ref, round_item
from segrep.spark.manifest import FileRef, Manifest, MergeItem
from segrep.storage.probe import STORE_ERRORS, describe
from segrep.storage.workdir import manifest_path

log = logging.getLogger(__name__)


def plan_round(
    catalog: Catalog,
    defs: Definitions,
    table: str,
    end_us: int | None = None,
    *,
    start_us: int | None = None,
    target: str | None = None,
    reoffer: bool = False,
) -> RoundPlan:
    """Create (or find) the round, predict every offer, lease and write the merge manifest. First, an old
    leader back after a failover with ``on_return: rollback`` sets its lost rows aside and rewinds its chain
    (``replication.rollback``), so this round fast-forwards it from the new leader."""
    for done in roll_back_returned(catalog, table):
        log.info("rollback of %s partition %s at %s: %s", table, done.partition_id, done.site, done)
    end = clamp_end(end_us)
    policy = defs.policy(table)
    key = round_key(table, end)
    with catalog.write() as s:
        update_fallbacks(s, q.table_info(s, table).table_id, policy, hlc.now_us())
        snap = snapshot(s, table, active_only=not reoffer)
        rnd = ensure_round(s, snap.info.table_id, end, start_us)
        targets = _target_sites(snap, target)
        now = hlc.now_us()
        summary = PlanSummary()
        stuck: set[int] = set()
        for site_name in targets:
            site_id = snap.site_id(site_name)
            outcomes: Counter[str] = Counter()
            ff_bytes = 0
            for part in snap.partitions:
                for replica in (r for r in part.replicas if r.site_id == site_id):
                    max_in = policy.max_incoming_segments
                    offers, needs_major = offers_to(part, replica, end, max_incoming=max_in, reoffer=reoffer)
                    outcomes.update(str(o) for _seg, o in offers)
                    ff_bytes += sum(seg.byte_size for seg, o in offers if o == Outcome.FAST_FORWARD)
                    # Any OUT_OF_ORDER makes the partition a candidate: on the settled-only lists the replica's
                    # chain can look shorter than it is, so the restart may seem to succeed (a major it would
                    # fast-forward) although on its whole chain it is stuck. The full re-read below decides.
                    if needs_major or any(o == Outcome.OUT_OF_ORDER for _seg, o in offers):
                        stuck.add(part.partition.partition_id)
            summary.targets[site_name] = TargetForecast(dict(outcomes), ff_bytes)
        # Merge and major items need whole chains (a major folds the whole visible chain; a merge compares
        # against it): re-read the candidate partitions in full and decide again on that.
        candidates = stuck | {
            part.partition.partition_id
            for part in snap.partitions
            if any(pushes_from(part, follower, end) for follower in part.replicas)
        }
        candidates -= _led_from_unidentified_roots(s, snap, candidates)
        items: list[MergeItem] = []
        if candidates:
            full = snapshot(s, table, sorted(candidates))
            site_ids = {full.site_id(name) for name in targets}
            readable: dict[int, bool] = {}  # per follower site: whether its pushed files can be read
            items = _plan_merges(s, full, key, end, now, policy, summary, readable)
            stuck = {  # a site found down gets no major built for it: nothing could reach it
                part.partition.partition_id
                for part in full.partitions
                for replica in part.replicas
                if replica.site_id in site_ids
                and readable.get(replica.site_id, True)
                and offers_to(part, replica, end, max_incoming=policy.max_incoming_segments, reoffer=reoffer)[1]
            }
            merged = {it.partition_id for it in items}
            for part in full.partitions:
                pid = part.partition.partition_id
                if pid in stuck and pid not in merged:  # merges first; the major follows next round
                    items.append(round_item(full, part, key, "major", []))
                    summary.majors.append(pid)
        rnd.report = {**(rnd.report or {}), "plan": summary.to_dict()}
        round_id = rnd.round_id
    manifest = None
    if items:
        path = manifest_path(defs, table, end)
        Manifest(key, items).write(path)
        manifest = str(path)
    return RoundPlan(round_id, table, end, targets, manifest, summary)


def _target_sites(snap: TableSnapshot, target: str | None) -> list[str]:
    """The replica sites, feeders before the sites they feed (a round run in this order carries a segment
    down a whole cascade), else by name."""
    feeder = {
        r.site_id: r.feeder_site_id
        for part in snap.partitions
        for r in part.replicas
        if r.feeder_site_id is not None and r.feeder_fallback_us is None
    }

    def depth(site_id: int) -> int:
        n, seen = 0, set()
        while site_id in feeder and site_id not in seen:
            seen.add(site_id)
            site_id, n = feeder[site_id] or -1, n + 1
        return n

    ordered = sorted(snap.replica_site_ids, key=lambda i: (depth(i), snap.sites[i].name))
    names = [snap.sites[site_id].name for site_id in ordered]
    if target is not None:
        check_name("site", target)  # the same message for a malformed name as every other command
        if target not in {site.name for site in snap.sites.values()}:
            raise NotFoundError(
                f"unknown site {target!r}; known: {', '.join(sorted(s.name for s in snap.sites.values()))}"
            )
        if target not in names:
            raise NotFoundError(
                f"site {target!r} holds no replica of {snap.info.name}; replica sites: "
                f"{', '.join(sorted(names)) or 'none'}"
            )
        return [target]
    return names


def _led_from_unidentified_roots(s: Session, snap: TableSnapshot, candidates: set[int]) -> set[int]:
    """The candidate partitions whose leader's root is DOWN/UNIDENTIFIED (missing, unmarked, or claimed by
    another catalog): no merge or major is written there, whatever holds the partition's pushes."""
    leader_sites = {part.leader.site_id for part in snap.partitions if part.partition.partition_id in candidates}
    down = set()
    for site_id in sorted(leader_sites):
        try:
            open_site(s, snap.sites[site_id]).ensure_identified(fresh=True)
        except SiteUnidentifiedError as exc:
            log.info("no merge or major planned at %s: %s", snap.sites[site_id].name, exc)
            down.add(site_id)
        except _UNREADABLE:
            continue  # unreachable: the merge job fails on it and the round reports that, as before
    return {part.partition.partition_id for part in snap.partitions if part.leader.site_id in down}


def _plan_merges(
    s: Session,
    snap: TableSnapshot,
    key: str,
    end: int,
    now: int,
    policy: Policy,
    summary: PlanSummary,
    readable: dict[int, bool],
) -> list[MergeItem]:
    """Follower -> leader: push what the leader lacks; the leader acks what it holds and leases the rest.
    ``readable`` gets, per follower site with pushes, whether its files can be read (else its pushes wait)."""
    items = []
    expires = now + lease_ttl_us()  # kept alive by the round's heartbeat while its merge runs
    leader_ids = [part.leader.placement_id for part in snap.partitions]
    ls.expire(s, leader_ids, now)
    leases = ls.in_flight_many(s, leader_ids, now)
    pushes: Counter[str] = Counter()
    for part in snap.partitions:
        leader = part.leader
        held = leases.get(leader.placement_id, {})
        others = frozenset(seg for seg, holder in held.items() if holder != key)
        incoming: list[FileRef] = []
        for follower in part.replicas:
            offered = pushes_from(part, follower, end)
            if offered and not _can_read(s, snap, follower, offered[0], readable):
                pushes["SITE_DOWN"] += len(offered)  # its pushes wait; the merge would fail on its files
                continue
            for seg in offered:
                outcome = leader_decision(part, follower, seg, others, policy.max_incoming_segments)
                pushes[str(outcome)] += 1
                if outcome == Outcome.SEGMENT_EXISTS:
                    ls.record_ack(s, follower.placement_id, seg.segment_id, leader.placement_id, hlc.now_us())
                elif outcome == Outcome.MERGE and (
                    seg.segment_id in held or ls.acquire(s, leader.placement_id, seg.segment_id, key, expires)
                ):
                    incoming.append(file_ref(snap.sites[follower.site_id], follower, seg))
        if incoming:
            forks = _origin_forks(part, incoming)
            items.append(replace(round_item(snap, part, key, "merge", incoming), origin_forks=forks))
            summary.merges.append(part.partition.partition_id)
    summary.pushes = dict(pushes)
    summary.down = sorted(snap.sites[site_id].name for site_id, ok in readable.items() if not ok)
    return items


def _origin_forks(part: PartitionSnapshot, incoming: list[FileRef]) -> dict[str, int]:
    """Per origin site of the pushed segments: the newest row version their writers could have seen (the
    max version of each segment's base, the oldest over the origin's segments): rows at the leader of another
    origin and newer than that were written concurrently, and an overwrite between them is a conflict."""
    forks: dict[str, int] = {}
    for ref in incoming:
        seg = part.segment(ref.holder_placement_id, ref.segment_id)
        base = next(
            (x for x in part.segments.get(ref.holder_placement_id, []) if x.segment_id == seg.base_segment_id), None
        )
        seen = base.max_version if base is not None else 0
        origin = str(seg.origin_site_id)
        forks[origin] = min(forks.get(origin, seen), seen)
    return forks


_UNREADABLE: tuple[type[Exception], ...] = (*STORE_ERRORS, SegrepError)


def _can_read(s: Session, snap: TableSnapshot, follower: m.Placement, seg: m.Segment, seen: dict[int, bool]) -> bool:
    """Whether the follower's site answers for one of its pushed files (asked once per site and plan): a
    follower that is down (an old leader after a failover, say) must not fail the whole round's merge."""
    if follower.site_id not in seen:
        row = snap.sites[follower.site_id]
        try:
            seen[follower.site_id] = open_site(s, row).exists(seg.relpath)
        except _UNREADABLE as exc:
            log.info("pushes from %s wait: %s", row.name, describe(exc))
            seen[follower.site_id] = False
    return seen[follower.site_id]
