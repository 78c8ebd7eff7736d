"""Writing a Spark DataFrame into a table: segment files written on the executors, one commit in the driver.

``write_dataframe`` is ``data.writer.write_batch`` for a DataFrame too large for one process. The pieces are the
writer's own: ``write_targets`` (leaders, or a site's placements of an active-active table), ``route_rows``
(partition key ranges), ``PartitionChain.plan_segment`` (segment id, base, major flag, clock value),
``write_segment_file`` (stamp, entry, atomic write, sha256 and CRC-64/NVME as the bytes go out) and
``commit_segments`` (the conditional clock moves and every root move in one transaction).

1. Checks, before any job: the mode, the table, the DataFrame's columns against the table's schema versions
   (``conform_to_current`` on its Arrow schema: a missing key column or an unknown column is refused here),
   every target site's identity marker (the executors open sites without it).
2. Planning pass, in Spark SQL (no Python worker): the key columns only (a Parquet source reads nothing
   else), rows counted per (Spark task, partition) by comparing the partition key with the bounds: the cells;
   a null or NaN key is refused here, still before any file. (A key value its column's type cannot hold, an
   int64 beyond an int32 key, is refused by the writing pass: the job fails and commits nothing.)
3. The driver plans one segment per cell, chained in task order within each partition: task i's segment for
   a partition is based on the one of the task before it that touched the partition, and stamped with the next
   clock value. So a later row of the DataFrame beats an earlier one with the same key, as in ``write_batch``
   (within a cell ``dedupe_last`` keeps the last row; across cells the later cell's version is higher).
4. Writing pass: each task routes its rows, conforms them, and writes exactly the files its cells were planned
   (through ``Site``, with the store options the plan carries: any site the package reaches), then returns
   each file's entry and facts as rows. A task whose rows differ from the planning pass (a DataFrame that is
   not deterministic) fails the job. A retried task writes the same paths again (ids are planned).
5. The driver checks every planned cell came back with the planned segment, version and a file of the
   reported size at its site, then commits all of them in one transaction. A conflicting writer (a moved
   partition) removes the files and plans again, as ``write_batch`` does (at most ``MAX_ATTEMPTS`` runs).

A failed job commits nothing: its files are removed where the driver can, and whatever is left (a killed
driver, a task still running) is an unreferenced segment file or a temporary name, which GC removes once older
than the table's ``orphan_grace_s`` (``maintenance.gc``). PySpark is imported lazily.
"""

from __future__ import annotations

import enum
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from segrep.catalog import Catalog
from segrep.catalog import queries as q
from segrep.catalog.schemas import current_schema, schema_versions
from segrep.catalog.site_identity import open_site
from segrep.config.definitions import Definitions
from segrep.config.stores import StoreOptions, options_for
from segrep.core import faults
from segrep.core import schema as sch
from segrep.core.batch_versions import conform_to_current
from segrep.core.errors import SchemaMismatchError, SegrepError
from segrep.core.schema_versions import SchemaVersion
from segrep.data.writer import (
    PartitionChain,
    SegmentPlan,
    TableLayout,
    WriteResult,
    WriteTarget,
    WrittenFile,
    announce_write,
    commit_segments,
    partition_bounds,
    route_rows,
    until_no_conflict,
    write_segment_file,
    write_targets,
    written_segment,
)
from segrep.storage.atomic import FileFacts
from segrep.storage.segment_meta import SegmentEntry
from segrep.storage.site import Site

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 3  # whole Spark writes: a conflicting writer is rare, and each attempt reads the DataFrame again
# A user error raised on an executor, as the task's traceback names it (the driver reports it as itself)
_EXECUTOR_ERROR = re.compile(r"segrep\.core\.errors\.(\w+): ([^\n]+)")


class WriteMode(enum.StrEnum):
    UPSERT = "upsert"
    DELETE = "delete"


@dataclass(frozen=True)
class SiteRef:
    """A site as an executor opens it: name, URI and store options (a credentials reference, no secret)."""

    name: str
    uri: str
    options: StoreOptions


@dataclass(frozen=True)
class RowsSpec:
    """What an executor needs to conform and route the DataFrame's rows (shipped in the task's closure)."""

    layout: TableLayout
    history: tuple[SchemaVersion, ...]
    delete: bool
    partition_key: str
    key_type: pa.DataType
    bounds: tuple[Any, ...]  # decoded begin keys of every partition but the first (``writer.partition_bounds``)

    @property
    def key_columns(self) -> list[str]:
        return list(self.layout.primary_key)

    def conform(self, rows: pa.Table) -> pa.Table:
        return conform_to_current(
            rows, self.layout.version, self.history, self.layout.primary_key, keys_only=self.delete
        ).rows

    def route(self, rows: pa.Table) -> list[pa.Table | None]:
        return route_rows(rows, self.partition_key, self.key_type, list(self.bounds))


Cell = tuple[int, int]  # (Spark task, partition index in key order)


@dataclass(frozen=True)
class WritePlan:
    """One attempt's files: each cell's segment and where it goes, and the rows the planning pass counted."""

    rows: RowsSpec
    plans: dict[Cell, SegmentPlan]
    sites: dict[int, SiteRef]  # partition index -> the site its segments are written at
    counts: dict[Cell, int]


_FILE_FIELDS = [
    ("task", pa.int32()),
    ("part", pa.int32()),
    ("rows_in", pa.int64()),
    ("entry", pa.string()),
    ("byte_size", pa.int64()),
    ("sha256", pa.string()),
    ("crc64nvme", pa.string()),
]


def write_dataframe(
    df: DataFrame,
    table: str,
    mode: str = "upsert",
    *,
    catalog: Catalog,
    site: str | None = None,
    defs: Definitions | None = None,
) -> WriteResult:
    """Upsert the DataFrame's rows into ``table`` (``mode="upsert"``: full rows, or an older schema version's
    columns), or delete its keys (``mode="delete"``: the primary key columns only), in one catalog commit.

    The same rules as ``write_batch``: at each partition's leader, or at ``site`` for a table that takes
    writes anywhere; the last of several rows with one key wins (in DataFrame order); with ``defs``, a
    ``schedule: on_write`` table's asset event is sent after the commit. SegrepError (nothing written) for a bad
    mode, an unknown table, columns that are not the table's, a null or NaN key. A site on an object store
    needs the definitions loaded in this process (its store options go to the executors)."""
    try:
        write_mode = WriteMode(mode)
    except ValueError:
        raise SegrepError(f"unknown write mode {mode!r}: use upsert or delete") from None
    delete = write_mode is WriteMode.DELETE
    with catalog.read() as s:
        info = q.table_info(s, table)
        version = current_schema(s, info.table_id)
        history = tuple(schema_versions(s, info.table_id).values())
    conformed = conform_to_current(
        _arrow_schema(df).empty_table(), version, history, info.primary_key, keys_only=delete
    )  # the columns and their types, checked before any job runs
    result = WriteResult(
        table=table,
        rows_in=0,
        rows_written=0,
        deleted=delete,
        batch_version=conformed.written_at,
        stored_version=version.version,
    )
    targets = write_targets(catalog, info, site)
    partitions = [t.partition.partition_id for t in targets]
    bounds = tuple(partition_bounds(info, [t.partition for t in targets]))
    spec = RowsSpec(TableLayout.of(info, version), history, delete, info.partition_key, info.key_type, bounds)
    counts = plan_cells(df, spec)
    result.rows_in = sum(counts.values())
    if not counts:
        return result

    def attempt(n: int) -> None:
        planned = targets if n == 1 else write_targets(catalog, info, site)  # planned again after a conflict
        if [t.partition.partition_id for t in planned] != partitions:
            raise SegrepError(
                f"the partitions of {table} changed during the write (a split): nothing was written; write again"
            )
        _attempt(catalog, df, spec, planned, counts, result)

    until_no_conflict(table, result, MAX_ATTEMPTS, attempt)
    announce_write(defs, table, result)
    return result


def _arrow_schema(df: DataFrame) -> pa.Schema:
    """The DataFrame's columns as Arrow types (what its rows reach the executors' Python code as)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    timezone = df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"
    try:
        return to_arrow_schema(df.schema, timezone=timezone)
    except TypeError as exc:  # a Spark type with no Arrow equivalent
        raise SegrepError(f"the DataFrame has a column Arrow cannot hold: {exc}") from None


def plan_cells(df: DataFrame, spec: RowsSpec) -> dict[Cell, int]:
    """The planning pass, in Spark's own SQL (no Python worker): per (Spark task, partition) the number of
    rows, the partition found by comparing the partition key with the bounds as the writer's ``route_rows``
    does; a null or NaN key is refused here, before any file (SchemaMismatchError, as ``conform_batch`` says
    it). A key value its column's type cannot hold is refused by the writing pass, before that task writes."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, FloatType

    key = F.col(spec.partition_key)
    part = F.lit(0)
    for bound in spec.bounds:
        part = part + F.when(key >= F.lit(bound), 1).otherwise(0)
    types = {f.name: f.dataType for f in df.schema.fields}
    flags = {f"null {c}": F.col(c).isNull() for c in spec.key_columns}
    flags |= {f"nan {c}": F.isnan(F.col(c)) for c in spec.key_columns if isinstance(types[c], DoubleType | FloatType)}
    cells = (
        df.select(F.spark_partition_id().alias("task"), part.alias("part"), *[f.alias(n) for n, f in flags.items()])
        .groupBy("task", "part")
        .agg(F.count(F.lit(1)).alias("rows"), *[F.sum(F.col(f"`{n}`").cast("long")).alias(n) for n in flags])
    )
    found = _collect(cells)
    for name in flags:
        bad = int(sum(v or 0 for v in found.column(name).to_pylist()))
        if bad:
            kind, column = name.split(" ", 1)
            what = (
                "null value(s); a key cannot be null"
                if kind == "null"
                else "NaN value(s); NaN equals nothing, so it cannot be a key"
            )
            raise SchemaMismatchError(f"key column {column} has {bad} {what}")
    columns = (found.column(c).to_pylist() for c in ("task", "part", "rows"))
    return {(int(t), int(p)): int(n) for t, p, n in zip(*columns, strict=True)}


def _attempt(
    catalog: Catalog,
    df: DataFrame,
    spec: RowsSpec,
    targets: list[WriteTarget],
    counts: dict[Cell, int],
    result: WriteResult,
) -> None:
    started = time.perf_counter()
    chains = [PartitionChain(t) for t in targets]
    plan = _plan(spec, chains, counts)
    written: list[WrittenFile] = []
    try:
        _check_sites(catalog, targets, {part for _, part in counts})
        files = _run_writes(df, plan)
        written = _verified(catalog, plan, chains, files)
        result.files_s = time.perf_counter() - started
        started = time.perf_counter()
        result.committed_us = commit_segments(catalog, {c.target.partition.partition_id: c for c in chains}, written)
    except BaseException:
        _remove_planned(catalog, targets, plan)
        raise
    result.commit_s = time.perf_counter() - started
    result.segments = [written_segment(w) for w in written]
    result.rows_written = sum(w.entry.row_count for w in written)


def _plan(spec: RowsSpec, chains: list[PartitionChain], counts: dict[Cell, int]) -> WritePlan:
    """Each cell's segment, in task order within each partition: a chain the commit registers in that order."""
    plans = {cell: chains[cell[1]].plan_segment(spec.layout.name) for cell in sorted(counts)}
    sites = {}
    for part in {p for _, p in counts}:
        row = chains[part].target.site
        sites[part] = SiteRef(row.name, row.uri, options_for(row.name, row.uri))
    return WritePlan(spec, plans, sites, dict(counts))


def _check_sites(catalog: Catalog, targets: list[WriteTarget], parts: set[int]) -> None:
    """Each target site's identity marker, checked here: the executors open the sites without the catalog."""
    for site_id in sorted({targets[p].site.site_id for p in parts}):
        row = next(t.site for t in targets if t.site.site_id == site_id)
        open_site(catalog, row).ensure_identified(fresh=True)


def _run_writes(df: DataFrame, plan: WritePlan) -> dict[Cell, tuple[int, SegmentEntry, FileFacts]]:
    """The writing pass: each cell's file written by its task; per cell the rows it had, its entry and facts."""
    from pyspark.sql.pandas.types import from_arrow_schema

    found = _collect(df.mapInArrow(write_cells(plan), from_arrow_schema(_files_schema())))
    out = {}
    for row in found.to_pylist():
        cell = (int(row["task"]), int(row["part"]))
        facts = FileFacts(int(row["byte_size"]), str(row["sha256"]), row["crc64nvme"])
        out[cell] = (int(row["rows_in"]), SegmentEntry.from_meta(json.loads(row["entry"])), facts)
    return out


def write_cells(plan: WritePlan) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The writing pass's ``mapInArrow`` function: this task's rows, conformed and routed, written as the
    cells planned for it; one row per file (its entry as JSON, size, sha256, CRC-64/NVME)."""
    spec = plan.rows

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = _task()
        chunks = list(batches)
        planned = {part: plan.counts[(t, part)] for t, part in plan.plans if t == task}
        groups = spec.route(spec.conform(pa.Table.from_batches(chunks))) if chunks else []
        found = {part: rows for part, rows in enumerate(groups) if rows is not None}
        if {part: rows.num_rows for part, rows in found.items()} != planned:
            raise SegrepError(
                f"Spark task {task} holds other rows than the planning pass counted (partitions {sorted(found)}, "
                f"planned {sorted(planned)}): the DataFrame is not deterministic; persist or checkpoint it first"
            )
        sites: dict[int, Site] = {}
        for part, rows in sorted(found.items()):
            ref = plan.sites[part]
            site = sites.setdefault(part, Site(ref.name, ref.uri, ref.options))  # the driver checked its marker
            entry, facts = write_segment_file(
                site, spec.layout, plan.plans[(task, part)], sch.dedupe_last(rows, spec.layout.primary_key), spec.delete
            )
            faults.point("in_spark_write")  # a file is written under its final name; the job goes on
            yield pa.RecordBatch.from_pylist(
                [
                    {
                        "task": task,
                        "part": part,
                        "rows_in": rows.num_rows,
                        "entry": json.dumps(entry.to_meta(), sort_keys=True),
                        "byte_size": facts.byte_size,
                        "sha256": facts.sha256,
                        "crc64nvme": facts.crc64nvme,
                    }
                ],
                schema=_files_schema(),
            )

    return write


def _verified(
    catalog: Catalog,
    plan: WritePlan,
    chains: list[PartitionChain],
    files: dict[Cell, tuple[int, SegmentEntry, FileFacts]],
) -> list[WrittenFile]:
    """The written files in chain order, each checked against its plan: every cell once, the planned segment
    (id, base, partition, version), the rows counted, and a file of the reported size at its site."""
    if set(files) != set(plan.plans):
        missing = sorted(set(plan.plans) - set(files))
        raise SegrepError(f"the Spark write returned other files than planned (missing cells {missing[:5]})")
    sites: dict[int, Site] = {}
    out = []
    for cell in sorted(plan.plans):
        seg_plan, (rows_in, entry, facts) = plan.plans[cell], files[cell]
        chain = chains[cell[1]]
        expected = (seg_plan.segment_id, seg_plan.base_segment_id, seg_plan.partition_id, seg_plan.version)
        got = (entry.segment_id, entry.base_segment_id, entry.partition_id, entry.max_version)
        if got != expected or entry.min_version != seg_plan.version or rows_in != plan.counts[cell]:
            raise SegrepError(f"Spark task {cell[0]} wrote {got}, not the planned segment {expected}")
        site = sites.get(chain.target.site.site_id) or open_site(catalog, chain.target.site)
        sites[chain.target.site.site_id] = site
        size = site.fs.get_file_info(site.path(seg_plan.relpath)).size
        if size != facts.byte_size:
            raise SegrepError(
                f"segment file {site.path(seg_plan.relpath)} has {size} bytes, its writer reported {facts.byte_size}"
            )
        out.append(WrittenFile(chain, entry, seg_plan.relpath, facts, site, seg_plan.base_segment_id))
    return out


def _remove_planned(catalog: Catalog, targets: list[WriteTarget], plan: WritePlan) -> None:
    """Best effort after a failed or conflicting attempt: every planned file is removed where it may be (none
    is referenced). What stays (a site down, a task still running) GC removes as an orphan."""
    by_site: dict[int, Site] = {}
    for (_, part), seg_plan in plan.plans.items():
        row = targets[part].site
        try:
            site = by_site.get(row.site_id) or open_site(catalog, row)
            by_site[row.site_id] = site
            site.delete(seg_plan.relpath)
        except (OSError, SegrepError) as exc:  # a site down or unidentified: GC takes the file later
            log.warning("planned file %s at %s not removed: %s", seg_plan.relpath, row.name, exc)
    log.info("removed the %d planned file(s) of a failed Spark write", len(plan.plans))


def _task() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("not in a Spark task")
    return int(ctx.partitionId())


def _collect(df: DataFrame) -> pa.Table:
    """Run the job and bring its (small) result to the driver. A task's own refusal (a SegrepError raised
    on an executor: a null key, a value its column cannot hold) is the user's: one line, as SegrepError."""
    try:
        return df.toArrow()
    except Exception as exc:
        user = _EXECUTOR_ERROR.search(str(exc))
        if user is None:
            raise
        raise SegrepError(user.group(2).strip()) from None


def _files_schema() -> pa.Schema:
    return pa.schema(_FILE_FIELDS)
