"""Publications (issue 37, DESIGN section 18): one row per table and site whose copy is published as an Iceberg
table: the outcome of its last publication (published, waiting, failed and why), and the snapshot and safe time
its Iceberg table shows (kept when a later publication fails: that snapshot stays current). What ``segrep
status`` shows under "open tables"; the Iceberg catalog itself (pyiceberg's tables) is the source of truth for
readers. ``state_token`` digests what the catalog said the site served when that snapshot was committed: the
next publication that finds the same token has nothing to do and reads no file.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "publications",
        sa.Column("table_id", sa.Integer(), sa.ForeignKey("tables.table_id"), primary_key=True),
        sa.Column("site_id", sa.Integer(), sa.ForeignKey("sites.site_id"), primary_key=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("snapshot_id", sa.BigInteger(), nullable=True),
        sa.Column("safe_time_us", sa.BigInteger(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False, server_default=""),
        sa.Column("state_token", sa.String(length=32), nullable=True),
        sa.Column("updated_us", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("publications")
