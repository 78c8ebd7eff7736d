"""Segment files as a Spark DataFrame, read on the executors through the package's own file systems.

Spark's Parquet reader opens paths through Hadoop's file systems, which know nothing of a site's endpoint,
options or credentials (an ``s3://`` site would need Hadoop connectors and keys in Spark's conf). Instead a
small DataFrame holds one row per file (its index, one file per task) and ``mapInArrow`` opens each file as
``storage.site.Site`` with the site's store options and yields its Arrow batches: Spark reads whatever site
the package can reach. Credentials travel by reference only (the options name an environment prefix); the
executors read the variables from the environment the application inherited. Every page's checksum is
verified by the read (``Site.read_segment``); a file whose catalog entry is known is also checked against it
(``Site.read_checked``: the content checksum of its bytes, read once, its footer entry, its rows' count and
ranges). PySpark is imported lazily: the package works without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from segrep.config.stores import StoreOptions
from segrep.core import schema as sch
from segrep.core.projection import ReadVersions
from segrep.storage.live_rates import follower
from segrep.storage.pacing import LINK_BURST_S, FollowingPacer, Pacer
from segrep.storage.segment_meta import ExpectedSegment
from segrep.storage.site import Site

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass(frozen=True)
class SegmentFile:
    """One segment file for an executor to read: its site (name, URI, store options) and path, and, where the
    catalog's entry is known, what the file must be (checked on the read)."""

    site: str
    uri: str
    options: StoreOptions
    relpath: str
    expected: ExpectedSegment | None = None
    primary_key: tuple[str, ...] = ()
    versions: ReadVersions | None = None  # project the file to ``versions.target`` (``core.projection``)
    byte_size: int = 0
    bytes_per_s: int | None = None  # a read across a defined link: its share, paid per chunk as it is read
    rate_file: str | None = None  # where that share is read again while the file is read (``storage.live_rates``)
    reader_site: str | None = None  # the link's other end (where the rows go): the rate file's entry is site -> it


def segment_frame(
    spark: SparkSession, files: Sequence[SegmentFile], schema: pa.Schema, columns: Sequence[str] | None = None
) -> DataFrame:
    """The rows of ``files`` in segment layout (table ``schema`` plus the internal columns; only ``columns``
    if given), unresolved, as one DataFrame whose Spark schema is the Arrow one converted by PySpark."""
    from pyspark.sql.pandas.types import from_arrow_schema

    target = sch.segment_schema(schema)
    if columns is not None:
        target = pa.schema([target.field(c) for c in columns])
    spark_schema = from_arrow_schema(target)
    if not files:
        return spark.createDataFrame([], spark_schema)
    refs = spark.range(0, len(files), 1, len(files))  # one row, one task per file: files are read in parallel
    return refs.mapInArrow(read_batches(list(files), target), spark_schema)


def read_batches(
    files: list[SegmentFile], target: pa.Schema
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: for each file index in the input, that file's rows as ``target``."""

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from read_file(files[index], target).to_batches()

    return read


def read_pacer(f: SegmentFile) -> Pacer | None:
    """The pacer of one file's read across a link: its share, followed in the rate file if it has one."""
    if f.rate_file is not None and f.reader_site is not None:
        return FollowingPacer(f.bytes_per_s or 0, follower(f.rate_file, f.site, f.reader_site))
    if f.bytes_per_s:
        return Pacer(f.bytes_per_s, burst_s=LINK_BURST_S)
    return None


def read_file(f: SegmentFile, target: pa.Schema) -> pa.Table:
    """One file's ``target`` columns, opened with its site's options (projected to ``f.versions.target`` if
    given: on the executors too); checked if its entry is known. A file read across a link is paced per chunk
    at its share, followed in its rate file (a cap lowered meanwhile slows the rest of the file)."""
    site = Site(f.site, f.uri, f.options)
    pace = read_pacer(f)
    if f.expected is None:
        rows = site.read_segment(f.relpath, target.names, f.versions, pace=pace)
    else:
        rows = site.read_checked(f.relpath, f.expected, f.primary_key, target.names, f.versions, pace=pace)
    rows = rows.select(target.names)
    return rows if rows.schema == target else rows.cast(target)
