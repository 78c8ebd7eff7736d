"""``segrep status``: how far each replica is behind, per table and target site.

Safe time and lag come from the catalog's safe_times; pending segments and bytes are what the leader would
offer now (its visible chain minus the target's acks); the last round's outcome and its declines by reason
come from the rounds report; back-off, stuck partitions and the leases other rounds hold there say why a
target is not catching up.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from segrep.catalog import Catalog
from segrep.catalog import leases as ls
from segrep.catalog import models as m
from segrep.catalog.snapshot import TableSnapshot, snapshot
from segrep.catalog.verifications import VerificationState, last_verifications
from segrep.core import hlc
from segrep.core.chain import offer_order
from segrep.core.states import Outcome
from segrep.replication.reports import InvalidSegment, TargetReport


@dataclass(frozen=True)
class LeaseHold:
    """Segments a round is receiving at the target: whose (the round's key), how many, and until when the
    leases last unless that round's heartbeat renews them (a dead round's lapse then)."""

    holder: str
    segments: int
    expires_us: int


DECLINES = (Outcome.OVERLOADED, Outcome.INVALID, Outcome.INFLIGHT, Outcome.OUT_OF_ORDER)


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
    last_verified: VerificationState | None = None  # the newest `segrep verify` of this table at this site

    @property
    def caught_up(self) -> bool:
        """Nothing pending and a member of the table (not joining, not stalled)."""
        return self.pending_segments == 0 and not self.joining and not self.needs_bootstrap

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def status_rows(catalog: Catalog, table: str | None = None) -> list[TargetState]:
    now = hlc.now_us()
    out = []
    with catalog.read() as s:
        names = [table] if table else list(s.scalars(select(m.Table.name).order_by(m.Table.name)))
        for name in names:
            snap = snapshot(s, name, active_only=True)
            tid = snap.info.table_id
            safe = {r.site_id: r.safe_time_us for r in s.scalars(select(m.SafeTime).where(m.SafeTime.table_id == tid))}
            backoff = {r.site_id: r for r in s.scalars(select(m.Backoff).where(m.Backoff.table_id == tid))}
            last = s.scalars(
                select(m.Round)
                .where(m.Round.table_id == tid, m.Round.finished_us.is_not(None))
                .order_by(m.Round.interval_end_us.desc())
                .limit(1)
            ).one_or_none()
            leased = _lease_holds(s, snap, now)
            verified = {v.site: v for v in last_verifications(s, name)}
            pending: Counter[int] = Counter()
            pending_bytes: Counter[int] = Counter()
            for part in snap.partitions:
                chain = part.chain(part.leader)
                for replica in part.replicas:
                    refs = offer_order(chain, part.acked_by(part.leader, replica))
                    pending[replica.site_id] += len(refs)
                    pending_bytes[replica.site_id] += sum(
                        part.segment(part.leader.placement_id, r.segment_id).byte_size for r in refs
                    )
            for site_id in sorted(snap.replica_site_ids):
                site = snap.sites[site_id].name
                stored = ((last.report or {}).get("targets", {}) if last else {}).get(site)
                report = TargetReport.from_dict(stored) if stored else None
                outcomes = report.outcomes if report else {}
                held = backoff.get(site_id)
                safe_us = safe.get(site_id)
                out.append(
                    TargetState(
                        table=name,
                        target=site,
                        safe_time_us=safe_us,
                        lag_s=None if safe_us is None else round((now - safe_us) / 1e6, 1),
                        pending_segments=pending[site_id],
                        pending_bytes=pending_bytes[site_id],
                        last_round_end_us=None if last is None else last.interval_end_us,
                        last_round_status=None if last is None else last.status,
                        last_status=None if report is None else str(report.status),
                        declines={k: v for k, v in outcomes.items() if k in {str(d) for d in DECLINES}},
                        backing_off=held.last_reason if held is not None and held.next_attempt_us > now else None,
                        needs_major=list(report.needs_major) if report else [],
                        joining=site_id in snap.joining_site_ids,
                        needs_bootstrap=site_id in snap.stalled_site_ids,
                        invalid=list(report.invalid) if report else [],
                        leases=leased.get(site_id, []),
                        last_verified=verified.get(site),
                    )
                )
    return out


def _lease_holds(s: Session, snap: TableSnapshot, now_us: int) -> dict[int, list[LeaseHold]]:
    """Per target site: the live leases on its replica placements, grouped by holder."""
    site_of = {r.placement_id: r.site_id for part in snap.partitions for r in part.replicas}
    grouped: dict[tuple[int, str], list[int]] = {}
    for lease in ls.held(s, list(site_of), now_us):
        grouped.setdefault((site_of[lease.target_placement_id], lease.holder), []).append(lease.expires_us)
    out: dict[int, list[LeaseHold]] = {}
    for (site_id, holder), expiries in sorted(grouped.items()):
        out.setdefault(site_id, []).append(LeaseHold(holder, len(expiries), max(expiries)))
    return out
