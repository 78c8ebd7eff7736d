"""Recording a merge job's results in the catalog: the Python step after the Spark step (DESIGN section 8).

For each item the output segment is registered at the leader with a conditional root move. A merge output
whose planned base is no longer the root (a write landed meanwhile) is re-based: its rows won against an
older state, and under last-writer-wins they may sit on top of newer segments too, so only the footer's base
changes. A major segment must include everything up to its base, and a split rewrite keeps its source's
base, so a moved root drops either (the next pass plans again). Pushed segments are then acked by the leader
and their leases released. Registering an output that is already there is a no-op, so the step can run twice.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sqlalchemy import select

from segrep.catalog import Catalog
from segrep.catalog import leases as ls
from segrep.catalog import models as m
from segrep.catalog.segments import register_segment
from segrep.config.definitions import Definitions
from segrep.core import hlc
from segrep.core.errors import SegrepError
from segrep.spark.conflicts import SAMPLE_KEYS
from segrep.spark.manifest import Manifest, MergeItem
from segrep.spark.merge_items import MergeEngine
from segrep.storage.atomic import FileFacts
from segrep.storage.segment_meta import SegmentEntry
from segrep.storage.site import Site
from segrep.storage.workdir import manifest_path, result_path


@dataclass(frozen=True)
class ItemProblem:
    """An item whose output was not recorded, and why (the job's error, or the commit's reason)."""

    item: str
    reason: str | None


@dataclass
class ConflictCount:
    """Rows written at ``site`` that a concurrent write at ``by`` overwrote (last writer wins), with a few of
    their primary keys (``spark.conflicts``)."""

    site: str
    by: str
    rows: int
    sample: list[list[Any]] = field(default_factory=list)


@dataclass
class CommitSummary:
    """What recording one merge job's results did. ``ran`` is False when a manifest exists but its job has
    not written a result (the Spark step failed or was skipped); ``spark_apps`` is 0 when the manifest ran in
    process (``spark.merge_runner``)."""

    items: int = 0
    committed: int = 0
    rows_in: int = 0
    rows_merged: int = 0
    invalid: list[ItemProblem] = field(default_factory=list)
    dropped: list[ItemProblem] = field(default_factory=list)
    spark_apps: int = 0
    ran: bool = True
    conflicts: list[ConflictCount] = field(default_factory=list)  # active-active overwrites, per site pair

    def lines(self) -> list[str]:
        """The merges and their active-active conflicts, as a round's report prints them ([] if none)."""
        if not self.items:
            return []
        kept = f"{self.rows_merged:,} rows kept of {self.rows_in:,} pushed"
        out = [f"  merges: {self.committed}/{self.items} committed, {kept}"]
        for c in self.conflicts:
            keys = "; ".join(json.dumps(k) for k in c.sample)
            out.append(f"  conflicts: {c.rows:,} row(s) written at {c.site} overwritten by {c.by} (e.g. {keys})")
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> CommitSummary:
        doc = dict(doc)
        doc["invalid"] = [ItemProblem(**x) for x in doc.get("invalid", [])]
        doc["dropped"] = [ItemProblem(**x) for x in doc.get("dropped", [])]
        doc["conflicts"] = [ConflictCount(**x) for x in doc.get("conflicts", [])]
        return cls(**doc)


def commit_merge_results(catalog: Catalog, defs: Definitions, table: str, end_us: int) -> CommitSummary:
    """Record the results of a round's merge job (if the round planned one)."""
    return commit_results(catalog, manifest_path(defs, table, end_us), result_path(defs, table, end_us))


def commit_results(catalog: Catalog, mpath: Path, rpath: Path) -> CommitSummary:
    """Record a merge job's result file against its manifest (rounds, compaction and splits share this)."""
    if not mpath.exists():
        return CommitSummary()
    manifest = Manifest.load(mpath)
    if not rpath.exists():
        return CommitSummary(items=len(manifest.items), ran=False)
    result = _load_result(rpath)
    by_id = {it.item_id: it for it in manifest.items}
    key = manifest.round_key
    in_process = result.get("engine") == MergeEngine.IN_PROCESS  # older results have none: Spark's
    summary = CommitSummary(items=len(manifest.items), spark_apps=0 if in_process else 1)
    with catalog.read() as s:
        names = {row.site_id: row.name for row in s.scalars(select(m.Site))}
    for res in result["items"]:
        item = by_id[res["item_id"]]
        summary.rows_in += int(res.get("rows_in", 0))
        _count_conflicts(summary, res.get("conflicts", []), names)
        if res["status"] != "ok":
            summary.invalid.append(ItemProblem(item.item_id, res.get("error")))
            _release(catalog, item, key)
            continue
        outcome = _commit_item(catalog, item, res.get("output"), key)
        if outcome == "committed":  # "present": a commit run again finds it registered (counted once, then)
            summary.committed += 1
            summary.rows_merged += int(res.get("rows_out", 0))
        elif outcome != "present":
            summary.dropped.append(ItemProblem(item.item_id, outcome))
    return summary


def _count_conflicts(summary: CommitSummary, found: list[dict[str, Any]], names: dict[int, str]) -> None:
    """Fold one item's conflicts into the summary's, per (site, by) pair, keeping a few sample keys."""
    pairs = {(c.site, c.by): c for c in summary.conflicts}
    for raw in found:
        site, by = names.get(raw["site_id"], str(raw["site_id"])), names.get(raw["by_site_id"], str(raw["by_site_id"]))
        count = pairs.get((site, by))
        if count is None:
            count = pairs[(site, by)] = ConflictCount(site, by, 0)
            summary.conflicts.append(count)
        count.rows += int(raw["rows"])
        count.sample = (count.sample + list(raw.get("sample", [])))[:SAMPLE_KEYS]
    summary.conflicts.sort(key=lambda c: (c.site, c.by))


def _load_result(path: Path) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SegrepError(f"cannot read merge result {path}: {exc}") from None
    return doc


def _commit_item(catalog: Catalog, item: MergeItem, output: dict[str, Any] | None, key: str) -> str:
    site = Site(item.leader_site, item.leader_uri)
    with catalog.write() as s:
        part = s.get(m.Partition, item.partition_id, with_for_update=True)
        leader = s.get(m.Placement, item.leader_placement_id)
        if (
            part is None
            or leader is None
            or part.leader_placement_id != leader.placement_id
            or part.epoch != item.epoch
        ):
            _release_in(s, item, key)
            return "leader changed since the plan"
        outcome = "committed" if output else "nothing won"
        if output is not None:
            present = s.scalar(
                select(m.Segment.entry_id).where(
                    m.Segment.placement_id == leader.placement_id, m.Segment.segment_id == item.output_segment_id
                )
            )
            if present is not None:
                outcome = "present"
            else:
                entry = SegmentEntry.from_meta(output["entry"])
                facts = site.verify(item.output_relpath, output["byte_size"], output["sha256"])
                fast_forward = leader.root_segment_id is None and entry.is_major
                if leader.root_segment_id != entry.base_segment_id and not (item.kind == "split" and fast_forward):
                    if item.kind in ("major", "split"):
                        site.delete(item.output_relpath)  # never referenced; the next pass plans anew
                        _release_in(s, item, key)
                        return f"root moved under the {item.kind} segment"
                    entry, facts = _rebase(site, item, entry, leader.root_segment_id)
                register_segment(
                    s, leader, entry, item.output_relpath, facts, hlc.now_us(), expected_root=leader.root_segment_id
                )
                if entry.max_version > part.last_version:
                    part.last_version = entry.max_version  # new writes must win over merged rows
        for ref in item.incoming:
            ls.record_ack(s, ref.holder_placement_id, ref.segment_id, leader.placement_id, hlc.now_us())
        _release_in(s, item, key)
    return outcome


def _rebase(site: Site, item: MergeItem, entry: SegmentEntry, root: str | None) -> tuple[SegmentEntry, FileFacts]:
    rebased = replace(entry, base_segment_id=root)
    rows = site.read_segment(item.output_relpath)
    # write_segment replaces the footer entry and keeps the schema version the output was written at
    return rebased, site.write_segment(item.output_relpath, rows, rebased.to_meta())


def _release(catalog: Catalog, item: MergeItem, key: str) -> None:
    with catalog.write() as s:
        _release_in(s, item, key)


def _release_in(s: Any, item: MergeItem, key: str) -> None:
    for ref in item.incoming:
        ls.release(s, item.leader_placement_id, ref.segment_id, key)
