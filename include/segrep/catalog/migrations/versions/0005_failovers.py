"""failovers: the leader moves of each table; partitions.paused_us for planned switchovers

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("partitions") as batch:
        batch.add_column(sa.Column("paused_us", sa.BigInteger(), nullable=True))
    op.create_table(
        "failovers",
        sa.Column("failover_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("table_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("from_site_id", sa.Integer(), nullable=False),
        sa.Column("to_site_id", sa.Integer(), nullable=False),
        sa.Column("cut", sa.String(length=16), nullable=False),
        sa.Column("cut_us", sa.BigInteger(), nullable=True),
        sa.Column("on_return", sa.String(length=16), nullable=False),
        sa.Column("loss", sa.JSON(), nullable=False),
        sa.Column("done_us", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["from_site_id"], ["sites.site_id"]),
        sa.ForeignKeyConstraint(["table_id"], ["tables.table_id"]),
        sa.ForeignKeyConstraint(["to_site_id"], ["sites.site_id"]),
        sa.PrimaryKeyConstraint("failover_id"),
    )
    op.create_index("ix_failovers_table", "failovers", ["table_id", "done_us"])


def downgrade() -> None:
    op.drop_index("ix_failovers_table", table_name="failovers")
    op.drop_table("failovers")
    with op.batch_alter_table("partitions") as batch:
        batch.drop_column("paused_us")
