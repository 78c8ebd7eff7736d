"""Compaction without Spark, and what GC must leave behind.

``arrow_submit`` runs the real merge job entry point (:func:`segrep.spark.jobs.run_manifest`: verification of
the inputs, the segment entry, the output path, the result file) with only its row step done by pyarrow in this
process instead of Spark (tests/maintenance/test_compaction.py shows both give the same rows).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any
from unittest import mock

import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.snapshot import snapshot
from segrep.core import schema as sch
from segrep.core.chain import visible_segments
from segrep.spark import jobs as merge_mod
from segrep.spark.manifest import Manifest
from segrep.storage.atomic import write_json_atomic
from segrep.storage.identity import MARKER_NAME
from segrep.storage.site import Site
from tests.support.checks import partitions, triples
from tests.support.env import Env
from tests.support.models import Model
from tests.support.tables import REPLICAS, TABLE

SITES = ("primary", *REPLICAS)


def latest_with_tombstones(rows: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """One row per primary key, the highest (_version, _origin); tombstones kept."""
    sort_keys = [(k, "ascending") for k in primary_key] + [
        (sch.VERSION_COL, "descending"),
        (sch.ORIGIN_COL, "descending"),
    ]
    ordered = rows.take(pc.sort_indices(rows, sort_keys=sort_keys))
    keys = list(zip(*(ordered[k].to_pylist() for k in primary_key), strict=True))
    first = [i for i, key in enumerate(keys) if i == 0 or key != keys[i - 1]]
    return ordered.take(pa.array(first, pa.int64()))


def arrow_major_rows(_spark: Any, item: merge_mod.MergeItem) -> tuple[pa.Table, int]:
    tables = [Site(r.site, r.uri).read_segment(r.relpath).replace_schema_metadata(None) for r in item.visible]
    rows = pa.concat_tables(tables)
    latest = latest_with_tombstones(rows, item.primary_key)
    if item.tombstone_cutoff_us is not None:
        expired = pc.and_(latest[sch.DELETED_COL], pc.less(latest[sch.VERSION_COL], item.tombstone_cutoff_us))
        latest = latest.filter(pc.invert(expired))
    return latest, rows.num_rows


def arrow_segment_table(rows: pa.Table, schema: pa.Schema, primary_key: list[str]) -> pa.Table:
    target = sch.segment_schema(schema)
    return rows.select(target.names).cast(target).sort_by([(k, "ascending") for k in primary_key]).combine_chunks()


def arrow_submit(calls: list[str] | None = None) -> Any:
    """A ``submit`` for the merge job's *major* items, run in this process with pyarrow doing the row step."""

    def submit(app: str, args: Sequence[str], *, name: str, master: str | None = None) -> None:
        assert app == "merge", app
        manifest, result = args[args.index("--manifest") + 1], args[args.index("--result") + 1]
        loaded = Manifest.load(manifest)
        assert {it.kind for it in loaded.items} == {"major"}, "this double only folds majors"
        if calls is not None:
            calls.append(name)
        with (
            mock.patch.object(merge_mod, "_major_rows", arrow_major_rows),
            mock.patch.object(merge_mod, "_to_segment_table", arrow_segment_table),
        ):
            doc = merge_mod.run_manifest(None, loaded)  # type: ignore[arg-type]
        write_json_atomic(result, doc)

    return submit


def files_at(env: Env, site: str) -> set[str]:
    """Every file under the site's root (relative), except what a bootstrap moved aside under .replaced/ and
    the site's identity marker."""
    root = env.site_dir(site)
    if not root.is_dir():
        return set()
    return {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and p.relative_to(root).parts[0] != ".replaced" and p.name != MARKER_NAME
    }


def catalog_relpaths(env: Env, site: str) -> set[str]:
    """Paths of every segment row of every placement (active or removed) at ``site``."""
    with env.catalog.read() as s:
        return set(
            s.scalars(
                select(m.Segment.relpath)
                .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
                .join(m.Site, m.Site.site_id == m.Placement.site_id)
                .where(m.Site.name == site)
            )
        )


def assert_sites_hold_exactly_the_catalog(env: Env, sites: Iterable[str] = SITES) -> None:
    for site in sites:
        on_disk, listed = files_at(env, site), catalog_relpaths(env, site)
        assert on_disk == listed, f"{site}: extra files {sorted(on_disk - listed)}, missing {sorted(listed - on_disk)}"


def chain_report(env: Env, table: str = TABLE) -> dict[tuple[str, int], tuple[list[str], list[str]]]:
    """(site, partition) -> (segment ids in the placement's list, ids of its visible chain)."""
    out = {}
    with env.catalog.read() as s:
        snap = snapshot(s, table, include_stalled=True)
        for part in snap.partitions:
            for pl in (part.leader, *part.replicas):
                listed = [x.segment_id for x in part.segments.get(pl.placement_id, [])]
                visible = [r.segment_id for r in visible_segments(part.chain(pl))]
                out[(snap.sites[pl.site_id].name, part.partition.partition_id)] = (listed, visible)
    return out


def assert_lists_hold_exactly_what_chains_need(env: Env, table: str = TABLE) -> None:
    """After GC with every replica caught up: each list is its visible chain (newest major to root), which
    starts with a major segment; no removed placement lists anything."""
    for (site, pid), (listed, visible) in chain_report(env, table).items():
        assert sorted(listed) == sorted(visible), f"{site} partition {pid}: list {listed}, chain needs {visible}"
    with env.catalog.read() as s:
        removed = s.scalars(
            select(m.Segment.segment_id)
            .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
            .where(m.Placement.removed_us.is_not(None))
        ).all()
        assert removed == [], removed
        for part_id in partitions(env.catalog, table):
            part = s.get(m.Partition, part_id)
            leader = s.get(m.Placement, part.leader_placement_id)
            segs = q.segments_of(s, [leader.placement_id]).get(leader.placement_id, [])
            if segs:
                chain = q.chain_of(leader, segs)
                assert visible_segments(chain)[0].is_major, f"partition {part_id}: the leader's chain is cut"


def all_sites_read_the_model(env: Env, model: Model, sites: Iterable[str] = SITES) -> None:
    want = model.snapshot()
    for site in sites:
        assert triples(env.catalog, None if site == "primary" else site) == want, site
