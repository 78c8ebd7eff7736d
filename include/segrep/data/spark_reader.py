"""Spark helpers: read a table at a site as a DataFrame, resolved with the same last-writer-wins rule.

PySpark is imported lazily so the package works without it; Spark jobs and notebooks call these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from segrep.catalog import Catalog
from segrep.core import schema as sch
from segrep.data.reader import placement_files

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def read_dataframe(spark: SparkSession, catalog: Catalog, table: str, site: str | None = None) -> DataFrame:
    """The table's current rows at a site (default: the leaders) as a Spark DataFrame.

    Reads the visible segment files of every placement, applies placement key-range restrictions, and keeps
    per primary key the row with the highest (_version, _origin) unless it is a tombstone.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    info, placements = placement_files(catalog, table, site)
    frames = []
    for pf in placements:
        paths = [pf.site.path(seg.relpath) for seg in pf.segments]
        if not paths:
            continue
        df = spark.read.parquet(*paths)
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
