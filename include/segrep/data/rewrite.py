"""``segrep table rewrite``: copy a table's rows into another table of a new shape (DESIGN 16).

The way out of a schema change ``segrep apply`` refuses (a narrowing, a type family change, a key column's
change): the operator defines the new table in the definitions, applies, and copies. Each column is copied by
name (``--map old=new`` renames) and converted with the writer's strict conform: a value that does not convert
exactly (an int64 that no int32 holds, a string into an integer column) is an error naming the column, and
nothing is written. So every partition is read and checked first; then each is read again and its files
written, one source partition in memory at a time, and all of them are registered in one catalog commit
(``writer.write_batches``): a rewrite that fails or is killed half-way leaves the target as it was, with no
half-written copy to notice, and running it again is a whole copy. The target must hold no rows (a copy into a
table with rows would be an upsert over them): ``into_nonempty`` allows it. Stop the source's writers first:
rows written to it while the copy runs may be missed (a row that does not convert stops the copy, nothing
written).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa
from sqlalchemy import func, select

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.core import schema as sch
from segrep.core.errors import ConflictError, RefusedError, SchemaMismatchError, SegrepError
from segrep.data.reader import PlacementFiles, placement_files, read_placement, read_table
from segrep.data.writer import write_batches


@dataclass(frozen=True)
class ColumnCopy:
    """One column of the copy: its source name and type, its target name and type."""

    source: str
    source_type: str
    target: str
    target_type: str

    def __str__(self) -> str:
        types = (
            self.source_type if self.source_type == self.target_type else f"{self.source_type} -> {self.target_type}"
        )
        return f"{self.source} -> {self.target} ({types})"


@dataclass
class RewriteResult:
    """What a rewrite read and wrote (``dry_run``: what it would write)."""

    source: str
    target: str
    columns: list[ColumnCopy]
    dry_run: bool
    rows: int = 0  # rows read from the source (its visible rows at the leaders)
    partitions: int = 0  # source partitions holding rows: read one at a time
    rows_written: int = 0
    segments: int = 0
    per_partition: list[tuple[int, int]] = field(default_factory=list)  # (source partition id, rows)


def rewrite_table(
    catalog: Catalog,
    source: str,
    target: str,
    *,
    renames: Mapping[str, str] | None = None,
    dry_run: bool = False,
    into_nonempty: bool = False,
) -> RewriteResult:
    """Copy ``source``'s visible rows at its leaders into ``target`` (an existing table without rows, unless
    ``into_nonempty``), column by name (``renames``: source name -> target name), in one commit. Every
    partition is checked before anything is written: SchemaMismatchError naming the column if a value does not
    convert exactly, nothing written."""
    if source == target:
        raise SegrepError(f"table rewrite: --into names the source table {source} itself; give another table")
    info, placements = placement_files(catalog, source)
    with catalog.read() as s:
        into = q.table_info(s, target)
    columns = _mapping(info, into, dict(renames or {}))
    if not into_nonempty:
        _require_empty(catalog, into)
    names = {c.source: c.target for c in columns}
    result = RewriteResult(source, target, columns, dry_run)
    for pf in placements:  # check every partition first: nothing is written unless all convert
        rows = _rows(info, pf, names)
        if rows.num_rows == 0:
            continue
        try:
            sch.conform_batch(rows, into.schema, into.primary_key, keys_only=False)
        except SchemaMismatchError as exc:
            raise SchemaMismatchError(
                f"table rewrite {source} -> {target}: source partition {pf.partition_id}: {exc}; "
                f"nothing was written to {target}"
            ) from None
        result.rows += rows.num_rows
        result.partitions += 1
        result.per_partition.append((pf.partition_id, rows.num_rows))
    if dry_run:
        return result
    # the files again: a compaction since the check may have replaced some (the rows are the same)
    info, placements = placement_files(catalog, source)
    # one source partition in memory at a time, every file registered in one commit: all or nothing
    try:
        written = write_batches(catalog, target, (_rows(info, pf, names) for pf in placements))
    except ConflictError as exc:
        raise SegrepError(
            f"table rewrite {source} -> {target}: {target} was written to during the copy ({exc}); nothing was "
            "written by the rewrite: stop the target's writers and run it again"
        ) from None
    result.rows_written = written.rows_written
    result.segments = len(written.segments)
    return result


def _require_empty(catalog: Catalog, into: q.TableInfo) -> None:
    """RefusedError naming ``into`` and what it holds if it has visible rows at its leaders: the copy would be
    an upsert over them, leaving a mix of both tables' rows."""
    held = read_table(catalog, into.name, columns=into.primary_key).num_rows
    if held:
        with catalog.read() as s:
            segments = s.scalar(
                select(func.count())
                .select_from(m.Segment)
                .join(m.Partition, m.Partition.partition_id == m.Segment.partition_id)
                .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
                .where(
                    m.Partition.table_id == into.table_id, m.Partition.leader_placement_id == m.Placement.placement_id
                )
            )
        raise RefusedError(
            f"table rewrite: table {into.name} already holds {held} row(s) ({segments} segment(s) at its leaders): "
            "a rewrite into it would upsert over them, mixing both tables' rows; nothing was written. Give an "
            f"empty table, or --into-nonempty to copy over the rows {into.name} holds"
        )


def parse_renames(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``--map old=new`` options as {old: new}; SegrepError for a malformed or repeated one."""
    out: dict[str, str] = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        old, new = old.strip(), new.strip()
        if not sep or not old or not new:
            raise SegrepError(f"--map {pair!r}: give OLD=NEW (a source column and the target column it becomes)")
        if old in out:
            raise SegrepError(f"--map names source column {old} twice")
        out[old] = new
    return out


def _mapping(info: q.TableInfo, into: q.TableInfo, renames: dict[str, str]) -> list[ColumnCopy]:
    """Each source column and the target column it is copied into, in the target's order. Every source column
    must land in a target column and every target column must be filled: no value is dropped or made up."""
    source_types = {f.name: sch.type_name(f.type) for f in info.schema}
    target_types = {f.name: sch.type_name(f.type) for f in into.schema}
    unknown = [old for old in renames if old not in source_types]
    if unknown:
        raise SegrepError(
            f"--map names column(s) {', '.join(unknown)} that table {info.name} does not have "
            f"(its columns: {', '.join(source_types)})"
        )
    names = {old: renames.get(old, old) for old in source_types}
    taken: dict[str, str] = {}
    for old, new in names.items():
        if new in taken:
            raise SegrepError(f"columns {taken[new]} and {old} of {info.name} would both be copied into {new}")
        taken[new] = old
    extra = [f"{old}" + (f" (as {new})" if new != old else "") for old, new in names.items() if new not in target_types]
    missing = [n for n in target_types if n not in taken]
    if extra or missing:
        problems = []
        if extra:
            problems.append(f"{info.name} column(s) {', '.join(extra)} have no column in {into.name}")
        if missing:
            problems.append(f"{into.name} column(s) {', '.join(missing)} get no column of {info.name}")
        raise SegrepError(
            f"table rewrite {info.name} -> {into.name}: {'; '.join(problems)}; every column is copied by name: "
            "rename with --map OLD=NEW, or give the target table the columns"
        )
    return [ColumnCopy(taken[n], source_types[taken[n]], n, target_types[n]) for n in target_types]


def _rows(info: q.TableInfo, pf: PlacementFiles, names: dict[str, str]) -> pa.Table:
    """One source partition's visible rows, columns renamed to the target's names."""
    rows = read_placement(info, pf)
    changed = [c for c in rows.column_names if c not in names]
    if changed:
        raise SegrepError(
            f"table {info.name} changed its columns during the copy ({', '.join(changed)}); run the rewrite again"
        )
    return rows.rename_columns([names[c] for c in rows.column_names])
