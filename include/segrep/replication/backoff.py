"""Recording a target's attempt in a round, and its back-off after failures (per table and target site).

A failed attempt, or one declined for a reason that does not clear by itself (INVALID), doubles the wait
before the next one (``retry_delay_s * 2^(failures-1)``, capped at an hour); a successful one clears it. One
attempt counts once, however many partitions declined. A decline that only waits for leases (INFLIGHT,
OVERLOADED) neither backs off nor clears: a live round frees them when it ends, a dead one's lapse within a
lease TTL, and backing off on them would turn one crashed round into a growing delay. A target whose store
refused (credentials, permissions, a missing bucket) fails with a clear error and does not back off either:
each round names the problem until the site is fixed, and the first round after the fix replicates.
"""

from __future__ import annotations

from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.orm import Session

from segrep.catalog import models as m
from segrep.catalog.sql import insert_ignore
from segrep.config.definitions import Policy
from segrep.core import hlc
from segrep.replication.reports import TargetReport, TargetStatus

BACKOFF_CAP_S = 3600


def bump_backoff(s: Session, table_id: int, site_id: int, reason: str, policy: Policy) -> None:
    """Exponential back-off per (table, target): retry_delay_s * 2^(failures-1), capped at an hour."""
    now = hlc.now_us()
    fresh = {
        "table_id": table_id,
        "site_id": site_id,
        "failures": 0,
        "next_attempt_us": 0,
        "last_reason": None,
        "updated_us": now,
        "failing_since_us": now,
    }
    insert_ignore(s, m.Backoff, fresh)
    row = s.get(m.Backoff, (table_id, site_id), with_for_update=True)
    assert row is not None  # inserted above or already there, and locked
    row.failures += 1
    delay_s = min(policy.retry_delay_s * 2 ** (row.failures - 1), BACKOFF_CAP_S)
    row.next_attempt_us = now + int(delay_s * 1_000_000)
    row.last_reason = reason
    row.updated_us = now


def record_target(s: Session, round_id: int, table_id: int, site_id: int, report: TargetReport, policy: Policy) -> None:
    """Keep the target's report with the round, and move its back-off by the outcome (in the caller's
    transaction: the fast-forward records its last acks in the same one)."""
    now = hlc.now_us()
    if report.status == TargetStatus.FAILED and not report.refused:
        bump_backoff(s, table_id, site_id, f"unreachable: {report.error}", policy)
    elif report.status == TargetStatus.DOWN:
        bump_backoff(s, table_id, site_id, report.error or "down", policy)
    elif report.status in (TargetStatus.DECLINED, TargetStatus.WAITING) and report.backs_off:
        bump_backoff(s, table_id, site_id, report.decline_reason or "declined", policy)
    elif report.status == TargetStatus.OK:
        s.execute(_CLEAR_BACKOFF, {"table_id": table_id, "site_id": site_id})
    fresh = {"round_id": round_id, "site_id": site_id, "status": report.status, "report": {}, "updated_us": now}
    insert_ignore(s, m.RoundTarget, fresh)
    target = {"round": round_id, "site": site_id}
    earlier = s.scalar(_TARGET_REPORT, target)
    doc = (report.after(TargetReport.from_dict(earlier)) if earlier else report).to_dict()
    s.execute(_SET_TARGET_REPORT, {**target, "new_status": report.status, "doc": doc, "now": now})


# built once (catalog.sql says why): every target of every round records its report
_CLEAR_BACKOFF = delete(m.Backoff).where(
    m.Backoff.table_id == bindparam("table_id"), m.Backoff.site_id == bindparam("site_id")
)
# (not named for their columns: an UPDATE keeps those names for its SET clause)
_THIS_TARGET = (m.RoundTarget.round_id == bindparam("round"), m.RoundTarget.site_id == bindparam("site"))
_TARGET_REPORT = select(m.RoundTarget.report).where(*_THIS_TARGET).with_for_update()
_SET_TARGET_REPORT = (
    update(m.RoundTarget)
    .where(*_THIS_TARGET)
    .values(
        status=bindparam("new_status"),
        report=bindparam("doc", type_=m.RoundTarget.__table__.c.report.type),
        updated_us=bindparam("now"),
    )
)
