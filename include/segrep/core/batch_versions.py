"""A batch written at an older schema version of its table (issue 35 item 4, DESIGN 16).

A writer not yet redeployed after a schema change still sends the columns of the version it was built for.
Its batch is accepted when its column names are exactly some version's visible columns: it is checked at that
version's types (the same strict conversion as any batch), then projected to the current version by field id
(``core.projection``): a renamed column's old name becomes the new one, a widened column is cast, an added
column gets its default (or null), a dropped column's values are discarded. The newest matching version is
taken (a name means one field id over the table's history, so every match projects alike). A batch that
matches no version is refused with the message the current version gives, naming the versions tried.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from segrep.core.errors import SchemaMismatchError, SegrepError
from segrep.core.projection import project
from segrep.core.schema import conform_batch
from segrep.core.schema_versions import SchemaVersion


@dataclass(frozen=True)
class ConformedBatch:
    """A batch as rows of the current version, and the version whose columns it came with."""

    rows: pa.Table
    written_at: int


def conform_to_current(
    batch: pa.Table,
    current: SchemaVersion,
    history: Sequence[SchemaVersion],
    primary_key: Sequence[str],
    *,
    keys_only: bool,
) -> ConformedBatch:
    """``batch`` checked and converted to ``current`` (its types and column order). A batch with another
    column set is taken as rows of the newest version in ``history`` whose visible columns it has by name, and
    projected to ``current``. A delete (``keys_only``) holds key columns only, which never change. Raises
    SchemaMismatchError naming the columns (missing and extra against ``current``) and, when the table has
    older versions, the versions tried (a table with one version gives the message it always gave)."""
    schema = _plain(current)
    older = sorted((v for v in history if v.version != current.version), key=lambda v: -v.version)
    if keys_only or not older or set(batch.column_names) == set(schema.names):
        return ConformedBatch(conform_batch(batch, schema, primary_key, keys_only=keys_only), current.version)
    given = set(batch.column_names)
    match = next((v for v in older if {c.name for c in v.columns} == given), None)
    if match is None:
        try:
            conform_batch(batch, schema, primary_key, keys_only=False)
        except SchemaMismatchError as exc:
            tried = ", ".join(str(v.version) for v in sorted([current, *older], key=lambda v: -v.version))
            raise SchemaMismatchError(
                f"{exc} (against the current schema version {current.version}; its columns match no schema "
                f"version of the table, versions tried: {tried})"
            ) from None
        raise SchemaMismatchError("batch columns match no schema version of the table")  # names differ: not reached
    rows = conform_batch(batch, _plain(match), primary_key, keys_only=False)
    try:
        projected = project(rows, match, current)
    except SegrepError as exc:
        raise SchemaMismatchError(
            f"batch has the columns of schema version {match.version}, which cannot be converted to the current "
            f"version {current.version}: {exc}"
        ) from None
    return ConformedBatch(projected, match.version)


def _plain(version: SchemaVersion) -> pa.Schema:
    """The version's columns as the Arrow schema a batch is conformed to (no field-id metadata)."""
    return pa.schema([pa.field(c.name, c.arrow_type) for c in version.columns])
