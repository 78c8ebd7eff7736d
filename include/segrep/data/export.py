"""Rows written to a user's file: atomic Parquet or CSV (formatting for people is in ``segrep.cli.format``).

An export never lands on segrep's own state: the catalog database, a file under a site root or the work
directory, or the definitions file (a typo in ``-o`` once replaced the catalog). An existing file is replaced
only when the caller says so, and then atomically: a reader sees the old file or the new one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from sqlalchemy import select
from sqlalchemy.engine import make_url

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.config.definitions import Definitions
from segrep.core.errors import RefusedError, SegrepError
from segrep.storage.atomic import atomic_local_write
from segrep.storage.workdir import work_root

_SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal")


def protected_paths(catalog: Catalog, defs: Definitions | None) -> list[tuple[Path, str]]:
    """What an export must never write into, each with the name it is refused under: the SQLite catalog's
    files, every local site root, and (when the definitions are known) the work directory and the
    definitions file itself."""
    out: list[tuple[Path, str]] = []
    url = make_url(catalog.url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        out.extend((Path(url.database + suffix).resolve(), "the catalog database") for suffix in _SQLITE_SUFFIXES)
    with catalog.read() as s:
        for site in s.scalars(select(m.Site)):
            if "://" not in site.uri or site.uri.startswith("file://"):
                out.append((Path(site.uri.removeprefix("file://")).resolve(), f"site {site.name}'s storage"))
    if defs is not None:
        out.append((work_root(defs).resolve(), "the work directory"))
        out.append((defs.path.resolve(), "the definitions file"))
    return out


def check_output(path: Path, protected: Iterable[tuple[Path, str]], *, overwrite: bool) -> Path:
    """The resolved output path, or a RefusedError naming why ``path`` may not be written."""
    target = path.expanduser().resolve()  # follows symlinks: a link to the catalog is the catalog
    for root, what in protected:
        if target == root or target.is_relative_to(root):
            raise RefusedError(f"will not write {path}: it is {what} ({root}); choose another output file")
    if target.is_dir():
        raise RefusedError(f"will not write {path}: it is a directory")
    if target.exists() and not overwrite:
        raise RefusedError(f"{path} already exists; pass --overwrite to replace it")
    if not target.parent.is_dir():
        raise SegrepError(f"cannot write {path}: directory {target.parent} does not exist")
    if not os.access(target.parent, os.W_OK):
        raise SegrepError(f"cannot write {path}: directory {target.parent} is not writable")
    return target


def atomic_write_table(rows: pa.Table, path: Path, fmt: str) -> None:
    """Write ``rows`` to ``path`` (already checked with :func:`check_output`) through a temporary file."""
    try:
        if fmt == "parquet":
            atomic_local_write(str(path), lambda tmp: pq.write_table(rows, tmp))
        else:
            atomic_local_write(str(path), lambda tmp: pacsv.write_csv(rows, tmp))
    except OSError as exc:
        raise SegrepError(f"cannot write {path}: {exc.strerror or exc}") from None
