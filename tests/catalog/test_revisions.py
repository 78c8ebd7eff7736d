"""The catalog's revisions as segrep reads them without alembic (``catalog.revisions``) are alembic's own."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from alembic.util import to_tuple

from segrep.catalog import Catalog
from segrep.catalog.migrate import _config, upgrade
from segrep.catalog.revisions import current_revision, head_revision, known_revision, read_revisions, revisions
from segrep.core.errors import SegrepError


def test_the_migration_files_say_what_alembic_says() -> None:
    script = ScriptDirectory.from_config(_config())
    assert head_revision() == script.get_current_head()
    assert revisions().follows == {r.revision: to_tuple(r.down_revision, default=()) for r in script.walk_revisions()}
    assert all(known_revision(r) for r in revisions().follows)
    assert not known_revision("9999") and not known_revision("")


def test_merges_annotations_and_files_alembic_skips(tmp_path: Path) -> None:
    """The forms alembic's own files take: annotated assignments, a merge's tuple (over several lines), a
    docstring that mentions the names; ``__init__.py`` and an editor's lock file are not migrations."""
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / ".#0003_x.py").write_text("not python")
    (tmp_path / "0001_a.py").write_text(
        '"""revision = 1"""\nrevision: str = "0001"\ndown_revision: str | None = None\n'
    )
    (tmp_path / "0002_b.py").write_text('revision = "0002a"  # a branch\ndown_revision = "0001"\n')
    (tmp_path / "0002_c.py").write_text('revision = "0002b"\ndown_revision = "0001"\n')
    (tmp_path / "0003_merge.py").write_text('revision = "0003"\ndown_revision = (\n    "0002a",\n    "0002b",\n)\n')
    found = read_revisions(tmp_path)
    assert found.follows == {"0001": (), "0002a": ("0001",), "0002b": ("0001",), "0003": ("0002a", "0002b")}
    assert found.head == "0003"
    (tmp_path / "0003_merge.py").unlink()
    with pytest.raises(RuntimeError, match="2 heads"):
        _ = read_revisions(tmp_path).head


def test_a_catalogs_revision_before_and_after_init(tmp_path: Path) -> None:
    catalog = Catalog(f"sqlite:///{tmp_path}/c.db")
    try:
        assert current_revision(catalog) is None
        upgrade(catalog)
        assert current_revision(catalog) == head_revision()
    finally:
        catalog.dispose()


def test_a_version_table_with_two_rows_is_a_revision_no_segrep_knows(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    catalog = Catalog(f"sqlite:///{db}")
    try:
        upgrade(catalog)
        with sqlite3.connect(db) as conn:
            conn.execute("INSERT INTO alembic_version (version_num) VALUES ('0001')")
        assert current_revision(catalog) == f"0001,{head_revision()}"
        with pytest.raises(SegrepError, match=r"schema revision '0001,\d+', which this segrep does not know"):
            catalog.require_initialized()
    finally:
        catalog.dispose()
