"""Schema changes: the definitions' columns compared with a table's current schema version.

The accepted changes never make a file written at an earlier version unreadable or misread: add a column
(nullable, or with a default the rows written before it read as), drop one (soft: hidden, its field id retired,
the files keep it), rename one (``renamed_from``: the field id stays), widen a type (int8 -> int16 -> int32 ->
int64, float32 -> float64, decimal precision up at the same scale), reorder. Everything else is refused, naming
the column, the change and the way out. A name always means one field id over the table's history (a file
read by name, by Spark or by hand, must not show another column's values under it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from segrep.core.errors import RefusedError
from segrep.core.projection import is_widening
from segrep.core.schema import parse_type
from segrep.core.schema_versions import Column, SchemaVersion

REWRITE = (
    "define a new table of the new shape, `segrep apply`, then copy the rows with "
    "`segrep table rewrite {table} --into NEW_TABLE` (`--map OLD=NEW` for a renamed column)"
)


@dataclass(frozen=True)
class ColumnSpec:
    """One column as the definitions give it: ``type`` is normalized (``int64``, ``decimal(15,2)``);
    ``default`` is the JSON form of the value (``keys.encode``); ``renamed_from`` the column's former name."""

    name: str
    type: str
    default: Any = None
    renamed_from: str | None = None


@dataclass(frozen=True)
class SchemaChange:
    """An accepted change set: the new version, what changed (one line per step) and the next free field id."""

    version: SchemaVersion
    steps: tuple[str, ...]
    next_field_id: int

    @property
    def text(self) -> str:
        return "; ".join(self.steps)


class SchemaChangeRefused(RefusedError):
    """A refused change. ``recreate_ok``: the change is only refused because rows could be misread, so a table
    without segments may be created again instead (a mistake in the definitions is refused in any case)."""

    def __init__(self, message: str, *, recreate_ok: bool) -> None:
        super().__init__(message)
        self.recreate_ok = recreate_ok


def version_fingerprint(version: SchemaVersion, primary_key: Sequence[str]) -> str:
    """Short hash of a version's field ids, names and types (in order) and the primary key: the label stamped
    on the segments written at that version (a label only: compatibility is decided by the versions)."""
    doc = json.dumps(
        {"columns": [[c.field_id, c.name, c.type] for c in version.columns], "key": list(primary_key)}, sort_keys=True
    )
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def plan_schema_change(
    table: str,
    current: SchemaVersion,
    specs: Sequence[ColumnSpec],
    *,
    key_columns: Sequence[str],
    history: Sequence[SchemaVersion],
    next_field_id: int,
) -> SchemaChange | None:
    """The new version the definitions' ``specs`` make of ``current`` (None: nothing changed), or
    SchemaChangeRefused naming the column, the change and the way out. ``key_columns``: the primary and
    partition key columns, which never change; ``history``: every version so far (for names' field ids)."""
    by_name = {c.name: c for c in current.columns}
    names_ids: dict[str, int] = {}
    for old in history:
        for c in old.columns:
            names_ids.setdefault(c.name, c.field_id)
    claimed: dict[int, str] = {}
    new_columns: list[Column] = []
    adds: list[str] = []
    renames: list[str] = []
    widens: list[str] = []
    nid = next_field_id

    def refuse(column: str, what: str, way: str | None = None, *, recreate_ok: bool = True) -> SchemaChangeRefused:
        way = REWRITE.format(table=table) if way is None else way
        return SchemaChangeRefused(f"table {table}: column {column}: {what}; way out: {way}", recreate_ok=recreate_ok)

    for spec in specs:
        source = _source(table, spec, by_name)
        if source is None:
            if spec.name in names_ids:
                raise refuse(
                    spec.name,
                    f"the name was field id {names_ids[spec.name]}'s (dropped or renamed); a new column under it "
                    "would show that column's values to anything reading the files by name",
                    "give the new column another name",
                )
            new_columns.append(Column(nid, spec.name, spec.type, spec.default))
            default = f" (default {spec.default!r})" if spec.default is not None else ""
            adds.append(f"add {spec.name} {spec.type}{default}")
            nid += 1
            continue
        if source.field_id in claimed:
            raise refuse(
                spec.name,
                f"both {claimed[source.field_id]} and {spec.name} claim column {source.name} (field id "
                f"{source.field_id}); a column is kept or renamed, not both",
                "keep one of them (a new column needs its own name and no renamed_from)",
                recreate_ok=False,
            )
        claimed[source.field_id] = spec.name
        if spec.name != source.name:
            if source.name in key_columns:
                raise refuse(source.name, f"renaming key column {source.name} to {spec.name} is refused")
            if names_ids.get(spec.name, source.field_id) != source.field_id:
                raise refuse(
                    spec.name,
                    f"renaming {source.name} to {spec.name} reuses the name of field id {names_ids[spec.name]}, "
                    "another column; a name always means one column",
                    "choose another name",
                )
            renames.append(f"rename {source.name} -> {spec.name}")
        if spec.type != source.type:
            if source.name in key_columns:
                raise refuse(
                    source.name, f"changing key column {source.name}'s type {source.type} -> {spec.type} is refused"
                )
            if not widens_to(source.type, spec.type):
                raise refuse(
                    spec.name,
                    f"changing its type {source.type} -> {spec.type} is refused (only widening is allowed: "
                    "int8 -> int16 -> int32 -> int64, float32 -> float64, decimal precision up at the same scale)",
                )
            widens.append(f"widen {spec.name} {source.type} -> {spec.type}")
        if spec.default is not None and spec.default != source.default:
            raise refuse(
                spec.name,
                f"its default is {source.default!r}, the definitions say {spec.default!r}; a default is what the "
                "rows written before the column existed read as, given once when the column is added",
                f"none (give default {source.default!r} or no default)"
                if source.default is not None
                else "none (remove the default)",
            )
        new_columns.append(Column(source.field_id, spec.name, spec.type, source.default))
    drops = []
    for c in current.columns:
        if c.field_id not in claimed:
            if c.name in key_columns:
                raise refuse(c.name, f"dropping key column {c.name} is refused")
            drops.append(f"drop {c.name} (soft)")
    kept = [c.field_id for c in new_columns if c.field_id in claimed]
    before = [c.field_id for c in current.columns if c.field_id in claimed]
    reorder = ["reorder columns"] if kept != before else []
    steps = (*adds, *renames, *widens, *drops, *reorder)
    if not steps:
        return None
    return SchemaChange(SchemaVersion(current.version + 1, tuple(new_columns)), steps, nid)


def _source(table: str, spec: ColumnSpec, by_name: dict[str, Column]) -> Column | None:
    """The current column ``spec`` continues (None: a new column). A ``renamed_from`` that was applied already
    (the column has its new name, the old one is gone) is the column by its name."""
    if spec.renamed_from is None or spec.renamed_from == spec.name:
        return by_name.get(spec.name)
    if spec.renamed_from in by_name:
        return by_name[spec.renamed_from]
    if spec.name in by_name:
        return by_name[spec.name]  # renamed by an earlier apply
    raise SchemaChangeRefused(
        f"table {table}: column {spec.name}: renamed_from {spec.renamed_from!r} names no column of the table "
        f"(its columns: {', '.join(by_name)}); way out: none (fix renamed_from, or remove it to add a new column)",
        recreate_ok=False,
    )


def widens_to(old: str, new: str) -> bool:
    """True if every value of type ``old`` is exactly a value of type ``new`` (and they differ): the rule the
    read side casts by (``projection.is_widening``), on the definitions' type names."""
    return is_widening(parse_type(old), parse_type(new))
