"""Migrations: `segrep init` is idempotent, models and migrations agree, and downgrade/upgrade round-trips."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import select, text

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog.migrate import _config, upgrade
from segrep.catalog.models import Base
from segrep.catalog.revisions import current_revision, head_revision
from tests.support.badinput import assert_user_error, unchanged
from tests.support.cli import cli
from tests.support.env import Env
from tests.support.tables import orders


def test_init_twice_and_models_match_migrations(catalog_url: str) -> None:
    catalog = Catalog(catalog_url)
    assert not catalog.is_initialized()
    assert upgrade(catalog) == (None, head_revision())
    assert upgrade(catalog) == (head_revision(), head_revision())
    with catalog.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    catalog.require_initialized()
    catalog.dispose()


def test_downgrade_then_upgrade(catalog_url: str) -> None:
    catalog = Catalog(catalog_url)
    upgrade(catalog)
    cfg = _config()
    with catalog.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "base")
    assert current_revision(catalog) is None
    upgrade(catalog)
    assert current_revision(catalog) == head_revision()
    catalog.dispose()


@pytest.mark.parametrize("dropped", ["round_targets", "safe_times", "checkpoints"])
def test_a_catalog_missing_a_table_is_refused_before_a_round_copies(env: Env, dropped: str) -> None:
    """A round wrote its last tables after copying: with one dropped, it copied, committed the copies and
    stayed `running` for good. Now every command refuses the damaged catalog by name, before anything."""
    with env.catalog.write() as s:
        s.execute(text(f"DROP TABLE {dropped}"))
    pq.write_table(orders([1, 2, 200_000]), env.root / "in.parquet")
    for args in (["write", "orders", str(env.root / "in.parquet")], ["round", "orders"], ["status"], ["init"]):
        with unchanged(env, catalog=False):
            assert_user_error(*cli(env, *args), "is damaged", dropped, "backup")
    with env.catalog.read() as s:
        assert s.scalars(select(m.Round)).all() == [] and s.scalars(select(m.Segment)).all() == []


@pytest.mark.parametrize(
    ("table", "column"), [("segments", "key_min"), ("segments", "key_max"), ("partitions", "end_key")]
)
def test_a_damaged_json_value_is_named_by_table_row_and_column(sqlite_env: Env, table: str, column: str) -> None:
    """Before: `segrep: internal error: JSONDecodeError: Expecting value: line 1 column 4 (char 3)`."""
    env = sqlite_env
    pq.write_table(orders([1, 2, 200_000]), env.root / "in.parquet")
    assert cli(env, "write", "orders", str(env.root / "in.parquet"))[0] == 0
    with env.catalog.read() as s:
        segment = s.scalars(select(m.Segment).order_by(m.Segment.entry_id)).first()
        assert segment is not None
    env.catalog.dispose()
    row = {"segments": f"segment_id {segment.segment_id}", "partitions": f"partition_id {segment.partition_id}"}[table]
    with sqlite3.connect(env.root / "catalog.db") as conn:
        conn.execute(f"UPDATE {table} SET {column} = '[1,' WHERE partition_id = ?", (segment.partition_id,))
    for args in (["read", "orders"], ["segments", "orders"], ["round", "orders"], ["table", "describe", "orders"]):
        with unchanged(env, catalog=False):
            line = assert_user_error(*cli(env, *args), "is damaged", f"{table}.{column} of the row", row, "'[1,'")
        assert "(table orders)" in line and "backup" in line, line
    with sqlite3.connect(env.root / "catalog.db") as conn:
        assert conn.execute("SELECT count(*) FROM rounds").fetchone() == (0,)  # the round stopped before starting


def test_checking_a_sqlite_catalog_never_opens_its_file_beside_sqlite(tmp_path: Path, monkeypatch) -> None:
    """Opening and closing the database file in a process that has it open through SQLite drops SQLite's POSIX
    locks on it (SQLite's own warning): a concurrent writer then corrupted the catalog ("database disk image is
    malformed" in tests/dags/test_backfill.py). The checks look at the file's size only."""
    import builtins
    import io

    from segrep.catalog.migrate import upgrade

    db = tmp_path / "catalog.db"
    catalog = Catalog(f"sqlite:///{db}")
    upgrade(catalog)
    opened: list[str] = []
    real_open = builtins.open

    def spying(file, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(file) == str(db):
            opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spying)
    monkeypatch.setattr(io, "open", spying)
    catalog.require_initialized()
    assert catalog.is_initialized() and opened == [], opened
    catalog.dispose()
