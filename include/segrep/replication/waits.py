"""A round held up by another round's leases says so (DESIGN section 13: WAITING, never ok).

Leases are taken under a round's key (``<table>-<end_us>``, :mod:`segrep.replication.round`). A target whose
offers another round is receiving (INFLIGHT), whose window another round fills (OVERLOADED), or whose own
writes wait for another round's merge at the leader, is WAITING: the report names the round (its id, else its
key) and when the lease lapses unless that round's heartbeat renews it (a dead round's then does).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from segrep.catalog import leases as ls
from segrep.catalog import models as m
from segrep.core import hlc


@dataclass(frozen=True)
class LeaseWait:
    """The lease a round waits for: who holds it (the round's id when its row exists) and until when."""

    holder: str
    round_id: int | None
    expires_us: int
    segments: int

    def reason(self) -> str:
        return f"waiting: {held_by(self.holder, self.round_id, self.expires_us)}"


def held_by(holder: str, round_id: int | None, expires_us: int) -> str:
    """``leases held by round N until <time>`` (the holder's key where no round row names it)."""
    who = f"round {round_id}" if round_id is not None else f"{holder!r}"
    try:
        until = hlc.iso(expires_us)
    except (ValueError, OverflowError):  # past the calendar (a lease set never to lapse)
        until = f"{expires_us} us (never)"
    return f"leases held by {who} until {until}"


def lease_wait(
    s: Session,
    table_id: int,
    placement_ids: list[int],
    own_key: str,
    now_us: int,
    segments: Collection[str] | None = None,
) -> LeaseWait | None:
    """The other rounds' live leases on these placements (on ``segments`` only, if given), as the one to wait
    for: the holder whose leases last longest, with how many segments they hold; None if there are none."""
    held = [
        h
        for h in ls.held(s, placement_ids, now_us)
        if h.holder != own_key and (segments is None or h.segment_id in segments)
    ]
    if not held:
        return None
    last = max(held, key=lambda h: (h.expires_us, h.holder))
    mine = [h for h in held if h.holder == last.holder]
    return LeaseWait(last.holder, round_ids(s, table_id, [last.holder]).get(last.holder), last.expires_us, len(mine))


def round_ids(s: Session, table_id: int, holders: Collection[str]) -> dict[str, int]:
    """Round key -> round id, for the keys that are a round of this table with a row (one query)."""
    ends = {holder: end for holder in holders if (end := _end_of(holder)) is not None}
    if not ends:
        return {}
    rows = s.execute(_ROUNDS, {"table_id": table_id, "ends": sorted(set(ends.values()))}).all()
    by_end = {end: round_id for round_id, end in rows}
    return {holder: by_end[end] for holder, end in ends.items() if end in by_end}


def _end_of(holder: str) -> int | None:
    _, _, end = holder.rpartition("-")
    return int(end) if end.isdigit() else None


# built once (catalog.sql says why)
_ROUNDS = select(m.Round.round_id, m.Round.interval_end_us).where(
    m.Round.table_id == bindparam("table_id"), m.Round.interval_end_us.in_(bindparam("ends", expanding=True))
)
