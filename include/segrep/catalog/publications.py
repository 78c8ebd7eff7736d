"""The outcome of each site's last Iceberg publication (``publications``), for ``segrep status``.

Written by ``segrep.publish`` after every publication that did something (published, waited, failed); the
snapshot and safe time are those the site's Iceberg table shows, so a failure keeps them: that snapshot is
still what readers see. The row is an upsert under the row's own lock (an update, or an insert when there is
none; two first publications racing: the loser's insert fails and it updates).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from segrep.catalog import models as m
from segrep.catalog.engine import Catalog
from segrep.core import hlc


@dataclass(frozen=True)
class PublicationState:
    table: str
    site: str
    status: str  # published | waiting | failed
    snapshot_id: int | None
    safe_time_us: int | None
    detail: str
    updated_us: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def record(
    catalog: Catalog,
    table_id: int,
    site_id: int,
    status: str,
    detail: str = "",
    *,
    snapshot_id: int | None = None,
    safe_time_us: int | None = None,
    state_token: str | None = None,
) -> None:
    """Record a publication's outcome; ``snapshot_id``, ``safe_time_us`` and ``state_token`` only when the
    site's table shows the state (otherwise the row keeps the ones readers still see, and no token)."""
    values: dict[str, Any] = {"status": status, "detail": detail, "updated_us": hlc.now_us(), "state_token": None}
    if snapshot_id is not None:
        values.update(snapshot_id=snapshot_id, safe_time_us=safe_time_us, state_token=state_token)
    where = (m.PublicationRow.table_id == table_id, m.PublicationRow.site_id == site_id)
    for _ in range(2):
        try:
            with catalog.write() as s:
                if s.execute(update(m.PublicationRow).where(*where).values(**values)).rowcount == 0:  # type: ignore[attr-defined]
                    s.add(m.PublicationRow(table_id=table_id, site_id=site_id, **values))
            return
        except IntegrityError:  # another publisher inserted the row first: update it
            continue


def recorded_token(s: Session, table_id: int, site_id: int) -> tuple[str | None, int | None, int | None]:
    """The recorded state token, snapshot id and safe time of a site's publication (None: none recorded)."""
    row = s.get(m.PublicationRow, (table_id, site_id))
    if row is None or row.status != "published":
        return None, None, None
    return row.state_token, row.snapshot_id, row.safe_time_us


def publication_states(s: Session, table: str | None = None) -> list[PublicationState]:
    """Every recorded publication (of ``table``), by table and site name."""
    query = (
        select(m.PublicationRow, m.Table.name, m.Site.name)
        .join(m.Table, m.Table.table_id == m.PublicationRow.table_id)
        .join(m.Site, m.Site.site_id == m.PublicationRow.site_id)
        .order_by(m.Table.name, m.Site.name)
    )
    if table is not None:
        query = query.where(m.Table.name == table)
    return [
        PublicationState(t, site, row.status, row.snapshot_id, row.safe_time_us, row.detail, row.updated_us)
        for row, t, site in s.execute(query).all()
    ]


def abandoned(s: Session, table_id: int) -> list[m.Site]:
    """The sites with a recorded publication of the table that hold no placement of it any more (a replica
    removed by ``apply``): their Iceberg tables are stale and are unregistered (``publish.publisher``)."""
    holding = (
        select(m.Placement.site_id)
        .join(m.Partition, m.Partition.partition_id == m.Placement.partition_id)
        .where(m.Partition.table_id == table_id, m.Placement.removed_us.is_(None))
    )
    query = (
        select(m.Site)
        .join(m.PublicationRow, m.PublicationRow.site_id == m.Site.site_id)
        .where(m.PublicationRow.table_id == table_id, m.Site.site_id.not_in(holding))
        .order_by(m.Site.name)
    )
    return list(s.scalars(query))


def forget(catalog: Catalog, table_id: int, site_id: int) -> None:
    """Remove the record of a site's publications of a table (its Iceberg table was unregistered)."""
    with catalog.write() as s:
        s.execute(
            delete(m.PublicationRow).where(m.PublicationRow.table_id == table_id, m.PublicationRow.site_id == site_id)
        )
