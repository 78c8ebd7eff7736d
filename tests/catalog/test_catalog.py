"""Migrations: `segrep init` is idempotent, models and migrations agree, and downgrade/upgrade round-trips."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import select, text

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog.migrate import _config, current_revision, head_revision, upgrade
from segrep.catalog.models import Base
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
