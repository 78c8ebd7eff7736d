"""Spark helpers: read a table at a site as a DataFrame, resolved with the same last-writer-wins rule.

PySpark is imported lazily so the package works without it; Spark jobs and notebooks call these. As in the
pyarrow reader, no file is read before the driver checked, from its footer, that it is the segment the catalog
names (segment id, table, partition, counts, ranges, size). The executors read the files through the sites'
own file systems and store options (``data.spark_files``), so any site the package reaches is readable, and
check each file again as they read it (``Site.read_checked``): the content checksum of its bytes, every page's
checksum, its row count and key and version ranges.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from segrep.catalog import Catalog
from segrep.config.stores import options_for
from segrep.core import schema as sch
from segrep.data.reader import PlacementFiles, expected_segment, placement_files, restore_advice
from segrep.data.spark_files import SegmentFile, segment_frame

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from segrep.catalog.queries import TableInfo


def read_dataframe(spark: SparkSession, catalog: Catalog, table: str, site: str | None = None) -> DataFrame:
    """The table's current rows at a site (default: the leaders) as a Spark DataFrame.

    Reads the visible segment files of every placement, applies placement key-range restrictions, and keeps
    per primary key the row with the highest (_version, _origin) unless it is a tombstone. CorruptSegmentError
    (before any Spark job) for a file whose footer or size is not the catalog's. Each site is opened with the
    store options the loaded definitions give it (``config.stores.options_for``): a process reading a site on
    an object store loads the definitions first.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    info, placements = placement_files(catalog, table, site)
    for pf in placements:
        with restore_advice(pf):
            for seg in pf.segments:
                pf.site.check_footer(seg.relpath, expected_segment(info, seg))
    frames = []
    for pf in placements:
        if not pf.segments:
            continue
        df = segment_frame(spark, _files(info, pf), info.schema)
        key = F.col(info.partition_key)
        lo, hi = info.decode_key(pf.key_begin), info.decode_key(pf.key_end)
        if lo is not None:
            df = df.where(key >= F.lit(lo))
        if hi is not None:
            df = df.where(key < F.lit(hi))
        frames.append(df)
    columns = list(info.schema.names)
    if not frames:
        from pyspark.sql.pandas.types import from_arrow_schema

        return spark.createDataFrame([], from_arrow_schema(info.schema))
    rows = frames[0]
    for df in frames[1:]:
        rows = rows.unionByName(df)
    order = Window.partitionBy(*info.primary_key).orderBy(F.col(sch.VERSION_COL).desc(), F.col(sch.ORIGIN_COL).desc())
    ranked = rows.withColumn("__rank", F.row_number().over(order))
    return ranked.where((F.col("__rank") == 1) & ~F.col(sch.DELETED_COL)).select(*columns)


def _files(info: TableInfo, pf: PlacementFiles) -> list[SegmentFile]:
    """The placement's files as the executors read them: its site's options, each file's catalog entry."""
    options = options_for(pf.site.name, pf.site.uri)
    key = tuple(info.primary_key)
    versions = info.versions
    return [
        SegmentFile(pf.site.name, pf.site.uri, options, seg.relpath, expected_segment(info, seg), key, versions)
        for seg in pf.segments
    ]
