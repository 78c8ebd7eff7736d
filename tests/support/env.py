"""Test environments: definitions files, catalogs on SQLite and PostgreSQL, and a ready-made environment
(definitions file, sites, migrated and applied catalog). The fixtures that build them are in tests/conftest.py."""

from __future__ import annotations

import atexit
import shutil
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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

OUTAGE_YAML = ORDERS_YAML.replace(
    "    replicas: [dr, edge]\n", "    replicas: [dr, edge]\n    policy: {retry_delay_s: 0}\n"
)

# `events` with `on_return: merge` (the old leader's lost rows merged into the new leader on its return), no back-off.
MERGE_YAML = ORDERS_YAML.replace(
    "    replicas: [dr, edge]\n", "    replicas: [dr, edge]\n    policy: {on_return: merge, retry_delay_s: 0}\n"
)

# ORDERS_YAML with links (DESIGN section 17): primary <-> dr capped at 20 MB/s on weekdays 08:00-20:00 UTC,
# unlimited at weekends, 200 MB/s otherwise, 4 copies at once; dr -> edge (one way) at 5 MiB/s all the time.
LINKS_YAML = (
    ORDERS_YAML
    + """links:
  - between: [primary, dr]
    max_bytes_per_second: 200MB
    max_concurrent_copies: 4
    windows:
      - {days: weekdays, from: "08:00", to: "20:00", max_bytes_per_second: 20MB}
      - {days: weekends, from: "00:00", to: "24:00", max_bytes_per_second: unlimited}
  - from: dr
    to: edge
    max_bytes_per_second: 5 MiB
"""
)

# The model-based tests' table: `kv`, int key, two partitions (split at 5), replicated primary -> dr, edge.
KV_YAML = """
data_dir: data
sites:
  primary: {id: 1, uri: sites/primary}
  dr: {id: 2, uri: sites/dr}
  edge: {id: 3, uri: sites/edge}
tables:
  kv:
    columns: {k: int64, v: string}
    primary_key: [k]
    split_points: [5]
    leader: primary
    replicas: [dr, edge]
    policy: {retry_delay_s: 0}
"""


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


_MIGRATED: list[Path] = []  # this process's migrated, empty SQLite catalog (made once, copied per environment)


def migrated_sqlite(database: Path) -> None:
    """``database`` becomes a catalog migrated to the head revision: a copy of one this process migrated with
    ``upgrade`` (the migrations still run, once per test process, not once per test)."""
    from segrep.catalog import Catalog
    from segrep.catalog.migrate import upgrade

    if not _MIGRATED:
        folder = tempfile.mkdtemp(prefix="segrep-migrated-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        template = Path(folder) / "catalog.db"
        catalog = Catalog(f"sqlite:///{template}")
        upgrade(catalog)
        catalog.dispose()
        _MIGRATED.append(template)
    database.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_MIGRATED[0], database)
    with sqlite3.connect(database) as conn:  # each catalog has its own identity, as migration 0009 makes it
        conn.execute(
            "UPDATE catalog_identity SET catalog_uuid = ?, created_us = ?", (uuid.uuid4().hex, time.time_ns() // 1000)
        )
    conn.close()


def make_env(root: Path, url: str, yaml_text: str = ORDERS_YAML, apply: bool = True) -> Env:
    from segrep.catalog.apply import apply_definitions
    from segrep.catalog.engine import sqlite_file
    from segrep.catalog.migrate import upgrade

    config = root / "segrep.yaml"
    config.write_text(yaml_text)
    env = Env(root=root, config=config, url=url)
    database = sqlite_file(url)
    if database is not None and not database.exists():
        migrated_sqlite(database)
    else:
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
