"""Reading segrep's published Iceberg tables as a user's engine would: pyiceberg's own SQL catalog opened on
the catalog database's URL (its own engine and connections, nothing of segrep's publisher reused), then a
scan, or DuckDB and polars through pyiceberg."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import load_catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table as IcebergTable


@contextmanager
def iceberg_catalog(url: str, **props: str) -> Iterator[SqlCatalog]:
    """The catalog a user points an engine at (``props``: an S3 site's endpoint and keys)."""
    cat = load_catalog("segrep", type="sql", uri=url, **props)
    assert isinstance(cat, SqlCatalog)
    try:
        yield cat
    finally:
        cat.engine.dispose()


def sort_keys(keys: Sequence[str]) -> list[tuple[str, str]]:
    return [(k, "ascending") for k in keys]


def scan(url: str, site: str, table: str, keys: Sequence[str], **props: str) -> pa.Table:
    """The rows of ``site``'s published ``table``, sorted by ``keys``."""
    with iceberg_catalog(url, **props) as cat:
        return cat.load_table((site, table)).scan().to_arrow().sort_by(sort_keys(keys))


def loaded(url: str, site: str, table: str, **props: str) -> tuple[IcebergTable, dict[str, Any]]:
    """The published table and its current snapshot's summary (its segrep.* properties)."""
    with iceberg_catalog(url, **props) as cat:
        tbl = cat.load_table((site, table))
        snap = tbl.current_snapshot()
        assert snap is not None and snap.summary is not None
        return tbl, dict(snap.summary.additional_properties)
