"""Receipts, on SQLite and PostgreSQL: in flight (leases) and done (acks). Every write of either table is here.

A lease row says "target placement T is receiving segment S until E". The unique key (T, S) is the lock:
two executions of the same offer race on the INSERT, and the loser sees an integrity error and answers
INFLIGHT. Nothing here reads and then writes across transactions.

Leases are short and kept alive by their holder (:func:`renew`, called by a heartbeat while the work runs),
so a holder that died (kill -9, an OOM-killed worker) stops renewing and its leases lapse within one TTL
instead of blocking other rounds for the length of the longest copy or merge.

An ack row says "target placement T holds holder placement H's segment S" (EventQL 3.6: by placement id, never
by site name): the receiver's commit, the sender's ack, a merge at the leader, a split's copy record them
(:func:`record_ack`, :func:`record_acks`); a restart from the newest major (OUT_OF_ORDER), a rollback, GC, a
fork the union rule found, an accepted loss and a retired placement drop them (:func:`drop_acks`). Every
function takes the caller's session and runs in its transaction (``tests/catalog/test_receipt_writers.py``
checks that no other module writes either table).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BindParameter, ColumnElement, Select, bindparam, delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import InstrumentedAttribute, Session

from segrep.catalog import models as m
from segrep.catalog.sql import ignoring_insert, insert_ignore, rowcount

Ids = int | Collection[int] | Select[Any]  # placement ids to match: one (=), several or a subquery (IN)
SegmentIds = str | Collection[str]

# built once (catalog.sql says why): every offer of a round runs these
_TARGETS: BindParameter[list[Any]] = bindparam("targets", expanding=True)
_EXPIRE = (
    delete(m.Lease)
    .where(m.Lease.target_placement_id.in_(_TARGETS), m.Lease.expires_us <= bindparam("now"))
    .execution_options(synchronize_session=False)
)
_RELEASE_MANY = (
    delete(m.Lease)
    .where(
        m.Lease.target_placement_id == bindparam("target"),
        m.Lease.segment_id.in_(bindparam("segments", expanding=True)),
        m.Lease.holder == bindparam("holder"),
    )
    .execution_options(synchronize_session=False)
)
_LIVE = select(m.Lease.target_placement_id, m.Lease.segment_id, m.Lease.holder).where(
    m.Lease.target_placement_id.in_(_TARGETS), m.Lease.expires_us > bindparam("now")
)


def expire(s: Session, target_placement_ids: int | list[int], now_us: int) -> None:
    """Drop expired leases of these targets (a plain DELETE: no scan of the objects loaded in the session)."""
    ids = [target_placement_ids] if isinstance(target_placement_ids, int) else target_placement_ids
    if ids:
        s.execute(_EXPIRE, {"targets": ids, "now": now_us})


def in_flight(s: Session, target_placement_id: int, now_us: int) -> dict[str, str]:
    """Segment id -> lease holder of every unexpired receipt at the target."""
    return in_flight_many(s, [target_placement_id], now_us).get(target_placement_id, {})


def in_flight_many(s: Session, target_placement_ids: list[int], now_us: int) -> dict[int, dict[str, str]]:
    """Per target: segment id -> lease holder of every unexpired receipt (one query for many targets)."""
    out: dict[int, dict[str, str]] = {}
    if target_placement_ids:
        for target, seg, holder in s.execute(_LIVE, {"targets": target_placement_ids, "now": now_us}):
            out.setdefault(target, {})[seg] = holder
    return out


def acquire(s: Session, target_placement_id: int, segment_id: str, holder: str, expires_us: int) -> bool:
    """Take the lease in a savepoint; False if another holder has it (the INSERT lost the race)."""
    try:
        with s.begin_nested():
            s.add(
                m.Lease(
                    target_placement_id=target_placement_id, segment_id=segment_id, holder=holder, expires_us=expires_us
                )
            )
            s.flush()
    except IntegrityError:
        return False
    return True


def acquire_many(
    s: Session, target_placement_id: int, segment_ids: list[str], holder: str, expires_us: int
) -> set[str]:
    """Take the leases on these segments of one target in one statement; the ids taken (a segment whose lease
    another holder has is left out: INSERT ... ON CONFLICT DO NOTHING, RETURNING what went in)."""
    if not segment_ids:
        return set()
    rows = [
        {"target_placement_id": target_placement_id, "segment_id": seg, "holder": holder, "expires_us": expires_us}
        for seg in segment_ids
    ]
    # the rows as parameters of one statement (one compiled form whatever their number), not inlined as VALUES
    return set(s.scalars(ignoring_insert(s, m.Lease, ("segment_id",)), rows))


def release(s: Session, target_placement_id: int, segment_id: str, holder: str) -> bool:
    """Drop our lease; False if it is no longer ours (it expired and someone else took it)."""
    res = s.execute(
        delete(m.Lease)
        .where(
            m.Lease.target_placement_id == target_placement_id,
            m.Lease.segment_id == segment_id,
            m.Lease.holder == holder,
        )
        .execution_options(synchronize_session=False)
    )
    return bool(rowcount(res))


def release_many(s: Session, target_placement_id: int, segment_ids: list[str], holder: str) -> None:
    """Drop the holder's leases on these segments of one target (``release`` for a batch, one statement)."""
    s.execute(_RELEASE_MANY, {"target": target_placement_id, "segments": segment_ids, "holder": holder})


def drop_leases(s: Session, *, targets: Ids | None = None, holder: str | None = None) -> None:
    """Drop the leases on these target placements (one id, several, or a subquery), or held by ``holder``, or
    both: a failed target's leases of one round, a round's leases once it committed, those of placements
    that are retired or dropped with their table."""
    s.execute(_matching_delete(m.Lease, (m.Lease.target_placement_id, targets), (m.Lease.holder, holder)))


def renew(s: Session, holder: str, expires_us: int, now_us: int) -> int:
    """Push the expiry of the holder's live leases to ``expires_us``; how many it renewed. A lease that lapsed
    is not revived: another holder may already have taken the segment."""
    res = s.execute(
        update(m.Lease)
        .where(m.Lease.holder == holder, m.Lease.expires_us > now_us)
        .values(expires_us=expires_us)
        .execution_options(synchronize_session=False)
    )
    return rowcount(res)


@dataclass(frozen=True)
class HeldLease:
    """A live lease as ``segrep status`` shows it: who holds it (a round's key) and until when."""

    target_placement_id: int
    segment_id: str
    holder: str
    expires_us: int


def held(s: Session, target_placement_ids: list[int], now_us: int) -> list[HeldLease]:
    """Every unexpired lease on these placements, oldest expiry first."""
    if not target_placement_ids:
        return []
    q = (
        select(m.Lease.target_placement_id, m.Lease.segment_id, m.Lease.holder, m.Lease.expires_us)
        .where(m.Lease.target_placement_id.in_(target_placement_ids), m.Lease.expires_us > now_us)
        .order_by(m.Lease.expires_us, m.Lease.segment_id)
    )
    return [HeldLease(t, seg, holder, exp) for t, seg, holder, exp in s.execute(q)]


def count(s: Session, target_placement_id: int, now_us: int) -> int:
    q = select(func.count()).where(m.Lease.target_placement_id == target_placement_id, m.Lease.expires_us > now_us)
    return int(s.scalar(q) or 0)


# -- acks ------------------------------------------------------------------------------------------------------


def record_ack(s: Session, holder_id: int, segment_id: str, target_id: int, acked_us: int) -> None:
    """Note that ``target_id`` holds the holder's segment (EventQL 3.6: acks are by placement id); idempotent."""
    insert_ignore(
        s,
        m.Ack,
        {
            "holder_placement_id": holder_id,
            "segment_id": segment_id,
            "target_placement_id": target_id,
            "acked_us": acked_us,
        },
    )


def record_acks(s: Session, acks: list[tuple[int, str, int]], now_us: int) -> None:
    """``record_ack`` for a whole batch of (holder, segment, target): one INSERT ... ON CONFLICT DO NOTHING
    executed for every row at once, instead of one statement per segment."""
    if not acks:
        return
    rows = [
        {"holder_placement_id": holder, "segment_id": seg, "target_placement_id": target, "acked_us": now_us}
        for holder, seg, target in acks
    ]
    s.execute(ignoring_insert(s, m.Ack), rows)


def drop_acks(
    s: Session, *, holders: Ids | None = None, segments: SegmentIds | None = None, targets: Ids | None = None
) -> None:
    """Drop the acks that match every filter given: the holder placements, the segments and the target
    placements, each one id (``=``), several or a subquery (``IN``). At least one filter is required."""
    s.execute(
        _matching_delete(
            m.Ack,
            (m.Ack.holder_placement_id, holders),
            (m.Ack.segment_id, segments),
            (m.Ack.target_placement_id, targets),
        )
    )


def _matching_delete(model: type[m.Base], *filters: tuple[InstrumentedAttribute[Any], Any]) -> Any:
    """DELETE FROM ``model`` WHERE each filter given holds: ``column = value`` for one value, ``column IN``
    for a collection or a subquery; a DELETE without any filter is refused (it would empty the table)."""
    terms: list[ColumnElement[bool]] = [
        column == value if isinstance(value, int | str) else column.in_(value)
        for column, value in filters
        if value is not None
    ]
    if not terms:
        raise ValueError(f"refusing to delete every row of {model.__tablename__}")
    return delete(model).where(*terms).execution_options(synchronize_session=False)
