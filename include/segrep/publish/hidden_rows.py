"""Which rows of a site's files a published table hides: what ``segrep read --site`` does not serve.

A site serves, per primary key, the row with the highest ``(_version, _origin)`` among its visible files'
rows inside each placement's key range; a winning tombstone hides the key. The published table lists those
same files and hides every other row by position. The winners so far (the *index*) are kept with each
snapshot, so the next publication reads only the files added since: a new row that beats an old winner hides
it, a new row that loses is hidden, a new tombstone that wins is hidden itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from segrep.core import schema as sch
from segrep.data.reader import newest_first

FILE_COL = "_file"  # the row's file: its path under the site's root
POS_COL = "_pos"  # the row's position in its file (0-based, as Iceberg position deletes count)
_NEW_COL = "_new"
# a placement's key range, decoded (``core.keys.decode``): begin inclusive, end exclusive, None unbounded
KeyRange = tuple[Any, Any]


@dataclass(frozen=True)
class Resolution:
    """The winners after this publication, and the positions it newly hides (``_file``, ``_pos``)."""

    index: pa.Table
    hidden: pa.Table


def index_columns(primary_key: Sequence[str]) -> list[str]:
    return [*primary_key, sch.VERSION_COL, sch.ORIGIN_COL, sch.DELETED_COL, FILE_COL, POS_COL]


def positions(relpath: str, rows: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """A file's key rows (``primary_key`` and the internal columns, in file order) with file and position."""
    n = rows.num_rows
    out = rows.select([*primary_key, sch.VERSION_COL, sch.ORIGIN_COL, sch.DELETED_COL])
    out = out.append_column(FILE_COL, pa.array([relpath] * n, pa.string()))
    return out.append_column(POS_COL, pa.array(np.arange(n, dtype=np.int64)))


def resolve(previous: pa.Table | None, new_rows: pa.Table, primary_key: Sequence[str]) -> Resolution:
    """Last writer wins over the previous winners and the new candidate rows.

    A row of the previous index that wins again stays visible; one that loses is hidden now (unless it was a
    tombstone, hidden when it came). A new row is hidden unless it wins and is not a tombstone. Rows alike in
    key, version and origin are one write seen twice: the one already visible (the previous index comes
    first, the sort is stable) stays, the other is hidden."""
    cols = index_columns(primary_key)
    parts = []
    if previous is not None and previous.num_rows:
        parts.append(previous.select(cols).append_column(_NEW_COL, pa.array(np.zeros(previous.num_rows, bool))))
    if new_rows.num_rows:
        parts.append(new_rows.select(cols).append_column(_NEW_COL, pa.array(np.ones(new_rows.num_rows, bool))))
    if not parts:
        empty = pa.schema([new_rows.schema.field(c) for c in cols])
        return Resolution(empty.empty_table(), pa.schema([empty.field(FILE_COL), empty.field(POS_COL)]).empty_table())
    rows = pa.concat_tables(parts, promote_options="permissive") if len(parts) > 1 else parts[0]
    order, first = newest_first(rows, primary_key)
    ordered = rows.take(order)
    is_new = ordered.column(_NEW_COL).to_numpy(zero_copy_only=False)
    deleted = ordered.column(sch.DELETED_COL).to_numpy(zero_copy_only=False)
    hide = (~first & (is_new | ~deleted)) | (first & is_new & deleted)
    hidden = ordered.filter(pa.array(hide)).select([FILE_COL, POS_COL])
    index = ordered.filter(pa.array(first)).select(cols)
    return Resolution(index, hidden)


def out_of_range(
    file_rows: pa.Table, key: str, key_type: pa.DataType, ranges: Sequence[KeyRange]
) -> tuple[pa.Table, pa.Table]:
    """Split a file's key rows into those inside some key range of the placements that read it (a null key
    is inside none) and the (``_file``, ``_pos``) of the others, which the site never serves from this file.
    Compute kernels on the partition key column, so a publication needs no ``pyarrow.dataset``."""
    if not ranges or any(lo is None and hi is None for lo, hi in ranges):  # a range unbounded both ways
        return file_rows, file_rows.select([FILE_COL, POS_COL]).slice(0, 0)
    column = file_rows.column(key)
    keep: Any = None
    for lo, hi in ranges:
        above = None if lo is None else pc.greater_equal(column, pa.scalar(lo, key_type))
        below = None if hi is None else pc.less(column, pa.scalar(hi, key_type))
        bounds = [c for c in (above, below) if c is not None]
        inside = bounds[0] if len(bounds) == 1 else pc.and_kleene(*bounds)
        keep = inside if keep is None else pc.or_kleene(keep, inside)
    keep = pc.fill_null(keep, False)
    return file_rows.filter(keep), file_rows.filter(pc.invert(keep)).select([FILE_COL, POS_COL])
