"""A round's identity and its catalog row: the key that holds its leases, its interval end, its record.

A round for the interval ending at ``end_us`` offers only segments committed before ``end_us``. Its key,
``<table>-<end_us>``, holds every lease it takes: a retried task of the same round re-uses its own leases,
another round sees INFLIGHT.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from segrep.catalog import models as m
from segrep.catalog.sql import insert_ignore
from segrep.core import hlc
from segrep.core.errors import SegrepError
from segrep.replication.reports import RoundStatus

LEASE_TTL_US = 30 * 60 * 1_000_000  # a fast-forward receipt
MERGE_LEASE_TTL_US = 6 * 3600 * 1_000_000  # a pushed segment waiting for its Spark merge


class TargetUnreachable(SegrepError):
    """A target site could not be written (down, full, permission): its task fails and Airflow retries."""


def round_key(table: str, end_us: int) -> str:
    return f"{table}-{end_us}"


def clamp_end(end_us: int | None, now_us: int | None = None) -> int:
    """The interval end, never in the future (a segment committed later must not be claimed by this round)."""
    now = hlc.now_us() if now_us is None else now_us
    return now if end_us is None else min(end_us, now)


def ensure_round(s: Session, table_id: int, end_us: int, start_us: int | None) -> m.Round:
    """The round's row, created by whichever step of the round runs first."""
    row: dict[str, object] = {
        "table_id": table_id,
        "interval_start_us": start_us,
        "interval_end_us": end_us,
        "status": RoundStatus.RUNNING,
        "started_us": hlc.now_us(),
        "report": {},
    }
    insert_ignore(s, m.Round, row)
    return s.scalars(select(m.Round).where(m.Round.table_id == table_id, m.Round.interval_end_us == end_us)).one()
