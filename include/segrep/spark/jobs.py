"""Row-level merges on Spark: a manifest of work items in, new local segments and a result file out.

Three kinds of item, each for one partition's leader:
- ``merge``: segments pushed by followers (forks), or by a split parent's placements (UNLOAD). Keep the
  incoming rows inside the partition's key range that win under last-writer-wins against the partition, so a
  repeated merge keeps nothing new (DESIGN section 6).
- ``major``: fold the leader's visible chain into one major segment (tombstones kept), for a replica that can
  no longer fast-forward the leader's minor segments (OUT_OF_ORDER after a restart).
- ``split``: rewrite one segment of a splitting parent for a child's key range (EventQL 3.8): the rows in
  range, tombstones included, under the same ``segment_id``, ``base_segment_id`` and major flag, so the
  child's chain mirrors the parent's and a replay is recognised as SEGMENT_EXISTS.

Output paths are deterministic (the plan fixes each output's segment id), so a retried job overwrites its
own files and never duplicates; the catalog commit is done afterwards by a Python task from the result file.
Inputs are read on the executors through the sites' own file systems with the manifest's store options
(``data.spark_files``), and the output is written by the driver through ``Site.write_segment`` at the leader:
any site the package can reach, local or on an object store. PySpark is imported lazily: the package works
without it.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from segrep.core import faults, keys
from segrep.core import schema as sch
from segrep.core.chain import MAX_SEGMENT_HISTORY
from segrep.core.errors import CorruptSegmentError
from segrep.data.spark_files import SegmentFile, segment_frame
from segrep.spark.conflicts import Conflict, merge_conflicts
from segrep.spark.manifest import MANIFEST_FORMAT, FileRef, Manifest, MergeItem
from segrep.storage.segment_meta import SegmentEntry, entry_stats

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# -- the Spark side -------------------------------------------------------------------------------------------


def run_manifest(spark: SparkSession, manifest: Manifest) -> dict[str, Any]:
    """Execute every item; return the result document the commit step records."""
    results = []
    for n, item in enumerate(manifest.items):
        results.append(_run_item(spark, item))
        if n == 0:
            faults.point("in_merge_job")
    return {"format": MANIFEST_FORMAT, "round_key": manifest.round_key, "items": results}


def _run_item(spark: SparkSession, item: MergeItem) -> dict[str, Any]:
    base = {"item_id": item.item_id, "kind": item.kind, "partition_id": item.partition_id}
    try:
        for ref in (*item.incoming, *item.visible):
            ref.open_site().verify(ref.relpath, ref.byte_size, ref.sha256)
    except (CorruptSegmentError, OSError) as exc:  # a corrupt file, or a site that is down: this item only
        return {**base, "status": "invalid", "error": str(exc), "output": None, "rows_in": 0, "rows_out": 0}
    schema = sch.schema_from_columns(dict(item.columns))
    if item.kind == "merge":
        rows_df, rows_in, conflicts = _merge_rows(spark, item)
        base = {**base, "conflicts": [asdict(c) for c in conflicts]}
    else:
        rows_df, rows_in = _item_rows(spark, item)
    rows = _to_segment_table(rows_df, schema, item.primary_key)
    # Nothing to write, except where the output's place in the chain matters even empty: a split rewrite, and
    # a major as of a failover's cut (every row of the partition newer than the cut: as of it, none is there)
    if rows.num_rows == 0 and item.kind != "split" and item.as_of_us is None:
        return {**base, "status": "ok", "output": None, "rows_in": rows_in, "rows_out": 0}
    if item.kind == "split":
        is_major, included = item.is_major, tuple(item.included_segment_ids)
    else:
        is_major = item.kind == "major"
        # a major folds the visible chain; a merge output names the pushed segments it merged, so a site
        # that wrote one (active-active) sees it on its chain once the output arrives (DESIGN 12)
        folded = item.visible if is_major else item.incoming
        included = tuple(ref.segment_id for ref in folded)[-MAX_SEGMENT_HISTORY:]
    entry = SegmentEntry(
        segment_id=item.output_segment_id,
        table=item.table,
        partition_id=item.partition_id,
        base_segment_id=item.base_segment_id,
        is_major=is_major,
        origin_site_id=item.leader_site_id,
        epoch=item.epoch,
        schema_fingerprint=item.schema_fingerprint,
        partition_begin=item.partition_begin,
        partition_end=item.partition_end,
        included_segment_ids=included,
        **entry_stats(rows, item.primary_key),
    )
    facts = item.leader().write_segment(item.output_relpath, rows, entry.to_meta())
    output = {"entry": entry.to_meta(), "relpath": item.output_relpath, **asdict(facts)}
    return {**base, "status": "ok", "output": output, "rows_in": rows_in, "rows_out": rows.num_rows}


def _row_count(refs: list[FileRef]) -> int:
    """Rows in the files, from their Parquet footers (no data pass)."""
    import pyarrow.parquet as pq

    total = 0
    for r in refs:
        site = r.open_site()
        total += pq.read_metadata(site.path(r.relpath), filesystem=site.fs).num_rows
    return total


def file_frame(
    spark: SparkSession, refs: list[FileRef], schema: pa.Schema, columns: list[str] | None = None
) -> DataFrame:
    """The files' unresolved rows, read on the executors from each file's site with the manifest's options."""
    files = [SegmentFile(r.site, r.uri, r.options, r.relpath) for r in refs]
    return segment_frame(spark, files, schema, columns)


def latest_rows(df: DataFrame, primary_key: list[str]) -> DataFrame:
    """One row per primary key: the highest (_version, _origin). A hash aggregate (max_by over the ordering
    struct) rather than a window: no sort of the whole input."""
    from pyspark.sql import functions as F

    others = [c for c in df.columns if c not in primary_key]
    order = F.struct(F.col(sch.VERSION_COL), F.col(sch.ORIGIN_COL))
    best = df.groupBy(*primary_key).agg(F.max_by(F.struct(*[F.col(c) for c in others]), order).alias("__row"))
    return best.select(*primary_key, *[F.col("__row").getField(c).alias(c) for c in others])


def _merge_rows(spark: SparkSession, item: MergeItem) -> tuple[DataFrame, int, list[Conflict]]:
    """Incoming rows that beat the partition's current winner for their key (or whose key it lacks), and the
    concurrent overwrites among them (``spark.conflicts``)."""
    from pyspark.sql import functions as F

    schema = sch.schema_from_columns(dict(item.columns))
    incoming_all = _in_range(file_frame(spark, item.incoming, schema), item)
    rows_in = _row_count(item.incoming)
    incoming = latest_rows(incoming_all, item.primary_key)
    if not item.visible:
        return incoming, rows_in, merge_conflicts(incoming_all, incoming, None, item.primary_key, item.origin_forks)
    v, o = sch.VERSION_COL, sch.ORIGIN_COL
    best = (
        file_frame(spark, item.visible, schema, [*item.primary_key, v, o])
        .groupBy(*item.primary_key)
        .agg(F.max(F.struct(F.col(v), F.col(o))).alias("__best"))
    )
    conflicts = merge_conflicts(incoming_all, incoming, best, item.primary_key, item.origin_forks)
    joined = incoming.join(best, on=item.primary_key, how="left")
    bv, bo = F.col("__best").getField(v), F.col("__best").getField(o)
    wins = F.col("__best").isNull() | (F.col(v) > bv) | ((F.col(v) == bv) & (F.col(o) > bo))
    return joined.where(wins).drop("__best"), rows_in, conflicts


def _major_rows(spark: SparkSession, item: MergeItem) -> tuple[DataFrame, int]:
    """The partition's resolved rows (as of the item's ``as_of_us``, if set). Tombstones are kept (a replica
    must learn of the deletes, and a late merge must not resurrect the row) unless older than the item's
    cutoff, the table's tombstone grace."""
    from pyspark.sql import functions as F

    rows = file_frame(spark, item.visible, sch.schema_from_columns(dict(item.columns)))
    if item.as_of_us is not None:  # a failover's cut: the partition as it was at that instant
        rows = rows.where(F.col(sch.VERSION_COL) <= F.lit(item.as_of_us))
    latest = latest_rows(rows, item.primary_key)
    if item.tombstone_cutoff_us is not None:
        expired = F.col(sch.DELETED_COL) & (F.col(sch.VERSION_COL) < F.lit(item.tombstone_cutoff_us))
        latest = latest.where(~expired)
    return latest, _row_count(item.visible)


def _split_rows(spark: SparkSession, item: MergeItem) -> tuple[DataFrame, int]:
    """The source segment's rows inside the child's key range, as they are (each key occurs once)."""
    rows = file_frame(spark, item.incoming, sch.schema_from_columns(dict(item.columns)))
    return _in_range(rows, item), _row_count(item.incoming)


def _in_range(df: DataFrame, item: MergeItem) -> DataFrame:
    """Rows with ``partition_begin <= key < partition_end`` (None: unbounded); all rows without a key column."""
    if not item.partition_key:
        return df
    schema = sch.schema_from_columns(dict(item.columns))
    return in_key_range(df, schema, item.partition_key, item.partition_begin, item.partition_end)


def in_key_range(df: DataFrame, schema: pa.Schema, partition_key: str, begin: Any, end: Any) -> DataFrame:
    """Rows with ``begin <= partition_key < end``; bounds in JSON form (``core.keys``), None unbounded."""
    from pyspark.sql import functions as F

    dtype = schema.field(partition_key).type
    col = F.col(partition_key)
    if begin is not None:
        df = df.where(col >= F.lit(keys.decode(begin, dtype)))
    if end is not None:
        df = df.where(col < F.lit(keys.decode(end, dtype)))
    return df


def _item_rows(spark: SparkSession, item: MergeItem) -> tuple[DataFrame, int]:
    if item.kind == "split":
        return _split_rows(spark, item)
    return _major_rows(spark, item)


def _to_segment_table(df: DataFrame, schema: pa.Schema, primary_key: list[str]) -> pa.Table:
    target = sch.segment_schema(schema)
    table = df.select(*target.names).toArrow()
    table = table.cast(target) if table.schema != target else table
    return table.sort_by([(k, "ascending") for k in primary_key]).combine_chunks()
