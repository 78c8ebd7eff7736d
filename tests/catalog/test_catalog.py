"""Migrations: `segrep init` is idempotent, models and migrations agree, and downgrade/upgrade round-trips."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from segrep.catalog import Catalog
from segrep.catalog.migrate import _config, current_revision, head_revision, upgrade
from segrep.catalog.models import Base


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
