"""segments.xxh3: the XXH3-128 of a segment file as its writer hashed it, the cheap check of a local copy
(NULL for files written before this revision: their copies are checked by sha256, as before)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("segments") as batch:
        batch.add_column(sa.Column("xxh3", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("segments") as batch:
        batch.drop_column("xxh3")
