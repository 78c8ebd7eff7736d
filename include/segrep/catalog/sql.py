"""Generic SQL helpers that behave the same on SQLite and PostgreSQL.

Statements on a round's hot path (each offer and commit of every batch) are built once, with bound
parameters (``bindparam``; lists as expanding parameters), and executed with their values: building a
statement costs SQLAlchemy more than SQLite takes to run it (about 100 us against 5 us here), and a round's
catalog work is on its critical path (every millisecond of it is one of the round's).
"""

from __future__ import annotations

import functools
from typing import Any, TypeVar, cast

from sqlalchemy import CursorResult, Executable, Result
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from segrep.catalog import models as m
from segrep.core.errors import NotFoundError

Row = TypeVar("Row", bound=m.Base)


def ignoring_insert(s: Session, model: type[m.Base], returning: tuple[str, ...] = ()) -> Executable:
    """INSERT ... ON CONFLICT DO NOTHING into ``model`` in the session's dialect (both catalogs have it),
    RETURNING the columns named in ``returning``; built once per dialect, its rows are the parameters of the
    execution."""
    return _ignoring_insert(s.get_bind().dialect.name, model, returning)


@functools.cache
def _ignoring_insert(dialect: str, model: type[m.Base], returning: tuple[str, ...]) -> Executable:
    stmt = (postgresql.insert(model) if dialect == "postgresql" else sqlite.insert(model)).on_conflict_do_nothing()
    return stmt.returning(*(model.__table__.c[name] for name in returning)) if returning else stmt


def insert_ignore(s: Session, model: type[m.Base], values: dict[str, Any]) -> bool:
    """INSERT the row unless its key exists (ON CONFLICT DO NOTHING); True if a row was inserted."""
    # RETURNING says whether a row went in; rowcount cannot (PostgreSQL drivers may report -1 for an INSERT)
    key = tuple(column.name for column in model.__table__.primary_key)
    return s.execute(ignoring_insert(s, model, key), values).first() is not None


def rowcount(result: Result[Any]) -> int:
    """Rows matched by an UPDATE or DELETE (what a conditional update's caller checks)."""
    return cast(CursorResult[Any], result).rowcount


def must_get(s: Session, model: type[Row], key: Any, *, lock: bool = False, what: str | None = None) -> Row:
    """The row with this primary key (locked FOR UPDATE if asked), or NotFoundError naming it."""
    row = s.get(model, key, with_for_update=lock)
    if row is None:
        raise NotFoundError(f"no {what or model.__tablename__} {key} in the catalog")
    return row
