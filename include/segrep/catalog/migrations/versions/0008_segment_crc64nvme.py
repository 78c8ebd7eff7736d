"""segments.crc64nvme replaces segments.xxh3: the fast check of a copy is now the CRC-64/NVME of the file, the
full-object checksum S3 computes itself, so a server-side copy is checked without the store hashing a SHA-256
(NULL for files written before this revision: their copies are checked by sha256, as before 0007)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("segments") as batch:
        batch.add_column(sa.Column("crc64nvme", sa.String(length=16), nullable=True))
        batch.drop_column("xxh3")


def downgrade() -> None:
    with op.batch_alter_table("segments") as batch:
        batch.add_column(sa.Column("xxh3", sa.String(length=32), nullable=True))
        batch.drop_column("crc64nvme")
