"""Rows written to a user's file: atomic Parquet or CSV (formatting for people is in ``segrep.cli.format``)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from segrep.storage.atomic import atomic_local_write


def atomic_write_table(rows: pa.Table, path: Path, fmt: str) -> None:
    if fmt == "parquet":
        atomic_local_write(str(path), lambda tmp: pq.write_table(rows, tmp))
    else:
        atomic_local_write(str(path), lambda tmp: pacsv.write_csv(rows, tmp))
