"""Alembic migrations, run from code: ``segrep init`` upgrades to head and is safe to run again."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.engine import Engine

MIGRATIONS = Path(__file__).parent / "migrations"


class HasEngine(Protocol):
    """What migrations need of a catalog: its engine (the engine module imports this one, not the reverse)."""

    @property
    def engine(self) -> Engine: ...


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None, "no migrations found"
    return head


def known_revision(revision: str) -> bool:
    """True if ``revision`` is one of this package's migrations."""
    try:
        return ScriptDirectory.from_config(_config()).get_revision(revision) is not None
    except CommandError:
        return False


def current_revision(catalog: HasEngine) -> str | None:
    with catalog.engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


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
