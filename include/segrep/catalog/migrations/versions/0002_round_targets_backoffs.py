"""round targets and back-offs; one round per (table, interval end)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "round_targets",
        sa.Column("round_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("site_id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.Column("updated_us", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["round_id"], ["rounds.round_id"]),
        sa.ForeignKeyConstraint(["site_id"], ["sites.site_id"]),
        sa.PrimaryKeyConstraint("round_id", "site_id"),
    )
    op.create_table(
        "backoffs",
        sa.Column("table_id", sa.Integer(), nullable=False),
        sa.Column("site_id", sa.Integer(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("next_attempt_us", sa.BigInteger(), nullable=False),
        sa.Column("last_reason", sa.Text(), nullable=True),
        sa.Column("updated_us", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["site_id"], ["sites.site_id"]),
        sa.ForeignKeyConstraint(["table_id"], ["tables.table_id"]),
        sa.PrimaryKeyConstraint("table_id", "site_id"),
    )
    with op.batch_alter_table("rounds") as batch:
        batch.create_unique_constraint("uq_rounds_table_end", ["table_id", "interval_end_us"])


def downgrade() -> None:
    with op.batch_alter_table("rounds") as batch:
        batch.drop_constraint("uq_rounds_table_end", type_="unique")
    op.drop_table("backoffs")
    op.drop_table("round_targets")
