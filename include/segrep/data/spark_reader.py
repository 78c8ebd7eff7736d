"""Spark helpers: read a table at a site as a DataFrame, resolved with the same last-writer-wins rule.

PySpark is imported lazily so the package works without it; Spark jobs and notebooks call these. As in the
pyarrow reader, no file is read before the driver checked, from its footer, that it is the segment the catalog
names (segment id, table, partition, counts, ranges, size); the executors verify every page's checksum.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from segrep.catalog import Catalog
from segrep.core import schema as sch
from segrep.data.reader import expected_segment, placement_files, restore_advice

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# parquet-java's switch for verifying the CRC of every page it reads (segrep writes one into each page header)
VERIFY_PAGE_CHECKSUMS = "parquet.page.verify-checksum.enabled"


def read_dataframe(spark: SparkSession, catalog: Catalog, table: str, site: str | None = None) -> DataFrame:
    """The table's current rows at a site (default: the leaders) as a Spark DataFrame.

    Reads the visible segment files of every placement, applies placement key-range restrictions, and keeps
    per primary key the row with the highest (_version, _origin) unless it is a tombstone. CorruptSegmentError
    (before any Spark job) for a file whose footer or size is not the catalog's.
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
        paths = [pf.site.path(seg.relpath) for seg in pf.segments]
        if not paths:
            continue
        df = spark.read.option(VERIFY_PAGE_CHECKSUMS, "true").parquet(*paths)
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
