"""file checks per placement and segment; verification records per table and site

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "file_checks",
        sa.Column("placement_id", sa.Integer(), nullable=False),
        sa.Column("segment_id", sa.String(length=32), nullable=False),
        sa.Column("last_good_us", sa.BigInteger(), nullable=True),
        sa.Column("checked_us", sa.BigInteger(), nullable=False),
        sa.Column("problem", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["placement_id"], ["placements.placement_id"]),
        sa.PrimaryKeyConstraint("placement_id", "segment_id"),
    )
    op.create_table(
        "verifications",
        sa.Column("verification_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("table_id", sa.Integer(), nullable=False),
        sa.Column("site_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("as_of_us", sa.BigInteger(), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("differences", sa.BigInteger(), nullable=False),
        sa.Column("started_us", sa.BigInteger(), nullable=False),
        sa.Column("finished_us", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["site_id"], ["sites.site_id"]),
        sa.ForeignKeyConstraint(["table_id"], ["tables.table_id"]),
        sa.PrimaryKeyConstraint("verification_id"),
    )
    op.create_index("ix_verifications_table_site", "verifications", ["table_id", "site_id", "finished_us"])


def downgrade() -> None:
    op.drop_index("ix_verifications_table_site", table_name="verifications")
    op.drop_table("verifications")
    op.drop_table("file_checks")
