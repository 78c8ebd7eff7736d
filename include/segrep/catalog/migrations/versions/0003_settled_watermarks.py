"""settled watermarks on placements; segments indexed by (placement, entry)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("placements") as batch:
        batch.add_column(sa.Column("settled_entry_id", sa.BigInteger(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("settled_epoch", sa.Integer(), nullable=False, server_default="0"))
    op.create_index("ix_segments_placement_entry", "segments", ["placement_id", "entry_id"])


def downgrade() -> None:
    op.drop_index("ix_segments_placement_entry", table_name="segments")
    with op.batch_alter_table("placements") as batch:
        batch.drop_column("settled_epoch")
        batch.drop_column("settled_entry_id")
