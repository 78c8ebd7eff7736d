"""Spark job: read a segrep table at a site (last writer wins) and write it as Parquet, or print its count.

Thin entry point for spark-submit; the logic is segrep.data.spark_reader.read_dataframe. The definitions file is
loaded (if there is one) for the sites' store options: a site on an object store is read with its endpoint and
credentials reference, the secrets from this application's environment.
    spark-submit spark_jobs/read_table.py --catalog sqlite:///data/catalog.db orders --site dr --output /tmp/dr
"""

from __future__ import annotations

import argparse
import re
import sys

from segrep.catalog import Catalog
from segrep.config.definitions import config_path, load_definitions
from segrep.core.errors import SegrepError
from segrep.data.spark_reader import read_dataframe
from segrep.spark.lifecycle import die_with_parent

# A file an executor found damaged: the reader's own error, raised in the Python worker (data.spark_files)
_EXECUTOR_CORRUPT = re.compile(
    r"CorruptSegmentError: (site (\S+): segment file \S+ is not segment \S+ of (\S+) partition [^\n]*)"
)


def damaged_page_message(exc: BaseException) -> str | None:
    """One line naming the file and the repair that restores it (as ``data.reader.restore_advice`` says it),
    for a Spark failure that is a damaged file (the driver checked every footer before; content checksums,
    pages, row counts and ranges are checked where the files are read, on the executors); else None."""
    found = _EXECUTOR_CORRUPT.search(str(exc))
    if found is None:
        return None
    line, site, table = found.group(1).strip(), found.group(2), found.group(3)
    return f"{line}; run `segrep repair {table} --site {site}` to fetch it again from an intact copy"


def load_sites(explicit: str | None) -> None:
    """Load the definitions (``--config``, else SEGREP_CONFIG or the default path if that file exists), so each
    site is opened with its store options; a catalog of local sites needs none."""
    if explicit is not None or config_path().exists():
        load_definitions(explicit, isolate_tables=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--catalog", required=True, help="catalog SQLAlchemy URL")
    ap.add_argument("--config", default=None, help=f"definitions file (default: {config_path()}, if it exists)")
    ap.add_argument("table")
    ap.add_argument("--site", default=None, help="site to read (default: each partition's leader)")
    ap.add_argument("--output", default=None, help="Parquet directory to write (overwritten); default: print count")
    args = ap.parse_args(argv)
    try:
        load_sites(args.config)
    except SegrepError as exc:
        print(f"segrep: error: {exc}", file=sys.stderr)
        return 2

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(f"segrep-read-{args.table}").getOrCreate()
    try:
        catalog = Catalog(args.catalog)
        catalog.require_initialized()
        df = read_dataframe(spark, catalog, args.table, args.site)
        if args.output:
            df.write.mode("overwrite").parquet(args.output)
            print(f"wrote {args.table} at {args.site or 'the leaders'} to {args.output}")
        else:
            print(f"{df.count()} row(s) in {args.table} at {args.site or 'the leaders'}")
    except SegrepError as exc:
        print(f"segrep: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a Spark failure: a damaged file is the user's to repair, anything else is not
        message = damaged_page_message(exc)
        if message is None:
            raise
        print(f"segrep: error: {message}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    die_with_parent()  # the driver goes when its JVM does (a killed segrep kills the JVM)
    raise SystemExit(main())
