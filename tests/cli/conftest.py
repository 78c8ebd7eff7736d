"""The command-line tests' environments with `orders` written through ``segrep write``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import load_orders
from tests.support.env import Env


@pytest.fixture
def loaded(env: Env, tmp_path: Path) -> Env:
    """``env`` (SQLite and PostgreSQL) with four `orders` rows written through the command."""
    return load_orders(env, tmp_path)


@pytest.fixture
def loaded_sqlite(sqlite_env: Env, tmp_path: Path) -> Env:
    """``sqlite_env`` with four `orders` rows written through the command: for the tests that look at the
    catalog's database file."""
    return load_orders(sqlite_env, tmp_path)
