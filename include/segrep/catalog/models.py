"""Catalog tables (DESIGN section 5) as SQLAlchemy 2.0 typed models.

Times are stored as integer microseconds since the epoch (UTC), like row versions: exact, comparable with
``_version`` for safe time, and identical on SQLite and PostgreSQL. Ids that grow without bound are 64-bit.
A placement's role is not stored: the leader is ``partitions.leader_placement_id``, so the two cannot drift.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import JSON, BigInteger, Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets BIGINT.
BigId = BigInteger().with_variant(Integer, "sqlite")


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class CatalogIdentity(Base):
    """The catalog's uuid (one row, made by migration 0009): every site marker names the catalog it belongs
    to, so a root claimed by another catalog (or a lost one) is told apart from this catalog's own."""

    __tablename__ = "catalog_identity"

    catalog_uuid: Mapped[str] = mapped_column(String(32), primary_key=True)
    created_us: Mapped[int] = mapped_column(BigInteger)


class Site(Base):
    __tablename__ = "sites"

    site_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    uri: Mapped[str] = mapped_column(Text)
    created_us: Mapped[int] = mapped_column(BigInteger)
    # The uuid the site's identity marker carries; NULL until a marker is written (apply, bootstrap, adopt)
    site_uuid: Mapped[str | None] = mapped_column(String(32), nullable=True)


class Table(Base):
    __tablename__ = "tables"

    table_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    columns: Mapped[dict[str, Any]] = mapped_column(JSON)  # {name: type}, in column order: the current version's
    primary_key: Mapped[list[Any]] = mapped_column(JSON)
    partition_key: Mapped[str] = mapped_column(String(63))
    schema_fingerprint: Mapped[str] = mapped_column(String(16))
    created_us: Mapped[int] = mapped_column(BigInteger)
    # "leader": writes go to each partition's leader; "any_site": every site takes writes (active-active)
    writes: Mapped[str] = mapped_column(String(16), default="leader", server_default="leader")
    # the current schema version (a row of schema_versions) and the next free field id (a dropped id is
    # never reused)
    schema_version: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    next_field_id: Mapped[int] = mapped_column(Integer, default=1, server_default="1")


class SchemaVersionRow(Base):
    """One schema version of a table (``core.schema_versions``): its visible columns with field ids
    (``SchemaVersion.to_json``'s columns), when it was made and what changed."""

    __tablename__ = "schema_versions"

    table_id: Mapped[int] = mapped_column(ForeignKey("tables.table_id"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    columns: Mapped[list[Any]] = mapped_column(JSON)
    created_us: Mapped[int] = mapped_column(BigInteger)
    change: Mapped[str] = mapped_column(Text)


MAX_PARTITION_ID = 2**31 - 1  # partitions.partition_id is an INTEGER column (32 bits on PostgreSQL)


class Partition(Base):
    __tablename__ = "partitions"

    partition_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    table_id: Mapped[int] = mapped_column(ForeignKey("tables.table_id"), index=True)
    begin_key: Mapped[Any | None] = mapped_column(JSON, nullable=True)  # None: unbounded
    end_key: Mapped[Any | None] = mapped_column(JSON, nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    leader_placement_id: Mapped[int | None] = mapped_column(
        ForeignKey("placements.placement_id", use_alter=True, name="fk_partitions_leader"), nullable=True
    )
    epoch: Mapped[int] = mapped_column(Integer, default=1)
    last_version: Mapped[int] = mapped_column(BigInteger, default=0)  # the leader's hybrid logical clock
    parent_partition_id: Mapped[int | None] = mapped_column(ForeignKey("partitions.partition_id"), nullable=True)
    created_us: Mapped[int] = mapped_column(BigInteger)
    # Writes paused since (a planned switchover drains the replicas): a writer's conditional commit requires
    # None, so a write prepared before the pause cannot commit during it.
    paused_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class Placement(Base):
    __tablename__ = "placements"

    placement_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    partition_id: Mapped[int] = mapped_column(ForeignKey("partitions.partition_id"))
    site_id: Mapped[int] = mapped_column(ForeignKey("sites.site_id"))
    state: Mapped[str] = mapped_column(String(16))
    root_segment_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    key_begin: Mapped[Any | None] = mapped_column(JSON, nullable=True)  # key-range restriction (split targets)
    key_end: Mapped[Any | None] = mapped_column(JSON, nullable=True)
    needs_bootstrap: Mapped[bool] = mapped_column(Boolean, default=False)
    created_us: Mapped[int] = mapped_column(BigInteger)
    removed_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Every entry of this placement's list up to settled_entry_id needs no more replication work (leader: acked
    # by every replica; follower: held by the leader), as decided under leader epoch settled_epoch. Planning
    # reads only the partitions with entries past it, so its cost follows new segments, not history.
    settled_entry_id: Mapped[int] = mapped_column(BigInteger, default=0)
    settled_epoch: Mapped[int] = mapped_column(Integer, default=0)
    # A cascaded replica: the site whose placement of the partition offers it segments (None: the leader).
    # While feeder_fallback_us is set the feeder has been down too long and the leader feeds it instead.
    feeder_site_id: Mapped[int | None] = mapped_column(ForeignKey("sites.site_id"), nullable=True)
    feeder_fallback_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)

    __table_args__ = (Index("ix_placements_partition_site", "partition_id", "site_id"),)


class Segment(Base):
    """One entry of a placement's segment list; ``entry_id`` orders the list (the seed's list order)."""

    __tablename__ = "segments"

    entry_id: Mapped[int] = mapped_column(BigId, primary_key=True)
    placement_id: Mapped[int] = mapped_column(ForeignKey("placements.placement_id"))
    segment_id: Mapped[str] = mapped_column(String(32))
    partition_id: Mapped[int] = mapped_column(ForeignKey("partitions.partition_id"), index=True)
    base_segment_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    included_segment_ids: Mapped[list[Any]] = mapped_column(JSON, default=list)
    is_major: Mapped[bool] = mapped_column(Boolean, default=False)
    row_count: Mapped[int] = mapped_column(BigInteger)
    deleted_rows: Mapped[int] = mapped_column(BigInteger, default=0)
    byte_size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    # CRC-64/NVME (hex) of the file as its writer hashed it: the cheap check of a local or server-side copy
    # (None: not known, written before revision 0008; sha256 is checked instead). storage.crc64nvme says why.
    crc64nvme: Mapped[str | None] = mapped_column(String(16), nullable=True)
    min_version: Mapped[int] = mapped_column(BigInteger)
    max_version: Mapped[int] = mapped_column(BigInteger)
    key_min: Mapped[Any | None] = mapped_column(JSON, nullable=True)
    key_max: Mapped[Any | None] = mapped_column(JSON, nullable=True)
    origin_site_id: Mapped[int] = mapped_column(Integer)
    epoch: Mapped[int] = mapped_column(Integer)
    schema_fingerprint: Mapped[str] = mapped_column(String(16))
    # the table's schema version the file was written at (its columns carry that version's field ids)
    schema_version: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    relpath: Mapped[str] = mapped_column(Text)
    committed_us: Mapped[int] = mapped_column(BigInteger, index=True)

    __table_args__ = (
        UniqueConstraint("placement_id", "segment_id", name="uq_segments_placement_segment"),
        Index("ix_segments_placement_entry", "placement_id", "entry_id"),
    )


class Ack(Base):
    """Target placement ``target_placement_id`` holds ``segment_id`` (from the holder's list)."""

    __tablename__ = "acks"

    holder_placement_id: Mapped[int] = mapped_column(ForeignKey("placements.placement_id"), primary_key=True)
    segment_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    target_placement_id: Mapped[int] = mapped_column(ForeignKey("placements.placement_id"), primary_key=True)
    acked_us: Mapped[int] = mapped_column(BigInteger)


class Checkpoint(Base):
    __tablename__ = "checkpoints"

    partition_id: Mapped[int] = mapped_column(ForeignKey("partitions.partition_id"), primary_key=True)
    target_placement_id: Mapped[int] = mapped_column(ForeignKey("placements.placement_id"), primary_key=True)
    segment_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    max_version: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_us: Mapped[int] = mapped_column(BigInteger)


class Lease(Base):
    """An in-flight receipt: the target is receiving this segment until ``expires_us`` (INFLIGHT)."""

    __tablename__ = "leases"

    lease_id: Mapped[int] = mapped_column(BigId, primary_key=True)
    target_placement_id: Mapped[int] = mapped_column(ForeignKey("placements.placement_id"))
    segment_id: Mapped[str] = mapped_column(String(32))
    holder: Mapped[str] = mapped_column(String(64))
    expires_us: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (UniqueConstraint("target_placement_id", "segment_id", name="uq_leases_target_segment"),)


class LinkBudget(Base):
    """The cap in force on a (source, target) link, as its holders last supplied it; its row is also the lock
    that serialises every change of the link's slots (``catalog.link_slots``)."""

    __tablename__ = "link_budgets"

    source_site_id: Mapped[int] = mapped_column(ForeignKey("sites.site_id"), primary_key=True)
    target_site_id: Mapped[int] = mapped_column(ForeignKey("sites.site_id"), primary_key=True)
    cap_bytes_per_s: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # None: unlimited
    max_concurrent: Mapped[int | None] = mapped_column(Integer, nullable=True)  # None: no limit
    updated_us: Mapped[int] = mapped_column(BigInteger)


class LinkSlot(Base):
    """One holder of a link: a copier of ``what`` (``core.links.CopyPriority``) pacing itself at
    ``share_bytes_per_s`` (None: unpaced) until ``expires_us`` unless it renews; ``waiting`` while the link's
    concurrency is full (its share is then 0)."""

    __tablename__ = "link_slots"

    holder: Mapped[str] = mapped_column(String(32), primary_key=True)  # a uuid
    source_site_id: Mapped[int] = mapped_column(ForeignKey("sites.site_id"))
    target_site_id: Mapped[int] = mapped_column(ForeignKey("sites.site_id"))
    what: Mapped[str] = mapped_column(String(16))
    priority: Mapped[int] = mapped_column(Integer)  # the class's weight: larger goes first
    share_bytes_per_s: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    waiting: Mapped[bool] = mapped_column(Boolean, default=False)
    acquired_us: Mapped[int] = mapped_column(BigInteger)
    heartbeat_us: Mapped[int] = mapped_column(BigInteger)
    expires_us: Mapped[int] = mapped_column(BigInteger)
    sent_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")  # reported at each beat
    rate_bytes_per_s: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # measured at beats, smoothed

    __table_args__ = (Index("ix_link_slots_link", "source_site_id", "target_site_id"),)


class SafeTime(Base):
    __tablename__ = "safe_times"

    table_id: Mapped[int] = mapped_column(ForeignKey("tables.table_id"), primary_key=True)
    site_id: Mapped[int] = mapped_column(ForeignKey("sites.site_id"), primary_key=True)
    safe_time_us: Mapped[int] = mapped_column(BigInteger)
    updated_us: Mapped[int] = mapped_column(BigInteger)


class PublicationRow(Base):
    """The last Iceberg publication of a table's copy at a site (``segrep.publish``): its outcome, and the
    snapshot and safe time the site's Iceberg table shows (kept when a later publication fails)."""

    __tablename__ = "publications"

    table_id: Mapped[int] = mapped_column(ForeignKey("tables.table_id"), primary_key=True)
    site_id: Mapped[int] = mapped_column(ForeignKey("sites.site_id"), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    snapshot_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    safe_time_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    detail: Mapped[str] = mapped_column(Text, default="", server_default="")
    # what the catalog said the site served when that snapshot was committed (``publish.publisher``)
    state_token: Mapped[str | None] = mapped_column(String(32), nullable=True)
    updated_us: Mapped[int] = mapped_column(BigInteger)


class Round(Base):
    __tablename__ = "rounds"

    round_id: Mapped[int] = mapped_column(BigId, primary_key=True)
    table_id: Mapped[int] = mapped_column(ForeignKey("tables.table_id"), index=True)
    interval_start_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    interval_end_us: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16))
    started_us: Mapped[int] = mapped_column(BigInteger)
    finished_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    report: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)

    __table_args__ = (UniqueConstraint("table_id", "interval_end_us", name="uq_rounds_table_end"),)


class Split(Base):
    __tablename__ = "splits"

    split_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    table_id: Mapped[int] = mapped_column(ForeignKey("tables.table_id"))
    parent_partition_id: Mapped[int] = mapped_column(ForeignKey("partitions.partition_id"))
    split_keys: Mapped[list[Any]] = mapped_column(JSON)
    is_async: Mapped[bool] = mapped_column(Boolean, default=False)
    state: Mapped[str] = mapped_column(String(16))
    created_us: Mapped[int] = mapped_column(BigInteger)
    finished_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class RoundTarget(Base):
    """One target site's part of a round: written by that target's own task, so parallel tasks never
    update the same row (the round's report aggregates them)."""

    __tablename__ = "round_targets"

    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.round_id"), primary_key=True)
    site_id: Mapped[int] = mapped_column(ForeignKey("sites.site_id"), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    report: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    updated_us: Mapped[int] = mapped_column(BigInteger)


class Backoff(Base):
    """Per (table, target site) retry back-off after a declined or failed offer (DESIGN section 6)."""

    __tablename__ = "backoffs"

    table_id: Mapped[int] = mapped_column(ForeignKey("tables.table_id"), primary_key=True)
    site_id: Mapped[int] = mapped_column(ForeignKey("sites.site_id"), primary_key=True)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_us: Mapped[int] = mapped_column(BigInteger, default=0)
    last_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    updated_us: Mapped[int] = mapped_column(BigInteger)
    failing_since_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # the first failure in a row


class FileCheck(Base):
    """The last check of one placement's copy of a segment against its catalog row (size and sha256): when it
    last proved good, when it was last looked at, and what was wrong then (None: nothing)."""

    __tablename__ = "file_checks"

    placement_id: Mapped[int] = mapped_column(ForeignKey("placements.placement_id"), primary_key=True)
    segment_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    last_good_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    checked_us: Mapped[int] = mapped_column(BigInteger)
    problem: Mapped[str | None] = mapped_column(Text, nullable=True)


class Verification(Base):
    """One ``segrep verify`` (or repair's check) of a table at one site: when, what was compared (``kind``:
    rows, files or both), at which pinned version, the outcome and how many differences were found."""

    __tablename__ = "verifications"

    verification_id: Mapped[int] = mapped_column(BigId, primary_key=True)
    table_id: Mapped[int] = mapped_column(ForeignKey("tables.table_id"))
    site_id: Mapped[int] = mapped_column(ForeignKey("sites.site_id"))
    kind: Mapped[str] = mapped_column(String(16))
    as_of_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    outcome: Mapped[str] = mapped_column(String(16))
    differences: Mapped[int] = mapped_column(BigInteger, default=0)
    started_us: Mapped[int] = mapped_column(BigInteger)
    finished_us: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_verifications_table_site", "table_id", "site_id", "finished_us"),)


class Failover(Base):
    """One leader move of a table made by ``segrep failover`` or ``segrep switchover`` (DESIGN section 11):
    from where to where, the cut, and exactly what the new leader lacked (``loss``: per partition, segments,
    rows, bytes and row-version range; what a failover gave up, or set aside in a rollback area)."""

    __tablename__ = "failovers"

    failover_id: Mapped[int] = mapped_column(BigId, primary_key=True)
    table_id: Mapped[int] = mapped_column(ForeignKey("tables.table_id"))
    kind: Mapped[str] = mapped_column(String(16))  # failover | switchover
    from_site_id: Mapped[int] = mapped_column(ForeignKey("sites.site_id"))
    to_site_id: Mapped[int] = mapped_column(ForeignKey("sites.site_id"))
    cut: Mapped[str] = mapped_column(String(16))  # latest | safe-time
    cut_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # the table's policy when it moved: "rollback" sets the old leader's lost segments aside when its site
    # returns (they are never pushed), "merge" lets rounds push and merge them (EventQL)
    on_return: Mapped[str] = mapped_column(String(16))
    loss: Mapped[list[Any]] = mapped_column(JSON, default=list)
    done_us: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_failovers_table", "table_id", "done_us"),)
