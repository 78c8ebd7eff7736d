"""Schema versions (issue 35): ``schema_versions`` holds every version of a table's columns with field ids;
``tables.schema_version`` and ``tables.next_field_id`` say which is current and which id comes next;
``segments.schema_version`` the version each file was written at (1 for every file written before). Each
existing table gets version 1 from ``tables.columns``: field ids 1..n in column order, as
``core.schema_versions.first_version`` makes them, and its fingerprint is recomputed the way
``core.schema_changes.version_fingerprint`` computes it (field ids, names, types and the key).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from __future__ import annotations

import hashlib
import json
import time

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    versions = op.create_table(
        "schema_versions",
        sa.Column("table_id", sa.Integer(), sa.ForeignKey("tables.table_id"), primary_key=True),
        sa.Column("version", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("columns", sa.JSON(), nullable=False),
        sa.Column("created_us", sa.BigInteger(), nullable=False),
        sa.Column("change", sa.Text(), nullable=False),
    )
    with op.batch_alter_table("tables") as batch:
        batch.add_column(sa.Column("schema_version", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("next_field_id", sa.Integer(), nullable=False, server_default="1"))
    with op.batch_alter_table("segments") as batch:
        batch.add_column(sa.Column("schema_version", sa.Integer(), nullable=False, server_default="1"))
    conn = op.get_bind()
    tables = sa.table(
        "tables",
        sa.column("table_id", sa.Integer()),
        sa.column("columns", sa.JSON()),
        sa.column("primary_key", sa.JSON()),
        sa.column("next_field_id", sa.Integer()),
        sa.column("schema_fingerprint", sa.String()),
    )
    now = time.time_ns() // 1000
    rows = []
    for table_id, columns, primary_key in conn.execute(
        sa.select(tables.c.table_id, tables.c.columns, tables.c.primary_key)
    ).all():
        cols = [{"id": i, "name": name, "type": kind} for i, (name, kind) in enumerate(columns.items(), 1)]
        rows.append({"table_id": table_id, "version": 1, "columns": cols, "created_us": now, "change": "created"})
        doc = json.dumps(
            {"columns": [[c["id"], c["name"], c["type"]] for c in cols], "key": list(primary_key)}, sort_keys=True
        )
        conn.execute(
            sa.update(tables)
            .where(tables.c.table_id == table_id)
            .values(next_field_id=len(cols) + 1, schema_fingerprint=hashlib.sha256(doc.encode()).hexdigest()[:16])
        )
    if rows:
        op.bulk_insert(versions, rows)


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN, not a batch: SQLite's batch copies the table, which other tables' foreign
    # keys refuse while they have rows (SQLite has had DROP COLUMN since 3.35)
    for table, column in (("segments", "schema_version"), ("tables", "next_field_id"), ("tables", "schema_version")):
        op.execute(sa.text(f'ALTER TABLE "{table}" DROP COLUMN "{column}"'))
    op.drop_table("schema_versions")
