"""The failover tests' environments: `events` with ``on_return: merge`` (the old leader's lost rows are merged
into the new leader when it returns), on both catalogs and on SQLite alone (the tests that also run Spark)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.env import MERGE_YAML, ORDERS_YAML, Env, env_fixture, sqlite_url


@pytest.fixture
def merge_env(catalog_url: str, tmp_path: Path) -> Iterator[Env]:
    """`events` with ``on_return: merge`` and no back-off, on SQLite and PostgreSQL."""
    assert MERGE_YAML != ORDERS_YAML
    yield from env_fixture(tmp_path, catalog_url, MERGE_YAML)


@pytest.fixture
def merge_sqlite_env(tmp_path: Path) -> Iterator[Env]:
    yield from env_fixture(tmp_path, sqlite_url(tmp_path), MERGE_YAML)
