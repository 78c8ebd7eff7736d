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
from collections.abc import Iterable
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
class _Target:
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
    for attempt in range(1, MAX_ATTEMPTS + 1):
        result.attempts = attempt
        try:
            result.segments = _attempt(catalog, info, schema, rows, delete, result, site)
        except ConflictError as exc:
            log.info("write to %s conflicted (attempt %d): %s", table, attempt, exc)
            continue
        policy = defs.policy(table) if defs is not None else None
        if policy is not None and policy.on_write:
            result.event = announce(table, write_event_extra(result), policy.write_fallback_s)
            log.info("%s", result.event.detail)
        return result
    raise SegrepError(f"write to {table} gave up after {MAX_ATTEMPTS} conflicting attempts; retry later")


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
    targets = _targets(catalog, info, site)
    chains = {t.partition.partition_id: _Chain(t) for t in targets}
    written: list[_Written] = []
    try:
        _write_files(catalog, info, schema, rows, delete, chains, written)
        timing.files_s = time.perf_counter() - started
        started = time.perf_counter()
        timing.committed_us = _commit(catalog, chains, written)
    except BaseException:
        _remove(written)
        raise
    timing.commit_s = time.perf_counter() - started
    return [_written_segment(w) for w in written]


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
    chains = {t.partition.partition_id: _Chain(t) for t in _targets(catalog, info)}
    written: list[_Written] = []
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
        result.committed_us = _commit(catalog, chains, written) if written else None
    except BaseException:
        _remove(written)
        raise
    result.commit_s = time.perf_counter() - started
    result.attempts = 1
    result.segments = [_written_segment(w) for w in written]
    return result


@dataclass
class _Chain:
    """A partition's chain as this write extends it: the partition and placement as read at the start, and the
    version and root the write's next segment there follows (several with ``write_batches``)."""

    target: _Target
    last_version: int = 0
    root: str | None = None
    extended: bool = False

    def __post_init__(self) -> None:
        self.last_version = self.target.partition.last_version
        self.root = self.target.placement.root_segment_id


@dataclass(frozen=True)
class _Written:
    chain: _Chain
    entry: SegmentEntry
    relpath: str
    facts: FileFacts
    site: Site
    base: str | None  # the root the segment continues: its conditional move expects it


def _write_files(
    catalog: Catalog,
    info: q.TableInfo,
    schema: SchemaVersion,
    rows: pa.Table,
    delete: bool,
    chains: dict[int, _Chain],
    written: list[_Written],
) -> None:
    """Route ``rows`` and write one file per partition they touch, each continuing its partition's chain as
    this write extends it; append to ``written`` (also the files of a partition that succeeded when another
    failed, so the caller can remove them)."""
    ordered = list(chains.values())
    groups = _route(rows, info, [c.target.partition for c in ordered])
    work = [(c, rows_) for c, rows_ in zip(ordered, groups, strict=True) if rows_ is not None]
    if len(work) == 1:  # one partition (a key-sorted batch often is): no pool to start and join
        written.append(_write_file(catalog, info, schema, *work[0], delete))
    else:
        # Parquet encoding, hashing and fsync release the GIL: partitions are written side by side.
        with ThreadPoolExecutor(max_workers=min(len(work), WRITE_THREADS)) as pool:
            futures = [pool.submit(_write_file, catalog, info, schema, c, rows_, delete) for c, rows_ in work]
        failure: BaseException | None = None
        for future in futures:
            try:
                written.append(future.result())
            except BaseException as exc:  # keep the files that were written, to remove them
                failure = failure or exc
        if failure is not None:
            raise failure


def _commit(catalog: Catalog, chains: dict[int, _Chain], written: list[_Written]) -> int:
    """One catalog transaction: each touched partition's clock moved from the version read at the start to its
    newest segment's (a conditional update), each segment registered on top of the one before it. Returns the
    commit time; ConflictError if another writer got there first (the transaction rolls back)."""
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


def _remove(written: list[_Written]) -> None:
    for w in written:
        w.site.delete(w.relpath)  # never referenced: safe to remove


def _written_segment(w: _Written) -> WrittenSegment:
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


def _targets(catalog: Catalog, info: q.TableInfo, site: str | None = None) -> list[_Target]:
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
            out.append(_Target(part, leader, sites[leader.site_id]))
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
        out.append(_Target(part, local, at, local=True))
    return out


def _route(rows: pa.Table, info: q.TableInfo, parts: list[m.Partition]) -> list[pa.Table | None]:
    """Split rows by partition key range; partitions are in key order and tile the key space."""
    if len(parts) == 1:
        return [rows]
    bounds = [info.decode_key(p.begin_key) for p in parts[1:]]
    col = rows.column(info.partition_key)
    bucket = _bucketize(col, bounds, info.key_type)
    out: list[pa.Table | None] = []
    if bool(np.all(bucket[1:] >= bucket[:-1])):  # sorted by partition key: zero-copy slices
        edges = np.searchsorted(bucket, np.arange(len(parts) + 1), "left")
        for i in range(len(parts)):
            lo, hi = int(edges[i]), int(edges[i + 1])
            out.append(None if hi == lo else rows.slice(lo, hi - lo))
        return out
    for i in range(len(parts)):
        mask = bucket == i
        n = int(mask.sum())
        out.append(None if n == 0 else rows if n == rows.num_rows else rows.filter(pa.array(mask)))
    return out


def _bucketize(col: pa.ChunkedArray, bounds: list[object], dtype: pa.DataType) -> np.ndarray:
    if pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_date(dtype):
        values = col.to_numpy()
        edges = np.asarray(pa.array(bounds, dtype).to_numpy(zero_copy_only=False))
        found: np.ndarray = np.searchsorted(edges, values, "right")
        return found
    values = col.to_pylist()
    return np.fromiter((bisect.bisect_right(bounds, v) for v in values), np.int64, len(values))


def _write_file(
    catalog: Catalog, info: q.TableInfo, schema: SchemaVersion, chain: _Chain, part_rows: pa.Table, delete: bool
) -> _Written:
    target = chain.target
    part = target.partition
    version = hlc.next_version(chain.last_version)
    base = chain.root
    chain.last_version, chain.extended = version, True
    segment_id = new_segment_id()
    if not target.local:  # a local write sits beside the chain: the next one continues the same root
        chain.root = segment_id
    stamped = stamp_rows(
        part_rows,
        info.schema,
        version=version,
        deleted=delete,
        origin=target.site.site_id,
        layout=schema.segment_arrow(),
    )
    entry = SegmentEntry(
        segment_id=segment_id,
        table=info.name,
        partition_id=part.partition_id,
        base_segment_id=base,
        # the first segment of a chain is major (EventQL 3); a local write is never on a chain
        is_major=base is None and not target.local,
        origin_site_id=target.site.site_id,
        epoch=part.epoch,
        schema_fingerprint=info.row.schema_fingerprint,
        partition_begin=part.begin_key,
        partition_end=part.end_key,
        schema_version=schema.version,
        **entry_stats(stamped, info.primary_key),
    )
    site = open_site(catalog, target.site)  # checks the site's identity marker before writing
    relpath = segment_relpath(info.name, part.partition_id, entry.segment_id)
    facts = site.write_segment(relpath, stamped, entry.to_meta())
    return _Written(chain, entry, relpath, facts, site, base)
