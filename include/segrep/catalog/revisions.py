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
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sqlalchemy import column, inspect, select, table
from sqlalchemy.engine import Engine

VERSIONS = Path(__file__).parent / "migrations" / "versions"
VERSION_TABLE = "alembic_version"  # alembic's default, which catalog.migrate keeps
_NAMES = ("revision", "down_revision")


class HasEngine(Protocol):
    """What reading a catalog's revision needs: its engine (the engine module imports this one)."""

    @property
    def engine(self) -> Engine: ...


@dataclass(frozen=True)
class Revisions:
    """This segrep's migrations: each revision and those it follows (none for the first; several for a merge)."""

    follows: dict[str, tuple[str, ...]]

    @property
    def head(self) -> str:
        """The one revision no other follows (the migrations end in a single head, as ``segrep init`` needs)."""
        followed = {r for downs in self.follows.values() for r in downs}
        heads = set(self.follows) - followed
        if len(heads) != 1:
            raise RuntimeError(f"the migrations have {len(heads)} heads, not one: {sorted(heads)}")
        return heads.pop()


@functools.cache
def revisions() -> Revisions:
    """This package's migrations, read once a process."""
    return read_revisions(VERSIONS)


def read_revisions(directory: Path) -> Revisions:
    """Each migration file's top-level ``revision`` and ``down_revision`` assignments (annotated or not; a
    merge's tuple), in the files alembic reads: ``*.py`` but ``__init__`` and editor lock files."""
    follows: dict[str, tuple[str, ...]] = {}
    for path in sorted(directory.glob("*.py")):
        if path.name == "__init__.py" or path.name.startswith(".#"):
            continue
        found = _assignments(path)
        revision, down = found.get("revision"), found.get("down_revision", ())
        if not isinstance(revision, str) or "down_revision" not in found:
            raise RuntimeError(f"migration {path.name} does not say its revision and down_revision")
        if down is None:
            follows[revision] = ()
        elif isinstance(down, str):
            follows[revision] = (down,)
        elif isinstance(down, tuple | list) and all(isinstance(d, str) for d in down):
            follows[revision] = tuple(down)
        else:
            raise RuntimeError(f"migration {path.name}: down_revision {down!r} is not a revision id or a tuple of them")
    return Revisions(follows)


def _assignments(path: Path) -> dict[str, object]:
    """The module-level ``revision`` and ``down_revision`` values of a migration file, as literals."""
    out: dict[str, object] = {}
    for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in _NAMES:
            out[target.id] = ast.literal_eval(value)
    return out


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
