"""Spark merge job: run a round's merge manifest, write the output segments and a result file.

Thin entry point for spark-submit; the logic is segrep.spark.jobs.run_manifest. The catalog is not touched here:
the round's commit task records the result file.
    spark-submit spark_jobs/merge.py --manifest M.json --result R.json
"""

from __future__ import annotations

import argparse
import sys

from segrep.spark.jobs import run_manifest
from segrep.spark.lifecycle import die_with_parent
from segrep.spark.manifest import Manifest
from segrep.storage.atomic import write_json_atomic


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", required=True, help="merge manifest written by the round's plan step")
    parser.add_argument("--result", required=True, help="where to write the result file")
    args = parser.parse_args(argv)
    manifest = Manifest.load(args.manifest)

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(f"segrep-merge-{manifest.round_key}").getOrCreate()
    try:
        write_json_atomic(args.result, run_manifest(spark, manifest))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    die_with_parent()  # the driver goes when its JVM does (a killed segrep kills the JVM)
    sys.exit(main())
