"""The merge job's in-process twin: a manifest's items run with pyarrow in this process, no Spark application.

A small merge costs Spark a JVM start (tens of seconds, minutes under load) for a few rows; here it costs the
rows' work. Everything but the row step is ``spark.merge_items``, shared with the Spark job (``spark.jobs``),
and the row step follows the job's rules exactly, so both give the same result document (only ``engine``
differs) and the same output files, byte for byte:
- ``merge``: the pushed rows in the partition's key range, one per key (``data.reader.newest_first``: the
  highest ``(_version, _origin)``, as ``jobs.latest_rows``), kept where they beat the leader's winner for the key
  (a tie goes to the leader, as in ``jobs._merge_rows``); conflicts counted by ``conflicts.arrow_conflicts``;
- ``major``: the leader's visible rows (as of ``as_of_us``), one per key, tombstones kept unless older than
  ``tombstone_cutoff_us``;
- ``split``: the source segment's rows in the child's key range, as they are.
Files are read as Spark's executors read them (``data.spark_files.read_file``), after the same size and sha256
check. Which engine runs a manifest is decided by ``spark.merge_runner``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from segrep.core import schema as sch
from segrep.data.reader import key_range, latest, newest_first
from segrep.data.spark_files import read_file
from segrep.spark.conflicts import LeaderBest, Pushed, arrow_conflicts
from segrep.spark.manifest import FileRef, Manifest, MergeItem, segment_files
from segrep.spark.merge_items import ItemRows, MergeEngine, run_items

_SIDE = "__side"


def run_manifest_in_process(manifest: Manifest) -> dict[str, Any]:
    """Execute every item in this process; the result document ``jobs.run_manifest`` would give."""
    return run_items(manifest, MergeEngine.IN_PROCESS, item_rows)


def item_rows(item: MergeItem) -> ItemRows:
    """One item's row step (its inputs already verified)."""
    if item.kind == "merge":
        return _merge_rows(item)
    if item.kind == "split":
        rows, rows_in = _read(item.incoming, item)
        return ItemRows(_in_range(rows, item), rows_in)
    return _major_rows(item)


def _merge_rows(item: MergeItem) -> ItemRows:
    """Pushed rows that beat the partition's current winner for their key (or whose key it lacks), and the
    concurrent overwrites among them. Ranked and matched by sorting (no hash join): both sides are one row
    per key once resolved, in key order."""
    pk, v, o = item.primary_key, sch.VERSION_COL, sch.ORIGIN_COL
    rows, rows_in = _read(item.incoming, item)
    incoming_all = _in_range(rows, item)
    order, first = newest_first(incoming_all, pk)
    pushed = Pushed(incoming_all.select([*pk, v, o]).take(order), first)
    incoming = incoming_all.take(pc.filter(order, pa.array(first)))  # one row per key, in key order
    if not item.visible:
        return ItemRows(incoming, rows_in, arrow_conflicts(pushed, None, pk, item.origin_forks))
    leader, _ = _read(item.visible, item, [*pk, v, o])
    best = latest(leader, pk)
    at, there = matching_keys(incoming, best, pk)
    leader_best = LeaderBest(at, best[v].to_numpy()[there], best[o].to_numpy()[there])
    ver, origin = incoming[v].to_numpy()[at], incoming[o].to_numpy()[at]
    wins = np.ones(incoming.num_rows, bool)  # a key the leader lacks is kept; a tie goes to the leader
    wins[at] = (ver > leader_best.version) | ((ver == leader_best.version) & (origin > leader_best.origin))
    conflicts = arrow_conflicts(pushed, leader_best, pk, item.origin_forks)
    return ItemRows(incoming.filter(pa.array(wins)), rows_in, conflicts)


def matching_keys(left: pa.Table, right: pa.Table, primary_key: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The positions in ``left`` and in ``right`` of the keys both hold, each key at most once per table:
    both tables' keys sorted together (left before right on a tie), an equal neighbour is a match."""
    n = left.num_rows
    side = pa.array(np.repeat(np.array([0, 1], np.int8), [n, right.num_rows]))
    both = pa.concat_tables([left.select(primary_key), right.select(primary_key)]).append_column(_SIDE, side)
    order = pc.sort_indices(both, sort_keys=[*((k, "ascending") for k in primary_key), (_SIDE, "ascending")])
    ordered = both.select(primary_key).take(order)
    same = np.ones(max(ordered.num_rows - 1, 0), bool)
    for name in primary_key:
        col = ordered.column(name)
        same &= pc.equal(col.slice(1), col.slice(0, ordered.num_rows - 1)).to_numpy(zero_copy_only=False)
    hit = np.flatnonzero(same)
    positions = order.to_numpy()
    return positions[hit], positions[hit + 1] - n


def _major_rows(item: MergeItem) -> ItemRows:
    """The partition's resolved rows (as of ``as_of_us``), tombstones kept unless older than the cutoff."""
    rows, rows_in = _read(item.visible, item)
    if item.as_of_us is not None:  # a failover's cut: the partition as it was at that instant
        rows = rows.filter(pc.field(sch.VERSION_COL) <= item.as_of_us)
    out = latest(rows, item.primary_key)
    if item.tombstone_cutoff_us is not None:
        out = out.filter(~(pc.field(sch.DELETED_COL) & (pc.field(sch.VERSION_COL) < item.tombstone_cutoff_us)))
    return ItemRows(out, rows_in)


def _read(refs: list[FileRef], item: MergeItem, columns: list[str] | None = None) -> tuple[pa.Table, int]:
    """The files' unresolved rows (only ``columns`` if given) in segment layout, and how many they hold."""
    target = sch.segment_schema(sch.schema_from_columns(dict(item.columns)))
    if columns is not None:
        target = pa.schema([target.field(c) for c in columns])
    tables = [read_file(f, target) for f in segment_files(refs, item.versions)]
    rows = pa.concat_tables(tables) if tables else target.empty_table()
    return rows, rows.num_rows


def _in_range(rows: pa.Table, item: MergeItem) -> pa.Table:
    """Rows with ``partition_begin <= key < partition_end`` on ``partition_key`` (all rows without one)."""
    if not item.partition_key:
        return rows
    dtype = sch.schema_from_columns(dict(item.columns)).field(item.partition_key).type
    restriction = key_range(item.partition_key, dtype, item.partition_begin, item.partition_end)
    return rows if restriction is None else rows.filter(restriction)
