"""A round's identity and its catalog row: the key that holds its leases, its interval end, its record.

A round for the interval ending at ``end_us`` offers only segments committed before ``end_us``. Its key,
``<table>-<end_us>``, holds every lease it takes: a retried task of the same round re-uses its own leases,
another round sees INFLIGHT.

Leases live :func:`lease_ttl_us` (30 s unless ``$SEGREP_LEASE_TTL_S`` says otherwise) and every process doing
a round's work renews its key's leases by a heartbeat (:mod:`segrep.replication.heartbeat`): a round killed
at any point blocks other rounds for at most one TTL.
"""

from __future__ import annotations

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from segrep.catalog import models as m
from segrep.catalog.sql import insert_ignore
from segrep.core import hlc
from segrep.core.errors import SegrepError
from segrep.core.settings import seconds_from_env
from segrep.replication.reports import RoundStatus

LEASE_TTL_ENV = "SEGREP_LEASE_TTL_S"
DEFAULT_LEASE_TTL_S = 30.0
_MAX_LEASE_TTL_S = 3600.0


class TargetUnreachable(SegrepError):
    """A target site could not be written (down, full, permission): its task fails and Airflow retries."""


class TargetHeldBack(TargetUnreachable):
    """A target the round planned to serve was not tried: it is backing off after failures. Its task fails
    too, so the operator's retry ("Clear only failed tasks") is the attempt the back-off does not hold back."""


def lease_ttl_us() -> int:
    """How long a lease lives without a heartbeat: how long a dead round can block another one."""
    return int(seconds_from_env(LEASE_TTL_ENV, DEFAULT_LEASE_TTL_S, _MAX_LEASE_TTL_S) * 1_000_000)


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
    return round_row(s, table_id, end_us)


def round_row(s: Session, table_id: int, end_us: int) -> m.Round:
    """The row of the table's round for the interval ending at ``end_us`` (it must exist)."""
    return s.scalars(_ROUND, {"table_id": table_id, "end_us": end_us}).one()


# built once (catalog.sql says why)
_ROUND = select(m.Round).where(
    m.Round.table_id == bindparam("table_id"), m.Round.interval_end_us == bindparam("end_us")
)
