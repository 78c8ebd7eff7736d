"""Catalog look-ups shared by the writer, reader, CLI and workflows (set-based, one round trip each)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pyarrow as pa
from sqlalchemy import BindParameter, bindparam, func, select, update
from sqlalchemy.orm import Session

from segrep.catalog import models as m
from segrep.catalog.schemas import schema_version
from segrep.core import keys
from segrep.core import schema as sch
from segrep.core.chain import Chain, SegmentRef
from segrep.core.collector import collector_paused
from segrep.core.errors import NotFoundError
from segrep.core.names import check_name
from segrep.core.projection import ReadVersions
from segrep.core.schema_versions import FIRST_VERSION
from segrep.core.states import PartitionState

WRITABLE_STATES = (PartitionState.LOADING, PartitionState.LIVE, PartitionState.SPLITTING)


@dataclass(frozen=True)
class TableInfo:
    """A table as the catalog knows it, with its Arrow schema."""

    row: m.Table
    schema: pa.Schema
    versions: ReadVersions  # its version 1 (files without schema metadata) and its current one (reads go to)

    @classmethod
    def of(cls, s: Session, row: m.Table) -> TableInfo:
        current = schema_version(s, row.table_id, row.schema_version)
        first = current if current.version == FIRST_VERSION else schema_version(s, row.table_id, FIRST_VERSION)
        return cls(
            row, sch.schema_from_columns({c.name: c.type for c in current.columns}), ReadVersions(first, current)
        )

    @property
    def table_id(self) -> int:
        return self.row.table_id

    @property
    def name(self) -> str:
        return self.row.name

    @property
    def primary_key(self) -> tuple[str, ...]:
        return tuple(self.row.primary_key)

    @property
    def partition_key(self) -> str:
        return self.row.partition_key

    @property
    def key_type(self) -> pa.DataType:
        return self.schema.field(self.partition_key).type

    def decode_key(self, value: Any) -> Any:
        return keys.decode(value, self.key_type)

    @cached_property
    def primary_key_types(self) -> tuple[pa.DataType, ...]:
        return tuple(self.schema.field(k).type for k in self.primary_key)

    def decode_primary_key(self, value: Any) -> tuple[Any, ...]:
        """A segment's ``key_min`` or ``key_max`` (JSON, one value per primary-key column) as comparable values
        (what a reader and a publication compare every segment's key range by)."""
        return tuple(map(keys.decode, value, self.primary_key_types))


# built once (catalog.sql says why): a round's every offer reads these
_IDS: BindParameter[list[Any]] = bindparam("ids", expanding=True)
_TABLE_NAMED = select(m.Table).where(m.Table.name == bindparam("name"))
_SITES = select(m.Site)
_SITE_NAMED = select(m.Site).where(m.Site.name == bindparam("name"))
_PARTITION_LOCKED = select(m.Partition).where(m.Partition.partition_id == bindparam("id")).with_for_update()
_PLACEMENT = select(m.Placement).where(m.Placement.placement_id == bindparam("id"))
_ACTIVE_PLACEMENTS = (
    select(m.Placement)
    .where(m.Placement.partition_id.in_(_IDS), m.Placement.removed_us.is_(None))
    .order_by(m.Placement.placement_id)
)
_SEGMENTS_OF = select(m.Segment).where(m.Segment.placement_id.in_(_IDS)).order_by(m.Segment.entry_id)
# plain rows, not ORM objects: a partition's acks outnumber its segments, and every offer reads them
_ACKS_HELD_BY = select(m.Ack.holder_placement_id, m.Ack.segment_id, m.Ack.target_placement_id).where(
    m.Ack.holder_placement_id.in_(_IDS)
)


def table_info(s: Session, name: str) -> TableInfo:
    check_name("table", name)
    row = s.scalars(_TABLE_NAMED, {"name": name}).one_or_none()
    if row is None:
        known = s.scalars(select(m.Table.name).order_by(m.Table.name)).all()
        raise NotFoundError(
            f"unknown table {name!r} in the catalog; known: {', '.join(known) or 'none'} (run `segrep apply`?)"
        )
    return TableInfo.of(s, row)


def site_by_name(s: Session, name: str) -> m.Site:
    check_name("site", name)
    row = s.scalars(_SITE_NAMED, {"name": name}).one_or_none()
    if row is None:
        known = s.scalars(select(m.Site.name).order_by(m.Site.name)).all()
        raise NotFoundError(f"unknown site {name!r} in the catalog; known: {', '.join(known) or 'none'}")
    return row


def locked_partition(s: Session, partition_id: int) -> m.Partition | None:
    """The partition's row, locked FOR UPDATE (on PostgreSQL; SQLite's write transaction locks it already)."""
    return s.scalars(_PARTITION_LOCKED, {"id": partition_id}).one_or_none()


def placement(s: Session, placement_id: int) -> m.Placement | None:
    return s.scalars(_PLACEMENT, {"id": placement_id}).one_or_none()


def sites_by_id(s: Session) -> dict[int, m.Site]:
    return {site.site_id: site for site in s.scalars(_SITES)}


def partitions_of(s: Session, info: TableInfo, states: Iterable[str] | None = None) -> list[m.Partition]:
    """The table's partitions in key order (unbounded begin first)."""
    q = select(m.Partition).where(m.Partition.table_id == info.table_id)
    if states is not None:
        q = q.where(m.Partition.state.in_([str(x) for x in states]))
    return sort_partitions(info, list(s.scalars(q)))


def serving_partitions(s: Session, info: TableInfo) -> list[m.Partition]:
    """The partitions that take the table's writes and answer its reads, in key order: they tile the key
    space. A split's children are LOADING until SPLIT_FINALIZE, while their parent (SPLITTING) still serves;
    at finalize the children go LIVE and the parent leaves (UNLOAD)."""
    return [p for p in partitions_of(s, info, WRITABLE_STATES) if serves(p)]


def serves(p: m.Partition) -> bool:
    """True if the partition is one :func:`serving_partitions` returns (for rows read already)."""
    return p.state in WRITABLE_STATES and not (p.state == PartitionState.LOADING and p.parent_partition_id is not None)


def sort_partitions(info: TableInfo, parts: list[m.Partition]) -> list[m.Partition]:
    """Partitions in key order, the one with an unbounded begin first."""
    parts.sort(key=lambda p: (p.begin_key is not None, info.decode_key(p.begin_key) if p.begin_key is not None else 0))
    return parts


def active_placements(s: Session, partition_ids: Sequence[int]) -> list[m.Placement]:
    if not partition_ids:
        return []
    return list(s.scalars(_ACTIVE_PLACEMENTS, {"ids": list(partition_ids)}))


def placement_at(s: Session, partition_id: int, site_id: int) -> m.Placement | None:
    q = select(m.Placement).where(
        m.Placement.partition_id == partition_id, m.Placement.site_id == site_id, m.Placement.removed_us.is_(None)
    )
    return s.scalars(q).one_or_none()


def segments_of(s: Session, placement_ids: Sequence[int]) -> dict[int, list[m.Segment]]:
    """Each placement's segment list in list order (oldest first)."""
    out: dict[int, list[m.Segment]] = defaultdict(list)
    if placement_ids:
        with collector_paused():
            for seg in s.scalars(_SEGMENTS_OF, {"ids": list(placement_ids)}):
                out[seg.placement_id].append(seg)
    return out


def to_ref(seg: m.Segment) -> SegmentRef:
    return SegmentRef(seg.segment_id, seg.base_segment_id, tuple(seg.included_segment_ids or ()), seg.is_major)


def chain_of(placement: m.Placement, segments: Sequence[m.Segment]) -> Chain:
    return Chain.of((to_ref(x) for x in segments), placement.root_segment_id)


def acks_of(s: Session, holder_ids: Sequence[int]) -> dict[tuple[int, str], set[int]]:
    """(holder placement, segment id) -> set of target placement ids that acked it."""
    out: dict[tuple[int, str], set[int]] = defaultdict(set)
    if holder_ids:
        for holder, segment_id, target in s.execute(_ACKS_HELD_BY, {"ids": list(holder_ids)}):
            out[(holder, segment_id)].add(target)
    return out


def segment_count(s: Session, table_id: int) -> int:
    q = select(func.count()).select_from(m.Segment).join(m.Partition).where(m.Partition.table_id == table_id)
    return int(s.scalar(q) or 0)


def segment_count_at_site(s: Session, site_id: int) -> int:
    """How many segment entries the catalog lists at a site's placements."""
    q = select(func.count()).select_from(m.Segment).join(m.Placement).where(m.Placement.site_id == site_id)
    return int(s.scalar(q) or 0)


def reset_watermarks(s: Session, partition_id: int) -> None:
    """Make every list entry of the partition relevant to planning again (a new replica, a rejoin, or acks
    dropped by an OUT_OF_ORDER restart): the settled watermarks go back to 0."""
    s.execute(
        update(m.Placement)
        .where(m.Placement.partition_id == partition_id)
        .values(settled_entry_id=0)
        .execution_options(synchronize_session=False)
    )


def last_failover(s: Session, table_id: int) -> m.Failover | None:
    """The table's latest leader move (``segrep failover`` / ``switchover``), or None."""
    return s.scalars(
        select(m.Failover).where(m.Failover.table_id == table_id).order_by(m.Failover.done_us.desc()).limit(1)
    ).one_or_none()
