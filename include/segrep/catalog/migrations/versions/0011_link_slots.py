"""Link slots (issue 36, DESIGN section 17): ``link_slots`` holds one row per copier holding (or waiting for)
a share of a (source, target) link's byte-rate cap, kept alive by its heartbeat like a round's leases;
``link_budgets`` one row per link that has had a holder: the cap in force, and the row every change of the
link's slots locks first. Each beat also stores what its holder has sent, and its rate since the beat before
(what status shows as the link's current rate).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "link_budgets",
        sa.Column("source_site_id", sa.Integer(), sa.ForeignKey("sites.site_id"), primary_key=True),
        sa.Column("target_site_id", sa.Integer(), sa.ForeignKey("sites.site_id"), primary_key=True),
        sa.Column("cap_bytes_per_s", sa.BigInteger(), nullable=True),
        sa.Column("max_concurrent", sa.Integer(), nullable=True),
        sa.Column("updated_us", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "link_slots",
        sa.Column("holder", sa.String(length=32), primary_key=True),
        sa.Column("source_site_id", sa.Integer(), sa.ForeignKey("sites.site_id"), nullable=False),
        sa.Column("target_site_id", sa.Integer(), sa.ForeignKey("sites.site_id"), nullable=False),
        sa.Column("what", sa.String(length=16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("share_bytes_per_s", sa.BigInteger(), nullable=True),
        sa.Column("waiting", sa.Boolean(), nullable=False),
        sa.Column("acquired_us", sa.BigInteger(), nullable=False),
        sa.Column("heartbeat_us", sa.BigInteger(), nullable=False),
        sa.Column("expires_us", sa.BigInteger(), nullable=False),
        sa.Column("sent_bytes", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("rate_bytes_per_s", sa.BigInteger(), nullable=True),
    )
    op.create_index("ix_link_slots_link", "link_slots", ["source_site_id", "target_site_id"])


def downgrade() -> None:
    op.drop_index("ix_link_slots_link", table_name="link_slots")
    op.drop_table("link_slots")
    op.drop_table("link_budgets")
