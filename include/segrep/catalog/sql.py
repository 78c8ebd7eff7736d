"""Generic SQL helpers that behave the same on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any, TypeVar, cast

from sqlalchemy import CursorResult, Result
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from segrep.catalog import models as m
from segrep.core.errors import NotFoundError

Row = TypeVar("Row", bound=m.Base)


def conflict_insert(s: Session, model: type[m.Base]) -> postgresql.Insert | sqlite.Insert:
    """An INSERT into ``model`` in the session's dialect, which offers ON CONFLICT (both catalogs have it)."""
    return postgresql.insert(model) if s.get_bind().dialect.name == "postgresql" else sqlite.insert(model)


def insert_ignore(s: Session, model: type[m.Base], values: dict[str, Any]) -> bool:
    """INSERT the row unless its key exists (ON CONFLICT DO NOTHING); True if a row was inserted."""
    ins = conflict_insert(s, model)
    key = list(model.__table__.primary_key)
    # RETURNING says whether a row went in; rowcount cannot (PostgreSQL drivers may report -1 for an INSERT)
    return s.execute(ins.values(**values).on_conflict_do_nothing().returning(*key)).first() is not None


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


def rowcount(result: Result[Any]) -> int:
    """Rows matched by an UPDATE or DELETE (what a conditional update's caller checks)."""
    return cast(CursorResult[Any], result).rowcount


def must_get(s: Session, model: type[Row], key: Any, *, lock: bool = False, what: str | None = None) -> Row:
    """The row with this primary key (locked FOR UPDATE if asked), or NotFoundError naming it."""
    row = s.get(model, key, with_for_update=lock)
    if row is None:
        raise NotFoundError(f"no {what or model.__tablename__} {key} in the catalog")
    return row
