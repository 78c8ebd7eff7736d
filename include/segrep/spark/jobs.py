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

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from segrep.core import keys
from segrep.core import schema as sch
from segrep.core.projection import ReadVersions
from segrep.data.spark_files import segment_frame
from segrep.spark.conflicts import Conflict, merge_conflicts
from segrep.spark.manifest import FileRef, Manifest, MergeItem, segment_files
from segrep.spark.merge_items import ItemRows, MergeEngine, row_count, run_items

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# -- the Spark side -------------------------------------------------------------------------------------------


def run_manifest(spark: SparkSession, manifest: Manifest) -> dict[str, Any]:
    """Execute every item; return the result document the commit step records (``spark.merge_items``)."""
    return run_items(manifest, MergeEngine.SPARK, lambda item: _item_rows(spark, item))


def _item_rows(spark: SparkSession, item: MergeItem) -> ItemRows:
    schema = sch.schema_from_columns(dict(item.columns))
    if item.kind == "merge":
        df, rows_in, conflicts = _merge_rows(spark, item)
        return ItemRows(_to_arrow(df, schema), rows_in, conflicts)
    df, rows_in = _split_rows(spark, item) if item.kind == "split" else _major_rows(spark, item)
    return ItemRows(_to_arrow(df, schema), rows_in)


def file_frame(
    spark: SparkSession,
    refs: list[FileRef],
    schema: pa.Schema,
    versions: ReadVersions,
    columns: list[str] | None = None,
) -> DataFrame:
    """The files' unresolved rows, read on the executors from each file's site with the manifest's options,
    each projected to ``versions.target`` there (``schema`` is that version's)."""
    return segment_frame(spark, segment_files(refs, versions), schema, columns)


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
    incoming_all = _in_range(file_frame(spark, item.incoming, schema, item.versions), item)
    rows_in = row_count(item.incoming)
    incoming = latest_rows(incoming_all, item.primary_key)
    if not item.visible:
        return incoming, rows_in, merge_conflicts(incoming_all, incoming, None, item.primary_key, item.origin_forks)
    v, o = sch.VERSION_COL, sch.ORIGIN_COL
    best = (
        file_frame(spark, item.visible, schema, item.versions, [*item.primary_key, v, o])
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

    rows = file_frame(spark, item.visible, sch.schema_from_columns(dict(item.columns)), item.versions)
    if item.as_of_us is not None:  # a failover's cut: the partition as it was at that instant
        rows = rows.where(F.col(sch.VERSION_COL) <= F.lit(item.as_of_us))
    latest = latest_rows(rows, item.primary_key)
    if item.tombstone_cutoff_us is not None:
        expired = F.col(sch.DELETED_COL) & (F.col(sch.VERSION_COL) < F.lit(item.tombstone_cutoff_us))
        latest = latest.where(~expired)
    return latest, row_count(item.visible)


def _split_rows(spark: SparkSession, item: MergeItem) -> tuple[DataFrame, int]:
    """The source segment's rows inside the child's key range, as they are (each key occurs once)."""
    rows = file_frame(spark, item.incoming, sch.schema_from_columns(dict(item.columns)), item.versions)
    return _in_range(rows, item), row_count(item.incoming)


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


def _to_arrow(df: DataFrame, schema: pa.Schema) -> pa.Table:
    """The output rows, collected to the driver as Arrow (``merge_items.segment_table`` orders them)."""
    return df.select(*sch.segment_schema(schema).names).toArrow()
