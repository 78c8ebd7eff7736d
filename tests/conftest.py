"""Shared test set-up: hypothesis profiles (at least 200 examples per property), catalogs on SQLite and
PostgreSQL, and a ready-made environment (definitions file, sites, migrated and applied catalog).

PostgreSQL tests skip when no server answers, except in CI (CI=true), where they fail.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

PG_URL = os.environ.get("SEGREP_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() == "true"

ORDERS_YAML = """
data_dir: data
sites:
  primary: {id: 1, uri: sites/primary}
  dr: {id: 2, uri: sites/dr}
  edge: {id: 3, uri: sites/edge}
tables:
  orders:
    columns:
      o_orderkey: int64
      o_custkey: int64
      o_orderstatus: string
      o_totalprice: decimal(15,2)
      o_orderdate: date
      o_orderpriority: string
      o_clerk: string
      o_shippriority: int32
      o_comment: string
    primary_key: [o_orderkey]
    split_points: [150000, 300000, 450000]
    leader: primary
    replicas: [dr]
  events:
    columns: {tenant: string, seq: int64, payload: string, at: timestamp}
    primary_key: [tenant, seq]
    partition_key: tenant
    split_points: [m]
    leader: primary
    replicas: [dr, edge]
"""


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


def pg_schema_url(base_url: str) -> Iterator[str]:
    """A fresh schema on the test server, dropped afterwards; the URL puts it first on the search_path."""
    from sqlalchemy import create_engine, text

    schema = f"t_{uuid.uuid4().hex[:12]}"
    engine = create_engine(base_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{base_url}?options=-csearch_path%3D{schema}"
    finally:
        with engine.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def catalog_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL to an empty catalog database, on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/catalog.db"
    else:
        yield from pg_schema_url(request.getfixturevalue("pg_server"))


@dataclass
class Env:
    root: Path
    config: Path
    url: str

    @property
    def catalog(self):  # type: ignore[no-untyped-def]
        from segrep.catalog import Catalog

        if not hasattr(self, "_catalog"):
            self._catalog = Catalog(self.url)
        return self._catalog

    @property
    def defs(self):  # type: ignore[no-untyped-def]
        from segrep.config.definitions import load_definitions

        return load_definitions(self.config)

    def site_dir(self, name: str) -> Path:
        return self.root / "data" / "sites" / name


def make_env(root: Path, url: str, yaml_text: str = ORDERS_YAML, apply: bool = True) -> Env:
    from segrep.catalog.apply import apply_definitions
    from segrep.catalog.migrate import upgrade

    config = root / "segrep.yaml"
    config.write_text(yaml_text)
    env = Env(root=root, config=config, url=url)
    upgrade(env.catalog)
    if apply:
        apply_definitions(env.catalog, env.defs)
    return env


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/catalog.db"


def env_fixture(tmp_path: Path, url: str, yaml_text: str = ORDERS_YAML) -> Iterator[Env]:
    """The body of an environment fixture: ``make_env``, then the catalog disposed after the test."""
    e = make_env(tmp_path, url, yaml_text)
    yield e
    e.catalog.dispose()


@pytest.fixture
def env(catalog_url: str, tmp_path: Path) -> Iterator[Env]:
    """Definitions with tables `orders` (int key, 4 partitions) and `events` (composite string key, 2
    partitions, 3 sites), a migrated catalog, and `segrep apply` done."""
    yield from env_fixture(tmp_path, catalog_url)


@pytest.fixture
def sqlite_env(tmp_path: Path) -> Iterator[Env]:
    yield from env_fixture(tmp_path, sqlite_url(tmp_path))


OUTAGE_YAML = ORDERS_YAML.replace(
    "    replicas: [dr, edge]\n", "    replicas: [dr, edge]\n    policy: {retry_delay_s: 0}\n"
)


@pytest.fixture
def outage_env(catalog_url: str, tmp_path: Path) -> Iterator[Env]:
    """`env` with the events policy retrying at once (a test cannot wait out a back-off after an outage)."""
    assert OUTAGE_YAML != ORDERS_YAML
    yield from env_fixture(tmp_path, catalog_url, OUTAGE_YAML)
