"""Spark verify job: digest each item of a verify run's manifest (large partitions), write a result file.

Thin entry point for spark-submit; the logic is segrep.spark.digest_job.run_digests. The catalog is not touched
here: ``segrep verify`` compares the digests and records the outcome.
    spark-submit spark_jobs/verify.py --manifest M.json --result R.json
"""

from __future__ import annotations

import argparse
import sys

from segrep.spark.digest_job import run_digests
from segrep.spark.digest_manifest import DigestManifest, write_outcomes
from segrep.spark.lifecycle import die_with_parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", required=True, help="digest manifest written by segrep verify")
    parser.add_argument("--result", required=True, help="where to write the result file")
    args = parser.parse_args(argv)
    manifest = DigestManifest.load(args.manifest)

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(f"segrep-verify-{manifest.key}").getOrCreate()
    try:
        write_outcomes(args.result, manifest.key, run_digests(spark, manifest))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    die_with_parent()  # the driver goes when its JVM does (a killed segrep kills the JVM)
    sys.exit(main())
