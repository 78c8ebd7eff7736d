"""Spark job: write a Parquet input into a segrep table (upsert its rows, or delete its keys) in one commit.

Thin entry point for spark-submit (a SparkSubmitOperator); the logic is segrep.spark.dataframe_writer.
The segment files are written on the executors, the catalog commit is made here, in the driver: a failed or
killed job commits nothing. The definitions file is loaded (if there is one) for the sites' store options.
    spark-submit spark_jobs/write_dataframe.py --catalog sqlite:///data/catalog.db orders --input /in/orders \
        [--mode upsert|delete] [--site SITE] [--config segrep.yaml]
"""

from __future__ import annotations

import argparse
import os
import sys

from segrep.catalog import Catalog
from segrep.catalog import queries as q
from segrep.config.definitions import config_path, load_definitions
from segrep.core import hlc
from segrep.core.errors import SegrepError
from segrep.spark.dataframe_writer import WriteMode, write_dataframe
from segrep.spark.lifecycle import die_with_parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--catalog", required=True, help="catalog SQLAlchemy URL")
    ap.add_argument("--config", default=None, help=f"definitions file (default: {config_path()}, if it exists)")
    ap.add_argument("table")
    ap.add_argument("--input", required=True, help="Parquet file or directory holding the rows (or the keys)")
    ap.add_argument("--mode", choices=[m.value for m in WriteMode], default=WriteMode.UPSERT.value)
    ap.add_argument("--site", default=None, help="site to write at (default: each partition's leader)")
    args = ap.parse_args(argv)  # a bad argument: usage and exit 2
    try:
        if "://" not in args.input and not os.path.exists(args.input):
            raise SegrepError(f"input {args.input} does not exist")
        defs = None
        if args.config is not None or config_path().exists():
            defs = load_definitions(args.config, isolate_tables=True)  # the sites' store options
        catalog = Catalog(args.catalog)
        catalog.require_initialized()
        with catalog.read() as s:
            q.table_info(s, args.table)  # an unknown table: refused before Spark starts
    except SegrepError as exc:
        print(f"segrep: error: {exc}", file=sys.stderr)
        return 2

    from pyspark.errors import AnalysisException
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(f"segrep-write-{args.table}").getOrCreate()
    try:
        try:
            df = spark.read.parquet(args.input)
        except AnalysisException as exc:
            raise SegrepError(f"input {args.input} cannot be read as Parquet: {str(exc).splitlines()[0]}") from None
        result = write_dataframe(df, args.table, args.mode, catalog=catalog, site=args.site, defs=defs)
    except SegrepError as exc:
        print(f"segrep: error: {exc}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
        catalog.dispose()
    when = hlc.iso(result.committed_us) if result.committed_us is not None else "nothing to commit"
    what = "deleted the keys of" if result.deleted else "upserted"
    print(
        f"{what} {result.rows_in} input row(s) into {args.table}: {result.rows_written} row(s) in "
        f"{len(result.segments)} segment(s), committed {when}"
    )
    return 0


if __name__ == "__main__":
    die_with_parent()  # the driver goes when its JVM does (a killed segrep kills the JVM)
    sys.exit(main())
