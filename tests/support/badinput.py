"""Checks every bad-input test makes: a clean one-line user error (exit 2, no traceback, no "internal
error"), and nothing written: the catalog's rows and every file under the environment's root (sites, work
directory, definitions) are the same before and after."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import select

from segrep.catalog.models import Base
from tests.support.env import Env

# The SQLite catalog's own files change when a reader merely opens them (WAL, checkpoints); the catalog is
# compared by its rows instead.
_CATALOG_FILES = ("catalog.db", "catalog.db-wal", "catalog.db-shm", "catalog.db-journal")


def assert_user_error(code: int, out: str, err: str, *needles: str) -> str:
    """The command failed as bad input should: exit code 2, one line on stderr naming the problem (each of
    ``needles``, case-insensitive), no traceback and no "internal error". Returns the line."""
    assert code == 2, f"exit {code}, want 2; stdout={out!r} stderr={err!r}"
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"want one line on stderr, got {lines!r}"
    line = lines[0]
    assert line.startswith("segrep: error: "), line
    assert "Traceback" not in err and "internal error" not in err, err
    for needle in needles:
        assert needle.lower() in line.lower(), f"{needle!r} not named in {line!r}"
    return line


def tree_state(root: Path) -> dict[str, str]:
    """Every file and directory under ``root`` (catalog database files aside), with file hashes."""
    state: dict[str, str] = {}
    if not root.exists():
        return state
    for p in sorted(root.rglob("*")):
        if p.name in _CATALOG_FILES:
            continue
        rel = str(p.relative_to(root))
        state[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return state


def catalog_rows(env: Env) -> dict[str, list[str]]:
    """Every row of every catalog table, as text, sorted."""
    with env.catalog.read() as s:
        return {t.name: sorted(map(repr, s.execute(select(t)).all())) for t in Base.metadata.sorted_tables}


@contextmanager
def unchanged(env: Env, *, catalog: bool = True) -> Iterator[None]:
    """Assert that the block changes no catalog row and no file or directory under the environment's root."""
    rows_before = catalog_rows(env) if catalog else {}
    files_before = tree_state(env.root)
    yield
    files_after = tree_state(env.root)
    added = sorted(set(files_after) - set(files_before))
    removed = sorted(set(files_before) - set(files_after))
    changed = sorted(k for k in files_before.keys() & files_after.keys() if files_before[k] != files_after[k])
    assert not (added or removed or changed), f"files added {added}, removed {removed}, changed {changed}"
    if catalog:
        assert catalog_rows(env) == rows_before, "the catalog changed"
