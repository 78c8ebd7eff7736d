"""Helpers of the union-rule tests (issue 32): the `events` table loaded and replicated next to its independent
replay, and the list entries of a site."""

from __future__ import annotations

from sqlalchemy import select

from segrep.catalog import models as m
from segrep.catalog.rebuild import rebuild_site
from tests.support.env import Env
from tests.support.models import Model
from tests.support.rounds import bring_up, round_until_idle, take_down


def load_events(env: Env) -> Model:
    """Four batches and an overwrite of the `events` table, replicated to dr and edge; the independent replay."""
    model = Model()
    for i in range(4):
        model.upsert(env, range(i * 12, i * 12 + 12), f"v{i}-")
    model.upsert(env, range(0, 48, 5), "w-")
    round_until_idle(env)
    return model


def listed_at(env: Env, site: str, table: str = "events") -> list[m.Segment]:
    """The site's list entries of ``table``, the first partition's oldest first."""
    with env.catalog.read() as s:
        return list(
            s.scalars(
                select(m.Segment)
                .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
                .join(m.Site, m.Site.site_id == m.Placement.site_id)
                .join(m.Partition, m.Partition.partition_id == m.Segment.partition_id)
                .join(m.Table, m.Table.table_id == m.Partition.table_id)
                .where(m.Site.name == site, m.Table.name == table, m.Placement.removed_us.is_(None))
                .order_by(m.Segment.partition_id, m.Segment.entry_id)
            )
        )


def middle_segment(env: Env, site: str) -> m.Segment:
    """A segment in the middle of a chain at ``site``: rows on both sides of it."""
    segs = listed_at(env, site)
    first = [x for x in segs if x.partition_id == segs[0].partition_id]
    assert len(first) >= 3
    return first[1]


def drop_at_leader_while_replicas_are_away(env: Env) -> m.Segment:
    """A leader file deleted while dr and edge (which hold it) are down, and `catalog rebuild --site primary
    --accept-loss` then drops it (no reachable site held it); the replicas come back. Returns the segment."""
    lost = middle_segment(env, "primary")
    (env.site_dir("primary") / lost.relpath).unlink()
    away = {site: take_down(env, site) for site in ("dr", "edge")}
    try:
        report = rebuild_site(env.catalog, "primary", accept_loss=True)
    finally:
        for site, aside in away.items():
            bring_up(env, site, aside)
    assert [x.segment_id for x in report.lost] == [lost.segment_id], report.lines()
    return lost
