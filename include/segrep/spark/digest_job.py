"""Digests of large partitions on Spark, for ``segrep verify``: one application for every item of a verify run.

Every file is first checked (size and sha256, on the executors) against the catalog's row: an item with a bad
or unreachable file gets an error instead of a digest, and verify reads it in process, where the reader names
the problem. The other items are read (on the executors, through each site's file system and the manifest's
store options: ``spark.jobs.file_frame``) as one DataFrame tagged by item id, kept to versions <= each item's pin
and its key range, resolved per key by :func:`segrep.spark.jobs.latest_rows` (the rule of
``data.reader.resolve``), tombstones hidden; each Arrow batch is then digested by ``data.digest`` itself, cast
to the table's schema first, so a row hashes to the same bits here as in process, and the batch digests add
up (:func:`segrep.data.digest.combine`). PySpark is imported lazily: the package works without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import reduce
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from segrep.core import schema as sch
from segrep.core.errors import CorruptSegmentError
from segrep.data.digest import Digest, combine, table_digest
from segrep.spark.digest_manifest import DigestItem, DigestManifest, DigestOutcome
from segrep.spark.jobs import file_frame, in_key_range, latest_rows
from segrep.spark.manifest import FileRef

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ITEM_COL = "__item"
_PARTIAL_SCHEMA = "item string, rows long, hash_sum string"


def run_digests(spark: SparkSession, manifest: DigestManifest) -> list[DigestOutcome]:
    """Each item's digest, or why its files could not be read."""
    failed = _unverified(spark, manifest.items)
    good = [item for item in manifest.items if item.item_id not in failed]
    digests = _digests(spark, manifest, good) if good else {}
    return [
        DigestOutcome(i.item_id, None, failed[i.item_id])
        if i.item_id in failed
        else DigestOutcome(i.item_id, digests.get(i.item_id, Digest(0, 0)))
        for i in manifest.items
    ]


def check_file(ref: FileRef) -> str | None:
    """None if the file is the catalog's (size and sha256), else the problem in one line."""
    try:
        ref.open_site().verify(ref.relpath, ref.byte_size, ref.sha256)
    except (CorruptSegmentError, OSError) as exc:
        return str(exc)
    return None


def _unverified(spark: SparkSession, items: list[DigestItem]) -> dict[str, str]:
    """Item id -> the first problem among its files; every distinct file is hashed once, on the executors."""
    refs = list({(r.site, r.relpath): r for item in items for r in item.files}.values())
    if not refs:
        return {}
    problems = spark.sparkContext.parallelize(refs, min(len(refs), 64)).map(lambda r: (r, check_file(r))).collect()
    bad = {(ref.site, ref.relpath): problem for ref, problem in problems if problem is not None}
    out = {}
    for item in items:
        found = [bad[(r.site, r.relpath)] for r in item.files if (r.site, r.relpath) in bad]
        if found:
            out[item.item_id] = found[0]
    return out


def _item_rows(spark: SparkSession, manifest: DigestManifest, schema: pa.Schema, item: DigestItem) -> DataFrame:
    """The item's unresolved rows up to its pin and in its key range, tagged with its id."""
    from pyspark.sql import functions as F

    df = file_frame(spark, item.files, schema, manifest.versions)
    df = in_key_range(df, schema, manifest.partition_key, item.key_begin, item.key_end)
    return df.where(F.col(sch.VERSION_COL) <= F.lit(item.as_of_us)).withColumn(ITEM_COL, F.lit(item.item_id))


def _digests(spark: SparkSession, manifest: DigestManifest, items: list[DigestItem]) -> dict[str, Digest]:
    from pyspark.sql import functions as F

    schema = sch.schema_from_columns(dict(manifest.columns))
    frames = [_item_rows(spark, manifest, schema, item) for item in items if item.files]
    if not frames:
        return {}
    rows = reduce(lambda a, b: a.unionByName(b), frames)
    latest = latest_rows(rows, [ITEM_COL, *manifest.primary_key]).where(~F.col(sch.DELETED_COL))
    partial = latest.select(ITEM_COL, *schema.names).mapInArrow(batch_digests(schema), _PARTIAL_SCHEMA)
    parts: dict[str, list[Digest]] = {}
    for row in partial.collect():
        parts.setdefault(row["item"], []).append(Digest(row["rows"], int(row["hash_sum"], 16)))
    return {item_id: combine(ds) for item_id, ds in parts.items()}


def batch_digests(schema: pa.Schema) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: per batch and item, the ``data.digest`` digest of the batch's rows."""

    def digest_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows = pa.Table.from_batches([batch])
            tags = rows.column(ITEM_COL)
            for item_id in pc.unique(tags).to_pylist():
                mine = rows.filter(pc.equal(tags, item_id)).select(schema.names).cast(schema)
                d = table_digest(mine, schema.names)
                yield pa.RecordBatch.from_pydict(
                    {"item": [item_id], "rows": [d.rows], "hash_sum": [f"{d.hash_sum:032x}"]},
                    schema=pa.schema([("item", pa.string()), ("rows", pa.int64()), ("hash_sum", pa.string())]),
                )

    return digest_batches
