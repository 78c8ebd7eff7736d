"""The Spark application whose loaded classes make the suite's class-data-sharing archive (tests/support/
jvm_start.py): a session, a DataFrame from Arrow, ``mapInArrow``, a shuffle and ``toArrow``, as the jobs do."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession


def _plus_one(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield pa.RecordBatch.from_arrays([pc.add(batch.column(0), 1)], names=["k"])


def main() -> None:
    spark = SparkSession.builder.getOrCreate()
    frame = spark.createDataFrame(pa.table({"k": pa.array(range(1000), pa.int64())}))
    moved = frame.mapInArrow(_plus_one, "k long").repartition(2, "k").orderBy("k")
    assert moved.toArrow().num_rows == 1000
    spark.stop()


if __name__ == "__main__":
    main()
