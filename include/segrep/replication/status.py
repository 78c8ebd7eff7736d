"""``segrep status``: how far each replica is behind, per table and target site.

Safe time and lag come from the catalog's safe_times; pending segments and bytes are what the leader would
offer now (its visible chain minus the target's acks); the last round's outcome, duration and declines by
reason come from the rounds report; back-off, stuck partitions and the leases other rounds hold there say why
a target is not catching up; the segments old leaders hold that a failover gave up and nobody merged yet
("unmerged at <site>") say which rows no safe time covers; the table's recovery-point objective (``policy.rpo``,
from the definitions: the catalog does not keep policies) says whether the lag is acceptable. The schema version
of the newest segment each site holds stands beside the table's current one (a site at an older version is not
an error: old segments stay valid).

The lag is measured from now, never from the last round: a paused replication DAG or a stopped scheduler
makes it grow like any other reason for not replicating. A target that never received a round (no safe time
yet) is behind from its *start* (:func:`target_start`): the earliest of when its replica placements of the
table were created (from then on the site is meant to hold the table) and the commit of the oldest segment the
leaders would offer it (a site added to a table that held data lacks rows older than its placements). Its lag
counts from there, so a replica nobody ever replicated breaches its objective like a stalled one.

The operator's page (``replication.overview``) and its Prometheus endpoint show these same records, so the
numbers a person reads in the UI, in a dashboard and on a shell agree. Every read is set-based: a fixed
number of queries per table whatever the number of partitions, and only partitions with unsettled entries
are read in full (the rest have nothing pending).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import case, func, or_, select
from sqlalchemy.orm import Session, aliased

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.losses import losses_held
from segrep.catalog.schemas import schema_text, site_schema_versions
from segrep.catalog.snapshot import RECEIVING_STATES, REPLICATING_STATES
from segrep.catalog.verifications import VerificationState, last_verifications
from segrep.core import hlc
from segrep.core.chain import Chain, SegmentRef, offer_order
from segrep.core.states import Outcome, PlacementState
from segrep.replication.reports import InvalidSegment, TargetReport, TargetStatus, invalid_advice
from segrep.replication.waits import held_by, round_ids


@dataclass(frozen=True)
class LeaseHold:
    """Segments a round is receiving at the target: whose (the round's key), how many, and until when the
    leases last unless that round's heartbeat renews them (a dead round's lapse then)."""

    holder: str
    segments: int
    expires_us: int
    round_id: int | None = None  # the holder's round, where its row names it

    def describe(self) -> str:
        """``waiting: leases held by round N until <time> (k segment(s) in flight)``: what a round started now
        waits for there."""
        return f"waiting: {held_by(self.holder, self.round_id, self.expires_us)} ({self.segments} segment(s) in flight)"


DECLINES = (Outcome.OVERLOADED, Outcome.INVALID, Outcome.INFLIGHT, Outcome.OUT_OF_ORDER, Outcome.UNMERGED)


@dataclass
class TargetState:
    """One replica site of one table, as an operator needs to see it."""

    table: str
    target: str
    safe_time_us: int | None
    lag_s: float | None
    pending_segments: int
    pending_bytes: int
    last_round_end_us: int | None  # the newest finished round of the table, and its status
    last_round_status: str | None
    last_status: str | None  # this target's status in that round
    declines: dict[str, int] = field(default_factory=dict)
    backing_off: str | None = None  # the reason, while a back-off is in force
    needs_major: list[int] = field(default_factory=list)  # partitions waiting for a major segment
    joining: bool = False  # bootstrapped, waiting for JOIN_FINALIZE
    needs_bootstrap: bool = False  # out of retention: only `segrep bootstrap` brings it back
    invalid: list[InvalidSegment] = field(default_factory=list)  # copies that failed verification last round
    leases: list[LeaseHold] = field(default_factory=list)  # rounds receiving segments there now
    waited: str | None = None  # the last round's target WAITING on another round's leases: which, until when
    last_verified: VerificationState | None = None  # the newest `segrep verify` of this table at this site
    last_round_started_us: int | None = None  # when that round's first step ran
    last_round_finished_us: int | None = None  # ... and when its commit wrote the report
    backoff_until_us: int | None = None  # no new attempt before this, while a back-off is in force
    rpo_s: int | None = None  # the table's recovery-point objective (policy.rpo), None: no objective
    # The lag is past the objective (:func:`rpo_breached`): a never-replicated target counts from its start; a
    # lag that cannot be known at all counts as breached while the target lacks segments.
    rpo_breached: bool = False
    # What the lag counts from: the safe time, or for a target that never received a round its start
    # (:func:`target_start`); None: not known (then lag_s is None too).
    behind_since_us: int | None = None
    # Per site: the segments a failover gave up (``on_return: merge``) that the site still holds and the leader
    # has not merged yet. Their rows are outside every safe time of the table until merged ("unmerged at").
    unmerged: dict[str, int] = field(default_factory=dict)
    # The schema version of the newest segment the site holds (None: it holds none) and the table's current
    # one: a site still at an older version is not behind on that account (old segments stay valid).
    schema_version: int | None = None
    table_schema_version: int | None = None

    @property
    def last_round_seconds(self) -> float | None:
        """How long the last round took, from its first step to its commit."""
        if self.last_round_started_us is None or self.last_round_finished_us is None:
            return None
        return round((self.last_round_finished_us - self.last_round_started_us) / 1e6, 1)

    @property
    def caught_up(self) -> bool:
        """Nothing pending and a member of the table (not joining, not stalled)."""
        return self.pending_segments == 0 and not self.joining and not self.needs_bootstrap

    @property
    def never_replicated(self) -> bool:
        """No round has reached this target yet (no safe time): its lag counts from its start."""
        return self.safe_time_us is None

    def note(self) -> str:
        """Why this target is not catching up, and what to run about it ("" when nothing stands in its way)."""
        notes = []
        if self.never_replicated and not self.joining and not self.needs_bootstrap:  # those say why themselves
            since = (
                "its start unknown" if self.behind_since_us is None else f"behind since {hlc.iso(self.behind_since_us)}"
            )
            notes.append(f"never replicated ({since})")
        if self.invalid:
            files = ", ".join(f"segment {bad.segment_id} ({bad.path})" for bad in self.invalid)
            notes.append(f"INVALID copy of {files}: {invalid_advice(self.table, self.target, self.invalid)}")
        elif self.backing_off is not None and self.backing_off.startswith("INVALID"):
            retry = f"segrep round {self.table} --target {self.target} --reoffer"
            notes.append(f"a copy failed verification: run `{retry}` to copy again now")
        if self.backing_off is not None:
            notes.append(f"backing off ({self.backing_off})")
        for hold in self.leases:
            notes.append(hold.describe())
        if self.waited and not self.leases:  # the leases it waited for have lapsed or been let go since
            notes.append(f"last round {self.waited}")
        checked = self.last_verified
        if checked is not None and checked.differences:
            notes.append(
                f"verify at {hlc.iso(checked.finished_us)} found {checked.differences} difference(s): "
                f"run segrep repair {self.table} --site {self.target}"
            )
        for site, n in self.unmerged.items():  # outside this target's safe time until the leader merges them
            notes.append(f"unmerged at {site}: {n} segments")
        if self.needs_major:
            notes.append(f"needs a major segment for partitions {self.needs_major}")
        if self.joining:
            notes.append("joining")
        if self.needs_bootstrap:
            notes.append(f"NEEDS BOOTSTRAP: run segrep bootstrap {self.table} {self.target}")
        return "; ".join(notes)

    def schema_text(self) -> str:
        """``v3``, or ``v2 (table v3)`` while the site's newest segment is at an older version."""
        if self.table_schema_version is None:
            return "-"
        return schema_text(self.schema_version, self.table_schema_version)

    def last_verified_text(self) -> str | None:
        """When this site was last verified, and what was found (``equal``, or the number of differences)."""
        v = self.last_verified
        if v is None:
            return None
        return f"{hlc.iso(v.finished_us)} {v.differences} diff" if v.differences else f"{hlc.iso(v.finished_us)} equal"

    def last_round_text(self) -> str | None:
        """When the table's last round ended, and its status."""
        if self.last_round_end_us is None:
            return None
        return f"{hlc.iso(self.last_round_end_us)} {self.last_round_status}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "last_round_seconds": self.last_round_seconds, "schema": self.schema_text()}


def rpo_breached(lag_us: int | None, rpo_s: int | None, *, pending_segments: int = 0) -> bool:
    """Whether a lag (µs) is past the objective (None: no objective). An unknown lag (None) is not taken as
    fine: it counts as breached while the target lacks segments (nothing may be lost only when it lacks none)."""
    if rpo_s is None:
        return False
    if lag_us is None:
        return pending_segments > 0
    return lag_us > rpo_s * 1_000_000


def target_start(placed_us: int | None, oldest_pending_us: int | None) -> int | None:
    """When a target that never received a round started falling behind: the earliest of when its replica
    placements were created and the commit of the oldest segment the leaders would offer it (None: neither
    is known)."""
    known = [x for x in (placed_us, oldest_pending_us) if x is not None]
    return min(known) if known else None


def status_rows(
    catalog: Catalog,
    table: str | None = None,
    *,
    rpo: Mapping[str, int | None] | None = None,
    now_us: int | None = None,
) -> list[TargetState]:
    """One record per table and replica site (tables by name, sites by id). ``rpo`` maps a table to its
    objective in seconds (from the definitions' policies; a table not in it has none); ``now_us`` is the
    instant lags are measured at (default: now), so callers showing several views can share one."""
    now = hlc.now_us() if now_us is None else now_us
    objectives = rpo or {}
    out = []
    with catalog.read() as s:
        names = [table] if table else list(s.scalars(select(m.Table.name).order_by(m.Table.name)))
        sites = q.sites_by_id(s)
        for name in names:
            info = q.table_info(s, name)
            tid = info.table_id
            members = replica_sites(s, tid)
            safe = {r.site_id: r.safe_time_us for r in s.scalars(select(m.SafeTime).where(m.SafeTime.table_id == tid))}
            backoff = {r.site_id: r for r in s.scalars(select(m.Backoff).where(m.Backoff.table_id == tid))}
            last = s.scalars(
                select(m.Round)
                .where(m.Round.table_id == tid, m.Round.finished_us.is_not(None))
                .order_by(m.Round.interval_end_us.desc())
                .limit(1)
            ).one_or_none()
            leased = _lease_holds(s, tid, now)
            verified = {v.site: v for v in last_verifications(s, name)}
            pending = _pending(s, tid)
            versions = site_schema_versions(s, tid)
            unmerged = dict(
                sorted(Counter(sites[x.site_id].name for x in losses_held(s, tid) if x.on_return == "merge").items())
            )
            for site_id in sorted(members.all):
                site = sites[site_id].name
                stored = ((last.report or {}).get("targets", {}) if last else {}).get(site)
                report = TargetReport.from_dict(stored) if stored else None
                outcomes = report.outcomes if report else {}
                held = backoff.get(site_id)
                backing_off = held is not None and held.next_attempt_us > now
                safe_us = safe.get(site_id)
                objective = objectives.get(name)
                since = (
                    safe_us
                    if safe_us is not None
                    else target_start(members.since.get(site_id), pending.oldest_us.get(site_id))
                )
                lag_us = None if since is None else now - since
                out.append(
                    TargetState(
                        table=name,
                        target=site,
                        safe_time_us=safe_us,
                        lag_s=None if lag_us is None else round(lag_us / 1e6, 1),
                        pending_segments=pending.segments[site_id],
                        pending_bytes=pending.bytes[site_id],
                        last_round_end_us=None if last is None else last.interval_end_us,
                        last_round_status=None if last is None else last.status,
                        last_status=None if report is None else str(report.status),
                        declines={k: v for k, v in outcomes.items() if k in {str(d) for d in DECLINES}},
                        backing_off=held.last_reason if held is not None and backing_off else None,
                        needs_major=list(report.needs_major) if report else [],
                        joining=site_id in members.joining,
                        needs_bootstrap=site_id in members.stalled,
                        invalid=list(report.invalid) if report else [],
                        leases=leased.get(site_id, []),
                        waited=report.error if report is not None and report.status == TargetStatus.WAITING else None,
                        last_verified=verified.get(site),
                        last_round_started_us=None if last is None else last.started_us,
                        last_round_finished_us=None if last is None else last.finished_us,
                        backoff_until_us=held.next_attempt_us if held is not None and backing_off else None,
                        rpo_s=objective,
                        rpo_breached=rpo_breached(lag_us, objective, pending_segments=pending.segments[site_id]),
                        behind_since_us=since,
                        unmerged=dict(unmerged),
                        schema_version=versions.get(site_id),
                        table_schema_version=info.row.schema_version,
                    )
                )
    return out


@dataclass(frozen=True)
class ReplicaSites:
    """The sites holding a receiving (JOINING or LIVE) replica of some replicating partition of a table."""

    all: frozenset[int]
    joining: frozenset[int]  # ... of which some replica is still JOINING
    stalled: frozenset[int]  # ... or some replica needs a bootstrap
    since: Mapping[int, int] = field(default_factory=dict)  # per site: when its oldest such placement was made


def replica_sites(s: Session, table_id: int) -> ReplicaSites:
    """One GROUP BY over the table's replica placements (as ``snapshot`` decides who replicates)."""
    pl, pa = m.Placement, m.Partition
    joining = func.max(case((pl.state != str(PlacementState.LIVE), 1), else_=0))
    stalled = func.max(case((pl.needs_bootstrap.is_(True), 1), else_=0))
    rows = s.execute(
        select(pl.site_id, joining, stalled, func.min(pl.created_us))
        .join(pa, pa.partition_id == pl.partition_id)
        .where(
            pa.table_id == table_id,
            pa.state.in_([str(x) for x in REPLICATING_STATES]),
            pl.removed_us.is_(None),
            pl.state.in_([str(x) for x in RECEIVING_STATES]),
            or_(pa.leader_placement_id.is_(None), pa.leader_placement_id != pl.placement_id),
        )
        .group_by(pl.site_id)
    ).all()
    return ReplicaSites(
        frozenset(site for site, _, _, _ in rows),
        frozenset(site for site, j, _, _ in rows if j),
        frozenset(site for site, _, st, _ in rows if st),
        {site: int(made) for site, _, _, made in rows},
    )


def _leader_entries(table_id: int) -> tuple[Any, ...]:
    """The join and filters that pick the unsettled list entries of the table's leader placements (a
    watermark set under an older epoch counts as 0), as ``snapshot(active_only=True)`` reads them."""
    pl, pa, sg = m.Placement, m.Partition, m.Segment
    watermark = case((pl.settled_epoch == pa.epoch, pl.settled_entry_id), else_=0)
    return (
        pa.table_id == table_id,
        pa.state.in_([str(x) for x in REPLICATING_STATES]),
        pa.leader_placement_id == pl.placement_id,
        pl.removed_us.is_(None),
        sg.entry_id > watermark,
    )


@dataclass(frozen=True)
class Pending:
    """Per replica site: what the leaders would offer it now."""

    segments: Counter[int]
    bytes: Counter[int]
    oldest_us: dict[int, int]  # the commit time of the oldest of those segments (sites with none pending: absent)


def _pending(s: Session, table_id: int) -> Pending:
    """Per replica site: the segments (and their bytes, and the oldest one's commit time) the leader would
    offer now (its visible chain minus the replica's acks; ``offer_order``), summed over partitions.

    Only the leaders' unsettled entries are read (the settled part of a chain is held by every replica, so
    nothing in it is pending), as plain rows in three joined queries: no ORM object, no list of ids sent
    back to the database, so a table with 10,000 partitions all behind costs a few hundred milliseconds.
    Replicas needing a bootstrap get no offers and count nothing (their row says NEEDS BOOTSTRAP)."""
    pl, pa, sg, ack = m.Placement, m.Partition, m.Segment, m.Ack
    entries = s.execute(
        select(
            sg.placement_id,
            sg.segment_id,
            sg.base_segment_id,
            sg.included_segment_ids,
            sg.is_major,
            sg.byte_size,
            sg.committed_us,
            pl.root_segment_id,
        )
        .join(pl, pl.placement_id == sg.placement_id)
        .join(pa, pa.partition_id == pl.partition_id)
        .where(*_leader_entries(table_id))
        .order_by(sg.entry_id)
    ).all()
    acks: dict[tuple[int, str], set[int]] = {}
    for holder, segment_id, target in s.execute(
        select(ack.holder_placement_id, ack.segment_id, ack.target_placement_id)
        .join(sg, (sg.placement_id == ack.holder_placement_id) & (sg.segment_id == ack.segment_id))
        .join(pl, pl.placement_id == sg.placement_id)
        .join(pa, pa.partition_id == pl.partition_id)
        .where(*_leader_entries(table_id))
    ):
        acks.setdefault((holder, segment_id), set()).add(target)
    leader = aliased(m.Placement)
    replicas: dict[int, list[tuple[int, int]]] = {}  # leader placement -> [(replica placement, site)]
    for leader_id, replica_id, site_id in s.execute(
        select(leader.placement_id, pl.placement_id, pl.site_id)
        .join(pa, pa.partition_id == pl.partition_id)
        .join(leader, leader.placement_id == pa.leader_placement_id)
        .where(
            pa.table_id == table_id,
            pa.state.in_([str(x) for x in REPLICATING_STATES]),
            leader.removed_us.is_(None),
            pl.removed_us.is_(None),
            pl.placement_id != leader.placement_id,
            pl.state.in_([str(x) for x in RECEIVING_STATES]),
            pl.needs_bootstrap.is_(False),
        )
    ):
        replicas.setdefault(leader_id, []).append((replica_id, site_id))
    lists: dict[int, list[Any]] = {}
    for row in entries:
        lists.setdefault(row.placement_id, []).append(row)
    pending: Counter[int] = Counter()
    pending_bytes: Counter[int] = Counter()
    oldest: dict[int, int] = {}
    for leader_id, rows in lists.items():
        chain = Chain.of(
            (
                SegmentRef(r.segment_id, r.base_segment_id, tuple(r.included_segment_ids or ()), r.is_major)
                for r in rows
            ),
            rows[0].root_segment_id,
        )
        sizes = {r.segment_id: r.byte_size for r in rows}
        committed = {r.segment_id: r.committed_us for r in rows}
        for replica_id, site_id in replicas.get(leader_id, ()):
            acked = {sid for sid in sizes if replica_id in acks.get((leader_id, sid), ())}
            offered = offer_order(chain, acked)
            pending[site_id] += len(offered)
            pending_bytes[site_id] += sum(sizes[r.segment_id] for r in offered)
            if offered:
                first = min(committed[r.segment_id] for r in offered)
                oldest[site_id] = min(first, oldest.get(site_id, first))
    return Pending(pending, pending_bytes, oldest)


def _lease_holds(s: Session, table_id: int, now_us: int) -> dict[int, list[LeaseHold]]:
    """Per target site: the live leases on the table's replica placements, grouped by holder (one GROUP BY)."""
    pl, pa, lease = m.Placement, m.Partition, m.Lease
    rows = s.execute(
        select(pl.site_id, lease.holder, func.count(), func.max(lease.expires_us))
        .join(pl, pl.placement_id == lease.target_placement_id)
        .join(pa, pa.partition_id == pl.partition_id)
        .where(
            pa.table_id == table_id,
            lease.expires_us > now_us,
            pl.removed_us.is_(None),
            or_(pa.leader_placement_id.is_(None), pa.leader_placement_id != pl.placement_id),
        )
        .group_by(pl.site_id, lease.holder)
        .order_by(pl.site_id, lease.holder)
    ).all()
    out: dict[int, list[LeaseHold]] = {}
    ids = round_ids(s, table_id, {holder for _, holder, _, _ in rows})
    for site_id, holder, n, expires in rows:
        out.setdefault(site_id, []).append(LeaseHold(holder, int(n), int(expires), ids.get(holder)))
    return out
