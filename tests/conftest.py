"""Shared test set-up: hypothesis profiles (at least 200 examples per property), the fixtures every test can
use (catalogs on SQLite and PostgreSQL, ready-made environments, one local Spark session), and the markers
the infrastructure a test needs implies. The helpers behind the fixtures live in tests/support/.

A test that needs PostgreSQL or Spark is marked ``postgres`` or ``spark`` (``pytest -m "not spark"`` leaves it
out): explicitly, through the ``catalog_url`` fixture's PostgreSQL parameter, or because it asks for the
``pg_server`` or ``spark`` fixture (marked here at collection). PostgreSQL tests skip when no server answers,
except in CI (CI=true), where they fail; Spark tests never skip.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from segrep.spark.merge_runner import ENGINE_ENV
from segrep.storage import throttle
from segrep.storage.stores import set_connection_resolver
from tests.support.env import ORDERS_YAML, OUTAGE_YAML, Env, env_fixture, make_env, pg_schema_url, sqlite_url
from tests.support.jvm_start import JvmArchive, speed_up_jvm_start
from tests.support.s3 import S3Endpoint, s3_events_yaml, start_s3_endpoints, use_site_keys
from tests.support.spark_cluster import SparkCluster, start_spark_cluster

settings.register_profile("ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

PG_URL = os.environ.get("SEGREP_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() == "true"

# A test asking for one of these fixtures needs that infrastructure: it gets the marker.
MARKER_OF_FIXTURE = {"pg_server": "postgres", "spark": "spark", "spark_cluster": "spark"}
JVM_ARCHIVE = pytest.StashKey[JvmArchive | None]()


def pytest_configure(config: pytest.Config) -> None:
    """Once per run, in the process that starts the others (xdist's controller, or the only one): the archive
    that halves every Spark JVM's start-up (tests/support/jvm_start.py); workers inherit SPARK_SUBMIT_OPTS.
    In every process: py4j's INFO lines off. It closes its connections when they are collected, at a worker's
    exit, and says so at INFO into a stream pytest has closed by then ("--- Logging error ---" and a stack in
    the run's output); its warnings and errors still show."""
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if not hasattr(config, "workerinput"):
        config.stash[JVM_ARCHIVE] = speed_up_jvm_start()


def pytest_unconfigure(config: pytest.Config) -> None:
    dump = config.stash.get(JVM_ARCHIVE, None)
    if dump is not None:
        dump.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, marker in MARKER_OF_FIXTURE.items():
            if fixture in getattr(item, "fixturenames", ()) and item.get_closest_marker(marker) is None:
                item.add_marker(getattr(pytest.mark, marker))
    items[:] = longest_files_first(items)


def longest_files_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The files with ``slow`` tests first, then those with Spark tests, then the rest, each file's tests kept
    together and in order. ``make test`` hands out whole files to two workers in this order
    (``--dist loadfile --no-loadscope-reorder``), so a minutes-long file starts early instead of being the
    last one left running while the other worker idles."""
    rank: dict[Path, int] = {}
    for item in items:
        weight = 0 if item.get_closest_marker("slow") else 1 if item.get_closest_marker("spark") else 2
        rank[item.path] = min(weight, rank.get(item.path, weight))
    return sorted(items, key=lambda item: rank[item.path])  # a stable sort: collection order within a rank


@pytest.fixture(autouse=True)
def outside_airflow() -> Iterator[None]:
    """Each test starts outside Airflow: a task run in this process (``dag.test``) makes the process resolve
    sites' ``airflow_conn_id`` credentials through Airflow, as a task process does, and that stays set."""
    yield
    set_connection_resolver(None)


@pytest.fixture(autouse=True)
def own_request_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's sites get their own request buckets (``storage.throttle``): the paced limits an earlier test
    made in this process belong to another deployment's sites of the same names, which a CLI command's request
    sharing would otherwise join in this test's catalog (a process serves one deployment)."""
    monkeypatch.setattr(throttle, "_limits", {})


def _pg_reachable() -> str | None:
    from sqlalchemy import create_engine, text

    try:
        engine = create_engine(PG_URL)
        with engine.connect() as conn:
            conn.execute(text("select 1"))
        engine.dispose()
        return None
    except Exception as exc:  # any driver error means: no usable server
        return str(exc).splitlines()[0]


@pytest.fixture(scope="session")
def pg_server() -> str:
    problem = _pg_reachable()
    if problem is not None:
        message = f"PostgreSQL at {PG_URL} is not reachable: {problem}"
        if IN_CI:
            pytest.fail(message + " (CI=true: PostgreSQL tests must run)")
        pytest.skip(message)
    return PG_URL


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def catalog_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL to an empty catalog database, on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/catalog.db"
    else:
        yield from pg_schema_url(request.getfixturevalue("pg_server"))


@pytest.fixture
def env(catalog_url: str, tmp_path: Path) -> Iterator[Env]:
    """Definitions with tables `orders` (int key, 4 partitions) and `events` (composite string key, 2
    partitions, 3 sites), a migrated catalog, and `segrep apply` done."""
    yield from env_fixture(tmp_path, catalog_url)


@pytest.fixture
def pg_definitions() -> str:
    """The definitions file ``pg_env`` holds: ORDERS_YAML unless a module overrides this fixture."""
    return ORDERS_YAML


@pytest.fixture
def pg_env(pg_server: str, pg_definitions: str, tmp_path: Path) -> Iterator[Env]:
    """An environment on PostgreSQL only (a fresh schema, dropped afterwards) with ``pg_definitions``, migrated
    and applied: for the long end-to-end runs, which run once, on the catalog production uses."""
    for url in pg_schema_url(pg_server):
        yield from env_fixture(tmp_path, url, pg_definitions)


@pytest.fixture
def sqlite_env(tmp_path: Path) -> Iterator[Env]:
    yield from env_fixture(tmp_path, sqlite_url(tmp_path))


@pytest.fixture
def outage_env(catalog_url: str, tmp_path: Path) -> Iterator[Env]:
    """`env` with the events policy retrying at once (a test cannot wait out a back-off after an outage)."""
    assert OUTAGE_YAML != ORDERS_YAML
    yield from env_fixture(tmp_path, catalog_url, OUTAGE_YAML)


@pytest.fixture(scope="session")
def s3_endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[S3Endpoint, S3Endpoint]]:
    """Two S3-compatible servers on loopback (moto), two regions with their own keys, for the whole run."""
    yield from start_s3_endpoints(tmp_path_factory.mktemp("moto"))


@pytest.fixture
def s3_env(
    s3_endpoints: tuple[S3Endpoint, S3Endpoint], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Env]:
    """`events` with `primary` local, `dr` on S3 endpoint a and `edge` on endpoint b (SQLite catalog, applied);
    each site's keys only in its own DR_S3_* / EDGE_S3_* variables, no AWS_* variable set."""
    a, b = s3_endpoints
    use_site_keys(monkeypatch, DR_S3=a, EDGE_S3=b)
    yield make_env(tmp_path, sqlite_url(tmp_path), s3_events_yaml(a, b, uuid.uuid4().hex[:12]))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session for the whole test run (JVM start-up is the expensive part)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Python workers (verify's digests) import segrep
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


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A standalone master and one worker (tests/support/spark_cluster.py) for the module that asks for it,
    stopped (process groups killed) after it."""
    yield from start_spark_cluster(tmp_path_factory.mktemp("spark-cluster"))


@pytest.fixture
def merge_on_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """Merges run as the Spark job even when small (tests about the Spark job: small ones would run in process)."""
    monkeypatch.setenv(ENGINE_ENV, "spark")
