"""The winners index a published snapshot keeps: a base file and the deltas written since.

A publication that folds new files into the index needs the previous winners of the new rows' keys only
(``hidden_rows.resolve`` over those and the new rows gives every row hidden now). Rewriting the whole index
each time made an update round's publication cost grow with the table (0.45 s at 900,000 keys); instead each
publication writes the new winners of the keys it touched as a *delta*, and the keys' previous winners are the
newest entry among the deltas and the base. Once the deltas hold a quarter of the base's rows, or
``MAX_DELTAS`` of them pile up, the next fold writes a new base (the newest entry of every key) and no delta.

A delta's entry for a key never loses to the base's: it won against it (or is the same row). So the newest
entry per key, by ``(_version, _origin)``, is the current winner, and ties are the same row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from segrep.data.reader import latest
from segrep.publish import iceberg_files as files
from segrep.publish.hidden_rows import FILE_COL

MAX_DELTAS = 8
DELTA_FRACTION = 0.25  # the deltas' rows, against the base's, past which the next fold writes a new base


@dataclass(frozen=True)
class IndexFiles:
    """The index of a snapshot: its base file and deltas (oldest first), with their row counts."""

    base: str
    base_rows: int = 0
    deltas: tuple[str, ...] = ()
    delta_rows: int = 0

    @property
    def paths(self) -> list[str]:
        return [self.base, *self.deltas]

    def to_doc(self) -> dict[str, Any]:
        return {
            "index": self.base,
            "index_rows": self.base_rows,
            "deltas": list(self.deltas),
            "delta_rows": self.delta_rows,
        }

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> IndexFiles:
        """A state written before deltas existed has only ``index``: its row count is unknown (0), so its next
        fold writes a new base."""
        return cls(
            str(doc["index"]),
            int(doc.get("index_rows", 0)),
            tuple(doc.get("deltas", ())),
            int(doc.get("delta_rows", 0)),
        )


@dataclass(frozen=True)
class Previous:
    """The previous winners of the keys being folded, and the base (read whole, for a new base)."""

    winners: pa.Table
    base: pa.Table
    deltas: list[pa.Table]


def read_previous(io: Any, index: IndexFiles, new_rows: pa.Table, primary_key: Sequence[str]) -> Previous:
    """The newest index entry of each key of ``new_rows`` (among the deltas and the base)."""
    base = _read(io, index.base)
    deltas = [_read(io, path) for path in index.deltas]
    keys = new_rows.select(list(primary_key))
    parts = [_plain(_having_keys(t, keys, primary_key)) for t in (*reversed(deltas), base)]
    found = [t for t in parts if t.num_rows]
    if not found:
        return Previous(parts[-1], base, deltas)
    rows = pa.concat_tables(found, promote_options="permissive") if len(found) > 1 else found[0]
    return Previous(latest(rows, primary_key) if len(found) > 1 else rows, base, deltas)


def store(
    io: Any,
    location: str,
    snapshot_id: int,
    index: IndexFiles | None,
    previous: Previous | None,
    winners: pa.Table,
    primary_key: Sequence[str],
) -> IndexFiles:
    """Write the index after a fold whose keys now have ``winners``: a new base when there is no index yet
    (``winners`` is every key's), or when the deltas would pass their bounds; else ``winners`` as a delta."""
    if index is None or previous is None:
        return IndexFiles(_write(io, location, snapshot_id, "index", winners), winners.num_rows)
    delta_rows = index.delta_rows + winners.num_rows
    if len(index.deltas) + 1 <= MAX_DELTAS and delta_rows <= DELTA_FRACTION * index.base_rows:
        path = _write(io, location, snapshot_id, "delta", winners)
        return replace(index, deltas=(*index.deltas, path), delta_rows=delta_rows)
    parts = [_plain(t) for t in (winners, *reversed(previous.deltas), previous.base) if t.num_rows]
    rows = pa.concat_tables(parts, promote_options="permissive") if parts else winners
    merged = latest(rows, primary_key) if len(parts) > 1 else rows
    return IndexFiles(_write(io, location, snapshot_id, "index", merged), merged.num_rows)


def _having_keys(rows: pa.Table, keys: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """The rows of ``rows`` whose primary key is one of ``keys``'."""
    if rows.num_rows == 0 or keys.num_rows == 0:
        return rows.slice(0, 0)
    if len(primary_key) == 1:
        name = primary_key[0]
        wanted = keys.column(name).combine_chunks().cast(rows.schema.field(name).type)
        return rows.filter(pc.is_in(rows.column(name), value_set=wanted))
    wanted = keys.group_by(list(primary_key)).aggregate([]).cast(rows.select(list(primary_key)).schema)
    return rows.join(wanted, keys=list(primary_key), join_type="left semi")


def _read(io: Any, path: str) -> pa.Table:
    """An index file, its file column dictionary-encoded (as stored: a few paths repeated), decoded by
    ``_plain`` for the rows kept: most of a base's rows are read only to be left out."""
    with io.new_input(path).open() as f:
        return pq.read_table(f, read_dictionary=[FILE_COL])


def _plain(rows: pa.Table) -> pa.Table:
    i = rows.schema.get_field_index(FILE_COL)
    if i < 0 or not pa.types.is_dictionary(rows.schema.field(i).type):
        return rows
    return rows.set_column(i, FILE_COL, rows.column(i).cast(pa.string()))


def _write(io: Any, location: str, snapshot_id: int, kind: str, rows: pa.Table) -> str:
    path = files.new_name(location, "segrep", f"{kind}-{snapshot_id}", "parquet")
    files.write_parquet(io, path, rows)
    return path
