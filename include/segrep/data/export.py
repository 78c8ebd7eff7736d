"""Output for people and files: aligned text tables, and atomic Parquet/CSV files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from segrep.storage.atomic import atomic_local_write


def format_rows(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned table (no borders) that reads well in a terminal and in a README."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    text = str(value)
    return text if len(text) <= 48 else text[:45] + "..."


def atomic_write_table(rows: pa.Table, path: Path, fmt: str) -> None:
    if fmt == "parquet":
        atomic_local_write(str(path), lambda tmp: pq.write_table(rows, tmp))
    else:
        atomic_local_write(str(path), lambda tmp: pacsv.write_csv(rows, tmp))
