"""A table's schema versions in the catalog (``schema_versions``): look-ups for the writer, the readers and
``table describe``, and recording a new version (apply, rebuild).

``tables.columns`` stays the current version's visible columns ({name: type}) so code that only needs the
current shape reads the table row alone; ``tables.schema_version`` names the current version.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import flag_modified

from segrep.catalog import models as m
from segrep.core import hlc
from segrep.core.errors import NotFoundError
from segrep.core.schema_changes import version_fingerprint
from segrep.core.schema_versions import Column, SchemaVersion


@dataclass(frozen=True)
class SchemaHistoryEntry:
    """One version of a table's schema: the version, when it was made (µs) and what changed."""

    schema: SchemaVersion
    created_us: int
    change: str

    @property
    def version(self) -> int:
        return self.schema.version


def _of(row: m.SchemaVersionRow) -> SchemaVersion:
    return SchemaVersion(row.version, tuple(Column.from_dict(c) for c in row.columns))


def schema_version(s: Session, table_id: int, version: int) -> SchemaVersion:
    """Version ``version`` of the table's schema; NotFoundError if the catalog has no such version."""
    row = s.get(m.SchemaVersionRow, (table_id, version))
    if row is None:
        raise NotFoundError(f"table id {table_id} has no schema version {version} in the catalog")
    return _of(row)


def current_schema(s: Session, table_id: int) -> SchemaVersion:
    """The table's current schema version (``tables.schema_version``)."""
    table = s.get(m.Table, table_id)
    if table is None:
        raise NotFoundError(f"no table with id {table_id} in the catalog")
    return schema_version(s, table_id, table.schema_version)


def schema_versions(s: Session, table_id: int) -> dict[int, SchemaVersion]:
    """Every version of the table's schema by number (a reader of many segments maps each file's version)."""
    return {e.version: e.schema for e in schema_history(s, table_id)}


def schema_history(s: Session, table_id: int) -> list[SchemaHistoryEntry]:
    """Every version of the table's schema, oldest first."""
    rows = s.scalars(
        select(m.SchemaVersionRow).where(m.SchemaVersionRow.table_id == table_id).order_by(m.SchemaVersionRow.version)
    )
    return [SchemaHistoryEntry(_of(row), row.created_us, row.change) for row in rows]


def record_version(
    s: Session, table: m.Table, version: SchemaVersion, change: str, next_field_id: int, *, current: bool = True
) -> None:
    """Add ``version`` to the table's history and (``current``) make it the table's current version: its
    visible columns, fingerprint and next free field id, in the caller's transaction."""
    s.add(
        m.SchemaVersionRow(
            table_id=table.table_id,
            version=version.version,
            columns=[c.to_dict() for c in version.columns],
            created_us=hlc.now_us(),
            change=change,
        )
    )
    table.next_field_id = max(table.next_field_id or 1, next_field_id)
    if current:
        table.schema_version = version.version
        table.columns = {c.name: c.type for c in version.columns}
        # a reorder alone makes a dict equal to the old one, which the ORM would not write back
        flag_modified(table, "columns")
        table.schema_fingerprint = version_fingerprint(version, table.primary_key)
    s.flush()


def site_schema_versions(s: Session, table_id: int) -> dict[int, int]:
    """Per site id: the newest schema version among the segments its placements of the table hold (one GROUP
    BY; versions only grow, so the highest is the newest segment's). A site holding no segment is absent."""
    pl, pa, sg = m.Placement, m.Partition, m.Segment
    rows = s.execute(
        select(pl.site_id, func.max(sg.schema_version))
        .join(pl, pl.placement_id == sg.placement_id)
        .join(pa, pa.partition_id == pl.partition_id)
        .where(pa.table_id == table_id, pl.removed_us.is_(None))
        .group_by(pl.site_id)
    ).all()
    return {int(site): int(version) for site, version in rows}


def schema_text(site_version: int | None, table_version: int) -> str:
    """A site's newest segment's version beside the table's: ``v3``, or ``v2 (table v3)`` while the site
    holds no segment written at the current version yet (not an error: old segments stay valid), or
    ``- (table v3)`` for a site holding no segment."""
    if site_version == table_version:
        return f"v{table_version}"
    return f"{'-' if site_version is None else f'v{site_version}'} (table v{table_version})"
