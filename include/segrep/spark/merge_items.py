"""Running a merge manifest's items, whichever engine computes their rows (Spark, or pyarrow in process).

Everything around an item's row step is here, once, so both engines give the same result document and write
the same output segments: the inputs verified against their size and sha256 (a bad file or a site that is down
makes that item ``invalid``, the others go on), the fault point after the first item, the rows in segment
layout sorted by primary key, the output's ``SegmentEntry``, the write at the leader and the item's result.
An engine supplies only :data:`RowStep`: an item's output rows, how many rows it read and, for a merge, the
conflicts it counted (``spark.jobs`` on Spark, ``spark.in_process`` with pyarrow).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from segrep.core import faults
from segrep.core.chain import MAX_SEGMENT_HISTORY
from segrep.core.errors import CorruptSegmentError
from segrep.core.projection import stamp
from segrep.core.schema_versions import SchemaVersion
from segrep.spark.conflicts import Conflict
from segrep.spark.manifest import MANIFEST_FORMAT, FileRef, Manifest, MergeItem
from segrep.storage.segment_meta import SegmentEntry, entry_stats


class MergeEngine(StrEnum):
    """What ran a manifest (the result document's ``engine``; a result without one is from Spark)."""

    SPARK = "spark"
    IN_PROCESS = "in_process"


@dataclass(frozen=True)
class ItemRows:
    """One item's row step: the output rows (segment layout, at least its columns, in any order), the rows its
    input files hold, and the active-active conflicts a merge counted (None for the other kinds)."""

    rows: pa.Table
    rows_in: int
    conflicts: list[Conflict] | None = None


RowStep = Callable[[MergeItem], ItemRows]


def run_items(manifest: Manifest, engine: MergeEngine, rows_of: RowStep) -> dict[str, Any]:
    """Execute every item with ``rows_of``; return the result document the commit step records."""
    results = []
    for n, item in enumerate(manifest.items):
        results.append(run_item(item, rows_of))
        if n == 0:
            faults.point("in_merge_job")
    return {"format": MANIFEST_FORMAT, "round_key": manifest.round_key, "engine": engine.value, "items": results}


def run_item(item: MergeItem, rows_of: RowStep) -> dict[str, Any]:
    """Verify the item's inputs, compute its rows, write its output at the leader; its result."""
    base: dict[str, Any] = {"item_id": item.item_id, "kind": item.kind, "partition_id": item.partition_id}
    try:
        for ref in (*item.incoming, *item.visible):
            ref.open_site().verify(ref.relpath, ref.byte_size, ref.sha256)
    except (CorruptSegmentError, OSError) as exc:  # a corrupt file, or a site that is down: this item only
        return {**base, "status": "invalid", "error": str(exc), "output": None, "rows_in": 0, "rows_out": 0}
    step = rows_of(item)
    if step.conflicts is not None:
        base["conflicts"] = [asdict(c) for c in step.conflicts]
    rows = segment_table(step.rows, item.versions.target, item.primary_key)
    # Nothing to write, except where the output's place in the chain matters even empty: a split rewrite, and
    # a major as of a failover's cut (every row of the partition newer than the cut: as of it, none is there)
    if rows.num_rows == 0 and item.kind != "split" and item.as_of_us is None:
        return {**base, "status": "ok", "output": None, "rows_in": step.rows_in, "rows_out": 0}
    entry = output_entry(item, rows)
    facts = item.leader().write_segment(item.output_relpath, rows, entry.to_meta())
    output = {"entry": entry.to_meta(), "relpath": item.output_relpath, **asdict(facts)}
    return {**base, "status": "ok", "output": output, "rows_in": step.rows_in, "rows_out": rows.num_rows}


def output_entry(item: MergeItem, rows: pa.Table) -> SegmentEntry:
    """The catalog entry of the item's output segment (also its footer's)."""
    if item.kind == "split":
        is_major, included = item.is_major, tuple(item.included_segment_ids)
    else:
        is_major = item.kind == "major"
        # a major folds the visible chain; a merge output names the pushed segments it merged, so a site
        # that wrote one (active-active) sees it on its chain once the output arrives (DESIGN 12)
        folded = item.visible if is_major else item.incoming
        included = tuple(ref.segment_id for ref in folded)[-MAX_SEGMENT_HISTORY:]
    return SegmentEntry(
        segment_id=item.output_segment_id,
        table=item.table,
        partition_id=item.partition_id,
        base_segment_id=item.base_segment_id,
        is_major=is_major,
        origin_site_id=item.leader_site_id,
        epoch=item.epoch,
        schema_fingerprint=item.schema_fingerprint,
        schema_version=item.versions.target.version,  # outputs are written at the version they were read at
        partition_begin=item.partition_begin,
        partition_end=item.partition_end,
        included_segment_ids=included,
        **entry_stats(rows, item.primary_key),
    )


def segment_table(rows: pa.Table, version: SchemaVersion, primary_key: list[str]) -> pa.Table:
    """``rows`` as an output segment holds them: the segment schema of ``version`` (field ids and the version
    in its metadata: outputs are written at the version their inputs were read at), sorted by primary key, one
    chunk (the same rows give the same file, whichever engine computed them)."""
    return stamp(rows, version).sort_by([(k, "ascending") for k in primary_key]).combine_chunks()


def row_count(refs: list[FileRef]) -> int:
    """Rows in the files, from their Parquet footers (no data pass)."""
    return sum(footer_rows(r) for r in refs)


def footer_rows(ref: FileRef) -> int:
    """Rows in one file, from its Parquet footer."""
    site = ref.open_site()
    return int(pq.read_metadata(site.path(ref.relpath), filesystem=site.fs).num_rows)
