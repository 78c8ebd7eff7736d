"""topologies: cascaded replicas (placements.feeder_site_id, feeder_fallback_us), tables.writes for
active-active tables, backoffs.failing_since_us (how long a feeder has been down)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("placements") as batch:
        batch.add_column(sa.Column("feeder_site_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("feeder_fallback_us", sa.BigInteger(), nullable=True))
        batch.create_foreign_key("fk_placements_feeder_site", "sites", ["feeder_site_id"], ["site_id"])
    with op.batch_alter_table("tables") as batch:
        batch.add_column(sa.Column("writes", sa.String(length=16), nullable=False, server_default="leader"))
    with op.batch_alter_table("backoffs") as batch:
        batch.add_column(sa.Column("failing_since_us", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("backoffs") as batch:
        batch.drop_column("failing_since_us")
    with op.batch_alter_table("tables") as batch:
        batch.drop_column("writes")
    with op.batch_alter_table("placements") as batch:
        batch.drop_constraint("fk_placements_feeder_site", type_="foreignkey")
        batch.drop_column("feeder_fallback_us")
        batch.drop_column("feeder_site_id")
