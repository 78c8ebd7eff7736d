"""Alembic migrations, run from code: ``segrep init`` upgrades to head and is safe to run again."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from segrep.catalog.revisions import HasEngine, current_revision

MIGRATIONS = Path(__file__).parent / "migrations"


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def upgrade(catalog: HasEngine, revision: str = "head") -> tuple[str | None, str]:
    """Upgrade the catalog schema; return (revision before, revision after). A SQLite catalog's directory
    is created here, by ``segrep init``, and by nothing else."""
    database = catalog.engine.url.database
    if catalog.engine.url.get_backend_name() == "sqlite" and database and database != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    before = current_revision(catalog)
    cfg = _config()
    with catalog.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
    return before, current_revision(catalog) or ""
