"""What compaction and GC must leave behind. (Small compactions run in process: ``spark.merge_runner``.)"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select

from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.snapshot import snapshot
from segrep.core.chain import visible_segments
from segrep.storage.identity import MARKER_NAME
from tests.support.checks import partitions, triples
from tests.support.env import Env
from tests.support.models import Model
from tests.support.tables import REPLICAS, TABLE

SITES = ("primary", *REPLICAS)


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
