"""Site identity (DESIGN 13): the catalog's own uuid (``catalog_identity``, one row) and each site's uuid
(``sites.site_uuid``), which the identity marker at the site's root repeats. A site whose uuid is NULL has not
been claimed yet: ``segrep apply`` (or ``segrep site adopt``) writes its marker and records the uuid, and until
then no round, write or repair touches its root.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28
"""

from __future__ import annotations

import time
import uuid

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    identity = op.create_table(
        "catalog_identity",
        sa.Column("catalog_uuid", sa.String(length=32), primary_key=True),
        sa.Column("created_us", sa.BigInteger(), nullable=False),
    )
    op.bulk_insert(identity, [{"catalog_uuid": uuid.uuid4().hex, "created_us": time.time_ns() // 1000}])
    with op.batch_alter_table("sites") as batch:
        batch.add_column(sa.Column("site_uuid", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sites") as batch:
        batch.drop_column("site_uuid")
    op.drop_table("catalog_identity")
