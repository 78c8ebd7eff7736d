"""A damaged JSON value in the catalog, named by table, row and column instead of a bare JSONDecodeError.

A SQLite catalog keeps its JSON columns (segment key ranges, partition bounds, round reports, ...) as text:
an edit by hand, a bad disk or a partial restore can leave one that does not parse, and the decoding then
failed deep inside whichever command read the row, naming neither. The catalog's engine decodes them with
:func:`loads`, which raises DamagedValueError; the catalog's sessions turn that into an error naming where the
value is (:func:`locate`), by a scan that runs only then. (PostgreSQL checks JSON when it is stored.)
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import JSON, Text, select, type_coerce
from sqlalchemy.engine import Engine

from segrep.catalog import models as m
from segrep.core.errors import SegrepError

_SHOWN = 40  # characters of the damaged text shown in the error
REBUILD = "`segrep init`, `segrep apply`, then `segrep catalog rebuild --site SITE` for each site"
# Columns that say which row a damaged value belongs to, besides its primary key
_IDENTIFYING = ("name", "segment_id", "partition_id", "table_id")


class DamagedValueError(SegrepError):
    """A JSON value read from the catalog does not parse; ``raw`` is its text."""

    def __init__(self, raw: str) -> None:
        super().__init__(f"a JSON value in the catalog does not parse: {raw[:_SHOWN]!r}")
        self.raw = raw


def loads(text: str) -> Any:
    """The catalog engine's JSON decoder: ``json.loads``, raising DamagedValueError for text that is not JSON."""
    try:
        return json.loads(text)
    except ValueError:
        raise DamagedValueError(text) from None


def locate(engine: Engine, damaged: DamagedValueError, url: str) -> SegrepError:
    """The error to show for ``damaged``: the catalog table, the row (with the replicated table it belongs to)
    and the column holding that text, or the text alone if no column holds it."""
    advice = f"restore the catalog from a backup, or rebuild a new one from the sites' files ({REBUILD})"
    shown = repr(damaged.raw[:_SHOWN]) + ("..." if len(damaged.raw) > _SHOWN else "")
    with engine.connect() as conn:
        for table in m.Base.metadata.sorted_tables:
            ident = [c for c in table.columns if c.primary_key or c.name in _IDENTIFYING]
            for column in (c for c in table.columns if isinstance(c.type, JSON)):
                found = select(*ident).where(type_coerce(column, Text) == damaged.raw).limit(1)
                row = conn.execute(found).mappings().first()
                if row is None:
                    continue
                where = ", ".join(f"{key} {value}" for key, value in row.items())
                owner = _owner(conn, row)
                return SegrepError(
                    f"catalog {url} is damaged: {table.name}.{column.name} of the row with {where}"
                    f"{f' (table {owner})' if owner else ''} is not valid JSON ({shown}); {advice}"
                )
    return SegrepError(f"catalog {url} is damaged: a JSON value does not parse ({shown}); {advice}")


def _owner(conn: Any, row: Any) -> str | None:
    """The replicated table a catalog row belongs to, through its table or partition id."""
    if "table_id" in row:
        owner = select(m.Table.name).where(m.Table.table_id == row["table_id"])
    elif "partition_id" in row:
        owner = select(m.Table.name).join(m.Partition, m.Partition.table_id == m.Table.table_id)
        owner = owner.where(m.Partition.partition_id == row["partition_id"])
    else:
        return None
    name: str | None = conn.execute(owner).scalar()
    return name
