"""initial catalog schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sites",
        sa.Column("site_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("created_us", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("site_id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "tables",
        sa.Column("table_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("columns", sa.JSON(), nullable=False),
        sa.Column("primary_key", sa.JSON(), nullable=False),
        sa.Column("partition_key", sa.String(length=63), nullable=False),
        sa.Column("schema_fingerprint", sa.String(length=16), nullable=False),
        sa.Column("created_us", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("table_id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "partitions",
        sa.Column("partition_id", sa.Integer(), nullable=False),
        sa.Column("table_id", sa.Integer(), nullable=False),
        sa.Column("begin_key", sa.JSON(), nullable=True),
        sa.Column("end_key", sa.JSON(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("leader_placement_id", sa.Integer(), nullable=True),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("last_version", sa.BigInteger(), nullable=False),
        sa.Column("parent_partition_id", sa.Integer(), nullable=True),
        sa.Column("created_us", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["parent_partition_id"],
            ["partitions.partition_id"],
        ),
        sa.ForeignKeyConstraint(
            ["table_id"],
            ["tables.table_id"],
        ),
        sa.PrimaryKeyConstraint("partition_id"),
    )
    with op.batch_alter_table("partitions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_partitions_table_id"), ["table_id"], unique=False)

    op.create_table(
        "rounds",
        sa.Column("round_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("table_id", sa.Integer(), nullable=False),
        sa.Column("interval_start_us", sa.BigInteger(), nullable=True),
        sa.Column("interval_end_us", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("started_us", sa.BigInteger(), nullable=False),
        sa.Column("finished_us", sa.BigInteger(), nullable=True),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["table_id"],
            ["tables.table_id"],
        ),
        sa.PrimaryKeyConstraint("round_id"),
    )
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_rounds_table_id"), ["table_id"], unique=False)

    op.create_table(
        "safe_times",
        sa.Column("table_id", sa.Integer(), nullable=False),
        sa.Column("site_id", sa.Integer(), nullable=False),
        sa.Column("safe_time_us", sa.BigInteger(), nullable=False),
        sa.Column("updated_us", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["site_id"],
            ["sites.site_id"],
        ),
        sa.ForeignKeyConstraint(
            ["table_id"],
            ["tables.table_id"],
        ),
        sa.PrimaryKeyConstraint("table_id", "site_id"),
    )
    op.create_table(
        "placements",
        sa.Column("placement_id", sa.Integer(), nullable=False),
        sa.Column("partition_id", sa.Integer(), nullable=False),
        sa.Column("site_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("root_segment_id", sa.String(length=32), nullable=True),
        sa.Column("key_begin", sa.JSON(), nullable=True),
        sa.Column("key_end", sa.JSON(), nullable=True),
        sa.Column("needs_bootstrap", sa.Boolean(), nullable=False),
        sa.Column("created_us", sa.BigInteger(), nullable=False),
        sa.Column("removed_us", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["partition_id"],
            ["partitions.partition_id"],
        ),
        sa.ForeignKeyConstraint(
            ["site_id"],
            ["sites.site_id"],
        ),
        sa.PrimaryKeyConstraint("placement_id"),
    )
    with op.batch_alter_table("placements", schema=None) as batch_op:
        batch_op.create_index("ix_placements_partition_site", ["partition_id", "site_id"], unique=False)

    # partitions.leader_placement_id -> placements: added once both tables exist (SQLite cannot ALTER in a
    # constraint; it gets the same constraint through a batch table rebuild).
    with op.batch_alter_table("partitions", schema=None) as batch_op:
        batch_op.create_foreign_key("fk_partitions_leader", "placements", ["leader_placement_id"], ["placement_id"])

    op.create_table(
        "splits",
        sa.Column("split_id", sa.Integer(), nullable=False),
        sa.Column("table_id", sa.Integer(), nullable=False),
        sa.Column("parent_partition_id", sa.Integer(), nullable=False),
        sa.Column("split_keys", sa.JSON(), nullable=False),
        sa.Column("is_async", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_us", sa.BigInteger(), nullable=False),
        sa.Column("finished_us", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["parent_partition_id"],
            ["partitions.partition_id"],
        ),
        sa.ForeignKeyConstraint(
            ["table_id"],
            ["tables.table_id"],
        ),
        sa.PrimaryKeyConstraint("split_id"),
    )
    op.create_table(
        "acks",
        sa.Column("holder_placement_id", sa.Integer(), nullable=False),
        sa.Column("segment_id", sa.String(length=32), nullable=False),
        sa.Column("target_placement_id", sa.Integer(), nullable=False),
        sa.Column("acked_us", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["holder_placement_id"],
            ["placements.placement_id"],
        ),
        sa.ForeignKeyConstraint(
            ["target_placement_id"],
            ["placements.placement_id"],
        ),
        sa.PrimaryKeyConstraint("holder_placement_id", "segment_id", "target_placement_id"),
    )
    op.create_table(
        "checkpoints",
        sa.Column("partition_id", sa.Integer(), nullable=False),
        sa.Column("target_placement_id", sa.Integer(), nullable=False),
        sa.Column("segment_id", sa.String(length=32), nullable=True),
        sa.Column("max_version", sa.BigInteger(), nullable=False),
        sa.Column("updated_us", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["partition_id"],
            ["partitions.partition_id"],
        ),
        sa.ForeignKeyConstraint(
            ["target_placement_id"],
            ["placements.placement_id"],
        ),
        sa.PrimaryKeyConstraint("partition_id", "target_placement_id"),
    )
    op.create_table(
        "leases",
        sa.Column("lease_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("target_placement_id", sa.Integer(), nullable=False),
        sa.Column("segment_id", sa.String(length=32), nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=False),
        sa.Column("expires_us", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["target_placement_id"],
            ["placements.placement_id"],
        ),
        sa.PrimaryKeyConstraint("lease_id"),
        sa.UniqueConstraint("target_placement_id", "segment_id", name="uq_leases_target_segment"),
    )
    op.create_table(
        "segments",
        sa.Column("entry_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("placement_id", sa.Integer(), nullable=False),
        sa.Column("segment_id", sa.String(length=32), nullable=False),
        sa.Column("partition_id", sa.Integer(), nullable=False),
        sa.Column("base_segment_id", sa.String(length=32), nullable=True),
        sa.Column("included_segment_ids", sa.JSON(), nullable=False),
        sa.Column("is_major", sa.Boolean(), nullable=False),
        sa.Column("row_count", sa.BigInteger(), nullable=False),
        sa.Column("deleted_rows", sa.BigInteger(), nullable=False),
        sa.Column("byte_size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("min_version", sa.BigInteger(), nullable=False),
        sa.Column("max_version", sa.BigInteger(), nullable=False),
        sa.Column("key_min", sa.JSON(), nullable=True),
        sa.Column("key_max", sa.JSON(), nullable=True),
        sa.Column("origin_site_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("schema_fingerprint", sa.String(length=16), nullable=False),
        sa.Column("relpath", sa.Text(), nullable=False),
        sa.Column("committed_us", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["partition_id"],
            ["partitions.partition_id"],
        ),
        sa.ForeignKeyConstraint(
            ["placement_id"],
            ["placements.placement_id"],
        ),
        sa.PrimaryKeyConstraint("entry_id"),
        sa.UniqueConstraint("placement_id", "segment_id", name="uq_segments_placement_segment"),
    )
    with op.batch_alter_table("segments", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_segments_committed_us"), ["committed_us"], unique=False)
        batch_op.create_index(batch_op.f("ix_segments_partition_id"), ["partition_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("partitions", schema=None) as batch_op:
        batch_op.drop_constraint("fk_partitions_leader", type_="foreignkey")
    with op.batch_alter_table("segments", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_segments_partition_id"))
        batch_op.drop_index(batch_op.f("ix_segments_committed_us"))

    op.drop_table("segments")
    op.drop_table("leases")
    op.drop_table("checkpoints")
    op.drop_table("acks")
    op.drop_table("splits")
    with op.batch_alter_table("placements", schema=None) as batch_op:
        batch_op.drop_index("ix_placements_partition_site")

    op.drop_table("placements")
    op.drop_table("safe_times")
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_rounds_table_id"))

    op.drop_table("rounds")
    with op.batch_alter_table("partitions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_partitions_table_id"))

    op.drop_table("partitions")
    op.drop_table("tables")
    op.drop_table("sites")
