"""Writing batches: one new minor segment per touched partition, committed together.

By default rows go to each partition's leader placement and extend its chain. A table with
``writes: any_site`` also takes writes at any other site (active-active, DESIGN 12): there the segment is
added to that site's placement *beside* its chain (the root does not move), stamped with the site's origin and
the partition's clock; the site reads it at once (read-your-writes), rounds push it to the leader, which merges
it last-writer-wins, and the merged segment fast-forwards back to every site.

Each batch is checked against the table (a batch of an older schema version's columns, from a writer not
yet redeployed, is checked at that version and projected to the current one: ``core.batch_versions``),
de-duplicated by primary key (its last row wins), routed by the partition key to each partition's leader
placement and stamped with a version from that partition's hybrid logical clock. Files are written first
(atomically, hashed); then one catalog transaction moves every touched placement's root with a conditional
update and advances each clock. If another writer got there first, the new files are removed and the batch is
re-planned: optimistic, never check-then-act. ``write_batches`` writes several batches' files, one batch in
memory at a time, and registers them all in that one transaction (``segrep table rewrite``: all or nothing).

A table whose policy is ``schedule: on_write`` (given ``defs``) then tells Airflow, after the commit and best
effort (``segrep.data.write_events``): the result's ``event`` says whether the asset event was sent.
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from sqlalchemy import update

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.schemas import current_schema, schema_versions
from segrep.catalog.segments import register_segment
from segrep.catalog.site_identity import open_site
from segrep.catalog.sql import rowcount
from segrep.config.definitions import Definitions
from segrep.core import faults, hlc
from segrep.core import schema as sch
from segrep.core.batch_versions import conform_to_current
from segrep.core.errors import ConflictError, SegrepError, WritesPausedError
from segrep.core.ids import new_segment_id
from segrep.core.schema_versions import SchemaVersion
from segrep.data.write_events import WriteEvent, announce
from segrep.storage.atomic import FileFacts
from segrep.storage.segment_meta import SegmentEntry, entry_stats, stamp_rows
from segrep.storage.site import Site, segment_relpath

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 20
WRITE_THREADS = max(2, min(8, os.cpu_count() or 2))
EXTRA_SEGMENTS = 100  # segments listed in a write's asset event


@dataclass(frozen=True)
class WrittenSegment:
    partition_id: int
    site: str
    segment_id: str
    rows: int
    byte_size: int
    version: int


@dataclass
class WriteResult:
    table: str
    rows_in: int
    rows_written: int
    deleted: bool
    segments: list[WrittenSegment] = field(default_factory=list)
    attempts: int = 0
    files_s: float = 0.0  # writing and hashing the segment files (last attempt)
    commit_s: float = 0.0  # the catalog transaction that registers them (last attempt)
    committed_us: int | None = None  # the commit time recorded for the segments (None: nothing written)
    event: WriteEvent | None = None  # the Airflow asset event of an on_write table (None: no event is due)
    batch_version: int | None = None  # the schema version whose columns the batch had (older: a writer not redeployed)
    stored_version: int | None = None  # the schema version the rows were stored at (the table's current one)


@dataclass(frozen=True)
class WriteTarget:
    """A writable partition and the placement written to, as read at the start of an attempt: the leader's,
    or (``local``) another site's placement of an active-active table, beside its chain."""

    partition: m.Partition
    placement: m.Placement
    site: m.Site
    local: bool = False


def write_batch(
    catalog: Catalog,
    table: str,
    batch: pa.Table,
    *,
    delete: bool = False,
    site: str | None = None,
    defs: Definitions | None = None,
) -> WriteResult:
    """Upsert ``batch`` (full rows), or delete the keys in it when ``delete`` is set; at each partition's
    leader, or at ``site`` (which must lead the partitions written, unless the table takes writes anywhere).

    With ``defs`` (the definitions, which hold the policy), a write to a table with ``schedule: on_write`` then
    sends the table's Airflow asset event (SEGREP_AIRFLOW_API_URL...): ``result.event`` says how that went,
    and a failure there never fails the committed write. Without ``defs`` no event is sent (a writer inside an
    Airflow task emits it as the task's outlet instead: ``segrep_airflow.assets.emit_write``)."""
    with catalog.read() as s:
        info = q.table_info(s, table)
        schema = current_schema(s, info.table_id)  # the files carry its field ids and the version itself
        history = list(schema_versions(s, info.table_id).values())
    # a batch of an older version's columns (a writer not yet redeployed) is projected to the current one
    conformed = conform_to_current(batch, schema, history, info.primary_key, keys_only=delete)
    rows = sch.dedupe_last(conformed.rows, info.primary_key)
    result = WriteResult(
        table=table,
        rows_in=batch.num_rows,
        rows_written=rows.num_rows,
        deleted=delete,
        batch_version=conformed.written_at,
        stored_version=schema.version,
    )
    if rows.num_rows == 0:
        return result

    def attempt(_n: int) -> None:
        result.segments = _attempt(catalog, info, schema, rows, delete, result, site)

    until_no_conflict(table, result, MAX_ATTEMPTS, attempt)
    announce_write(defs, table, result)
    return result


def until_no_conflict(table: str, result: WriteResult, most: int, attempt: Callable[[int], None]) -> None:
    """Run ``attempt(n)`` (n = 1, 2, ...) until one commits without a ConflictError (a partition moved under
    the write, which removed its files), counting attempts in ``result``; SegrepError after ``most`` of them."""
    for n in range(1, most + 1):
        result.attempts = n
        try:
            attempt(n)
        except ConflictError as exc:
            log.info("write to %s conflicted (attempt %d): %s", table, n, exc)
            continue
        return
    raise SegrepError(f"write to {table} gave up after {most} conflicting attempts; retry later")


def announce_write(defs: Definitions | None, table: str, result: WriteResult) -> None:
    """After a committed write to a table with ``schedule: on_write``: its Airflow asset event (best effort,
    ``result.event`` says how it went); nothing without the definitions."""
    policy = defs.policy(table) if defs is not None else None
    if policy is not None and policy.on_write:
        result.event = announce(table, write_event_extra(result), policy.write_fallback_s)
        log.info("%s", result.event.detail)


def _attempt(
    catalog: Catalog,
    info: q.TableInfo,
    schema: SchemaVersion,
    rows: pa.Table,
    delete: bool,
    timing: WriteResult,
    site: str | None,
) -> list[WrittenSegment]:
    started = time.perf_counter()
    targets = write_targets(catalog, info, site)
    chains = {t.partition.partition_id: PartitionChain(t) for t in targets}
    written: list[WrittenFile] = []
    try:
        _write_files(catalog, info, schema, rows, delete, chains, written)
        timing.files_s = time.perf_counter() - started
        started = time.perf_counter()
        timing.committed_us = commit_segments(catalog, chains, written)
    except BaseException:
        remove_files(written)
        raise
    timing.commit_s = time.perf_counter() - started
    return [written_segment(w) for w in written]


def write_batches(catalog: Catalog, table: str, batches: Iterable[pa.Table]) -> WriteResult:
    """Upsert every batch of ``batches`` in one catalog commit: all of them or nothing (``segrep table rewrite``).

    Each batch is checked, routed and written to files as it comes, so memory holds one batch; in a partition
    a batch's segment continues the previous batch's, so a later batch's row wins over an earlier one with the
    same key. Nothing is registered until the last batch's files are written: a failure on the way (a refused
    batch, a failing store, a crash) leaves the table as it was (the files written so far are removed, or
    are orphans for GC after a kill). A writer that moved a partition meanwhile is a ConflictError, nothing
    written: run again. Always at each partition's leader."""
    with catalog.read() as s:
        info = q.table_info(s, table)
        schema = current_schema(s, info.table_id)
        history = list(schema_versions(s, info.table_id).values())
    result = WriteResult(table=table, rows_in=0, rows_written=0, deleted=False, stored_version=schema.version)
    started = time.perf_counter()
    chains = {t.partition.partition_id: PartitionChain(t) for t in write_targets(catalog, info)}
    written: list[WrittenFile] = []
    try:
        for batch in batches:
            rows = sch.dedupe_last(
                conform_to_current(batch, schema, history, info.primary_key, keys_only=False).rows, info.primary_key
            )
            result.rows_in += batch.num_rows
            result.rows_written += rows.num_rows
            if rows.num_rows:
                _write_files(catalog, info, schema, rows, False, chains, written)
            faults.point("write_between_batches")
        result.files_s = time.perf_counter() - started
        started = time.perf_counter()
        result.committed_us = commit_segments(catalog, chains, written) if written else None
    except BaseException:
        remove_files(written)
        raise
    result.commit_s = time.perf_counter() - started
    result.attempts = 1
    result.segments = [written_segment(w) for w in written]
    return result


@dataclass(frozen=True)
class TableLayout:
    """What writing a table's segment file needs besides its rows, free of catalog objects: a Spark writer
    ships it to the executors (``spark.dataframe_writer``), the in-process writer builds it per write."""

    name: str
    schema: pa.Schema  # the table's columns (current version)
    primary_key: tuple[str, ...]
    schema_fingerprint: str
    version: SchemaVersion  # the current schema version: the file's field ids and version metadata

    @classmethod
    def of(cls, info: q.TableInfo, version: SchemaVersion) -> TableLayout:
        return cls(info.name, info.schema, info.primary_key, info.row.schema_fingerprint, version)


@dataclass(frozen=True)
class SegmentPlan:
    """One segment file to write, as the writer planned it: its place on the partition's chain (id, base,
    major flag), the version its rows are stamped with, the origin and epoch, and its path at the site.
    Decided where the catalog was read; the file may be written elsewhere (a Spark executor)."""

    partition_id: int
    segment_id: str
    base_segment_id: str | None
    is_major: bool
    version: int
    origin_site_id: int
    epoch: int
    partition_begin: Any
    partition_end: Any
    relpath: str


@dataclass
class PartitionChain:
    """A partition's chain as this write extends it: the partition and placement as read at the start, and the
    version and root the write's next segment there follows (several with ``write_batches`` or a Spark write)."""

    target: WriteTarget
    last_version: int = 0
    root: str | None = None
    extended: bool = False

    def __post_init__(self) -> None:
        self.last_version = self.target.partition.last_version
        self.root = self.target.placement.root_segment_id

    def plan_segment(self, table: str) -> SegmentPlan:
        """The next segment of this chain: a new id on top of the current root, stamped with the partition's
        next clock value; the chain moves on to it (a local write sits beside the chain: its root stays)."""
        target = self.target
        part = target.partition
        version = hlc.next_version(self.last_version)
        base = self.root
        self.last_version, self.extended = version, True
        segment_id = new_segment_id()
        if not target.local:
            self.root = segment_id
        return SegmentPlan(
            partition_id=part.partition_id,
            segment_id=segment_id,
            base_segment_id=base,
            # the first segment of a chain is major (EventQL 3); a local write is never on a chain
            is_major=base is None and not target.local,
            version=version,
            origin_site_id=target.site.site_id,
            epoch=part.epoch,
            partition_begin=part.begin_key,
            partition_end=part.end_key,
            relpath=segment_relpath(table, part.partition_id, segment_id),
        )


@dataclass(frozen=True)
class WrittenFile:
    """A written segment file, not yet registered: the chain it extends, its entry, path, facts and site, and
    the root it continues (its conditional move expects it)."""

    chain: PartitionChain
    entry: SegmentEntry
    relpath: str
    facts: FileFacts
    site: Site
    base: str | None


def _write_files(
    catalog: Catalog,
    info: q.TableInfo,
    schema: SchemaVersion,
    rows: pa.Table,
    delete: bool,
    chains: dict[int, PartitionChain],
    written: list[WrittenFile],
) -> None:
    """Route ``rows`` and write one file per partition they touch, each continuing its partition's chain as
    this write extends it; append to ``written`` (also the files of a partition that succeeded when another
    failed, so the caller can remove them)."""
    ordered = list(chains.values())
    parts = [c.target.partition for c in ordered]
    groups = route_rows(rows, info.partition_key, info.key_type, partition_bounds(info, parts))
    work = [(c, rows_) for c, rows_ in zip(ordered, groups, strict=True) if rows_ is not None]
    layout = TableLayout.of(info, schema)
    if len(work) == 1:  # one partition (a key-sorted batch often is): no pool to start and join
        written.append(_write_file(catalog, layout, *work[0], delete))
    else:
        # Parquet encoding, hashing and fsync release the GIL: partitions are written side by side.
        with ThreadPoolExecutor(max_workers=min(len(work), WRITE_THREADS)) as pool:
            futures = [pool.submit(_write_file, catalog, layout, c, rows_, delete) for c, rows_ in work]
        failure: BaseException | None = None
        for future in futures:
            try:
                written.append(future.result())
            except BaseException as exc:  # keep the files that were written, to remove them
                failure = failure or exc
        if failure is not None:
            raise failure


def commit_segments(catalog: Catalog, chains: dict[int, PartitionChain], written: list[WrittenFile]) -> int:
    """One catalog transaction: each touched partition's clock moved from the version read at the start to its
    newest segment's (a conditional update), each segment registered on top of the one before it (``written``
    in chain order). Returns the commit time; ConflictError if another writer got there first (the transaction
    rolls back). The in-process writers and the Spark writer (``spark.dataframe_writer``) both commit here."""
    committed_us = hlc.now_us()
    with catalog.write() as s:
        for chain in chains.values():
            if not chain.extended:
                continue
            part = chain.target.partition
            res = s.execute(
                update(m.Partition)
                .where(
                    m.Partition.partition_id == part.partition_id,
                    m.Partition.last_version == part.last_version,
                    m.Partition.epoch == part.epoch,
                    m.Partition.leader_placement_id == part.leader_placement_id,
                    m.Partition.state.in_([str(x) for x in q.WRITABLE_STATES]),
                    m.Partition.paused_us.is_(None),  # a switchover's pause fences writes prepared before it
                )
                .values(last_version=chain.last_version)
                .execution_options(synchronize_session=False)
            )
            if rowcount(res) != 1:
                raise ConflictError(f"partition {part.partition_id} changed while writing")
        for w in written:
            register_segment(
                s,
                w.chain.target.placement,
                w.entry,
                w.relpath,
                w.facts,
                committed_us,
                expected_root=w.base,
                move_root=not w.chain.target.local,  # a local write sits beside the chain until merged
            )
    return committed_us


def remove_files(written: list[WrittenFile]) -> None:
    for w in written:
        w.site.delete(w.relpath)  # never referenced: safe to remove


def written_segment(w: WrittenFile) -> WrittenSegment:
    e = w.entry
    return WrittenSegment(
        e.partition_id, w.chain.target.site.name, e.segment_id, e.row_count, w.facts.byte_size, e.max_version
    )


def write_event_extra(result: WriteResult) -> dict[str, Any]:
    """What the table's writes asset event carries: the table, what was committed and when (ISO and µs)."""
    if result.committed_us is None:
        raise ValueError(f"the write to {result.table} committed nothing: there is no event to describe")
    return {
        "table": result.table,
        "rows_written": result.rows_written,
        "deleted": result.deleted,
        "committed": hlc.iso(result.committed_us),
        "committed_us": result.committed_us,
        "max_version": max(seg.version for seg in result.segments),
        "segment_count": len(result.segments),
        "segments": [  # the first EXTRA_SEGMENTS: an event stays small whatever the write touched
            {"partition_id": seg.partition_id, "site": seg.site, "segment_id": seg.segment_id, "rows": seg.rows}
            for seg in result.segments[:EXTRA_SEGMENTS]
        ],
    }


def write_targets(catalog: Catalog, info: q.TableInfo, site: str | None = None) -> list[WriteTarget]:
    """Where a write of ``info`` goes, read now: each serving partition's leader placement, or ``site``'s own
    placement of an active-active table; WritesPausedError while a switchover pauses writes."""
    with catalog.read() as s:
        parts = q.serving_partitions(s, info)
        if not parts:
            raise SegrepError(f"table {info.name} has no writable partition")
        placements = {p.placement_id: p for p in q.active_placements(s, [p.partition_id for p in parts])}
        sites = q.sites_by_id(s)
        at = q.site_by_name(s, site) if site is not None else None
    paused = [p.paused_us for p in parts if p.paused_us is not None]
    if paused:
        raise WritesPausedError(
            f"table {info.name} is switching over: writes are paused since {hlc.iso(min(paused))} "
            "until its new leader holds everything; nothing was written, write again in a moment"
        )
    out = []
    for part in parts:
        leader = placements.get(part.leader_placement_id or -1)
        if leader is None:
            raise SegrepError(f"partition {part.partition_id} of {info.name} has no leader placement")
        if at is None or leader.site_id == at.site_id:
            out.append(WriteTarget(part, leader, sites[leader.site_id]))
            continue
        if info.row.writes != "any_site":
            raise SegrepError(
                f"table {info.name} takes writes only at each partition's leader, and site {at.name} does not lead "
                f"partition {part.partition_id} (its leader is {sites[leader.site_id].name}); write without "
                "--site, or set `writes: any_site` for active-active writes"
            )
        local = next(
            (pl for pl in placements.values() if pl.partition_id == part.partition_id and pl.site_id == at.site_id),
            None,
        )
        if local is None or local.needs_bootstrap:
            raise SegrepError(
                f"site {at.name} holds no live replica of {info.name} partition {part.partition_id}; "
                "it cannot take writes there"
            )
        out.append(WriteTarget(part, local, at, local=True))
    return out


def partition_bounds(info: q.TableInfo, parts: list[m.Partition]) -> list[Any]:
    """The decoded begin keys of every partition but the first: what ``route_rows`` splits by."""
    return [info.decode_key(p.begin_key) for p in parts[1:]]


def route_rows(rows: pa.Table, partition_key: str, key_type: pa.DataType, bounds: list[Any]) -> list[pa.Table | None]:
    """Split rows by partition key range (``bounds``: ``partition_bounds``); one entry per partition, in key
    order (the partitions tile the key space), None where no row falls."""
    if not bounds:
        return [rows]
    count = len(bounds) + 1
    bucket = bucket_rows(rows, partition_key, key_type, bounds)
    out: list[pa.Table | None] = []
    if bool(np.all(bucket[1:] >= bucket[:-1])):  # sorted by partition key: zero-copy slices
        edges = np.searchsorted(bucket, np.arange(count + 1), "left")
        for i in range(count):
            lo, hi = int(edges[i]), int(edges[i + 1])
            out.append(None if hi == lo else rows.slice(lo, hi - lo))
        return out
    for i in range(count):
        mask = bucket == i
        n = int(mask.sum())
        out.append(None if n == 0 else rows if n == rows.num_rows else rows.filter(pa.array(mask)))
    return out


def bucket_rows(rows: pa.Table, partition_key: str, key_type: pa.DataType, bounds: list[Any]) -> np.ndarray:
    """Each row's partition, as its index in key order."""
    if not bounds:
        return np.zeros(rows.num_rows, np.int64)
    return _bucketize(rows.column(partition_key), bounds, key_type)


def _bucketize(col: pa.ChunkedArray, bounds: list[object], dtype: pa.DataType) -> np.ndarray:
    if pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_date(dtype):
        values = col.to_numpy()
        edges = np.asarray(pa.array(bounds, dtype).to_numpy(zero_copy_only=False))
        found: np.ndarray = np.searchsorted(edges, values, "right")
        return found
    values = col.to_pylist()
    return np.fromiter((bisect.bisect_right(bounds, v) for v in values), np.int64, len(values))


def write_segment_file(
    site: Site, layout: TableLayout, plan: SegmentPlan, rows: pa.Table, delete: bool
) -> tuple[SegmentEntry, FileFacts]:
    """Stamp ``rows`` (conformed, de-duplicated, all in ``plan``'s partition) as ``plan`` says and write them
    atomically at ``site``: the file's entry and facts (size, sha256, CRC-64/NVME). Where the write runs does
    not matter: in this process, or on a Spark executor with a ``Site`` built from the shipped options."""
    stamped = stamp_rows(
        rows,
        layout.schema,
        version=plan.version,
        deleted=delete,
        origin=plan.origin_site_id,
        layout=layout.version.segment_arrow(),
    )
    entry = SegmentEntry(
        segment_id=plan.segment_id,
        table=layout.name,
        partition_id=plan.partition_id,
        base_segment_id=plan.base_segment_id,
        is_major=plan.is_major,
        origin_site_id=plan.origin_site_id,
        epoch=plan.epoch,
        schema_fingerprint=layout.schema_fingerprint,
        partition_begin=plan.partition_begin,
        partition_end=plan.partition_end,
        schema_version=layout.version.version,
        **entry_stats(stamped, layout.primary_key),
    )
    return entry, site.write_segment(plan.relpath, stamped, entry.to_meta())


def _write_file(
    catalog: Catalog, layout: TableLayout, chain: PartitionChain, part_rows: pa.Table, delete: bool
) -> WrittenFile:
    plan = chain.plan_segment(layout.name)
    site = open_site(catalog, chain.target.site)  # checks the site's identity marker before writing
    entry, facts = write_segment_file(site, layout, plan, part_rows, delete)
    return WrittenFile(chain, entry, plan.relpath, facts, site, plan.base_segment_id)
