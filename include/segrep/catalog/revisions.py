"""The catalog schema's revisions, without alembic: which ones this segrep knows, its head, and a catalog's own.

Every command that opens a catalog checks its revision (``Catalog.require_initialized``). Asking alembic for it
imported alembic and loaded every migration module: about 0.4 s of each ``segrep`` process, which the drills, the
DAG tasks and a user's shell all pay. The migrations' own ``revision`` and ``down_revision`` lines say the same
(tests/catalog/test_revisions.py checks this against alembic's script directory); ``segrep init`` still
migrates through alembic (``catalog.migrate``).
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sqlalchemy import column, inspect, select, table
from sqlalchemy.engine import Engine

VERSIONS = Path(__file__).parent / "migrations" / "versions"
VERSION_TABLE = "alembic_version"  # alembic's default, which catalog.migrate keeps
_ASSIGNMENT = re.compile(r"^(revision|down_revision)\s*(?::[^=\n]*)?=\s*(.+?)\s*$", re.MULTILINE)


class HasEngine(Protocol):
    """What reading a catalog's revision needs: its engine (the engine module imports this one)."""

    @property
    def engine(self) -> Engine: ...


@dataclass(frozen=True)
class Revisions:
    """This segrep's migrations: each revision and the one it follows (None for the first)."""

    follows: dict[str, str | None]

    @property
    def head(self) -> str:
        """The one revision no other follows (the migrations are a single line: the last one)."""
        heads = set(self.follows) - set(self.follows.values())
        if len(heads) != 1:
            raise RuntimeError(f"the migrations in {VERSIONS} have {len(heads)} heads, not one: {sorted(heads)}")
        return heads.pop()


@functools.cache
def revisions() -> Revisions:
    """Read once a process from the migration files' ``revision = "..."`` and ``down_revision = ...`` lines."""
    follows: dict[str, str | None] = {}
    for path in sorted(VERSIONS.glob("*.py")):
        found = {name: ast.literal_eval(value) for name, value in _ASSIGNMENT.findall(path.read_text())}
        if "revision" not in found or "down_revision" not in found:
            raise RuntimeError(f"migration {path.name} does not say its revision and down_revision")
        follows[found["revision"]] = found["down_revision"]
    return Revisions(follows)


def head_revision() -> str:
    return revisions().head


def known_revision(revision: str) -> bool:
    """True if ``revision`` is one of this package's migrations."""
    return revision in revisions().follows


def current_revision(catalog: HasEngine) -> str | None:
    """The catalog's revision as alembic recorded it; None before ``segrep init``. A version table holding
    several rows (damaged, or another tool's branches) reads as their sorted, comma-joined ids: a revision no
    segrep knows, refused by name."""
    with catalog.engine.connect() as conn:
        if not inspect(conn).has_table(VERSION_TABLE):
            return None
        versions = table(VERSION_TABLE, column("version_num"))
        found = sorted(conn.execute(select(versions.c.version_num)).scalars())
    return ",".join(found) if found else None
