"""One local Spark session for the whole test run (JVM start-up is the expensive part)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("segrep-tests")
        .config("spark.ui.enabled", "false")  # no port to bind in CI
        .config("spark.sql.shuffle.partitions", "4")  # tiny test data: avoid 200 empty tasks
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    yield session
    session.stop()
