"""Spark distributed copy: fast-forward copies above the byte threshold, spread over the executors.

Thin entry point for spark-submit; each executor runs segrep.storage.transport.copy_one (copy, hash, verify,
rename), exactly what the in-process copier does. The result file lists each copy's outcome; the
fast-forward task commits the verified ones.
    spark-submit spark_jobs/distributed_copy.py --items ITEMS.json --result R.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from segrep.spark.lifecycle import die_with_parent
from segrep.storage.atomic import write_json_atomic
from segrep.storage.transport import CopyItem, copy_one


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", required=True, help="JSON list of copy items")
    parser.add_argument("--result", required=True, help="where to write the outcomes")
    args = parser.parse_args(argv)
    with open(args.items) as f:
        items = [CopyItem.from_doc(raw) for raw in json.load(f)]

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("segrep-copy").getOrCreate()
    try:
        rdd = spark.sparkContext.parallelize(items, max(1, len(items)))
        outcomes = rdd.map(copy_one).collect()
        write_json_atomic(args.result, [asdict(o) for o in outcomes])
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    die_with_parent()  # the driver goes when its JVM does (a killed segrep kills the JVM)
    sys.exit(main())
