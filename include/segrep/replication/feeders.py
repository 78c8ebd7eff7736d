"""Cascaded replicas whose feeder is down: the leader feeds them instead, past a policy limit (DESIGN 12).

A replica with ``from: dr`` is offered segments by ``dr``'s placement, so a segment crosses the expensive
link once. If ``dr`` has been failing as a target for longer than ``policy.feeder_fallback`` (its back-off
row says since when), the plan step marks its cascaded replicas ``feeder_fallback_us`` and the leader offers
to them (the acks the leader holds for them are kept in a cascade too, so nothing is copied twice); once the
feeder answers again the mark is cleared and it feeds them from where they are. Off by default: without the
policy a cascaded replica waits for its feeder.
"""

from __future__ import annotations

import logging

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from segrep.catalog import models as m
from segrep.catalog.sql import rowcount
from segrep.config.definitions import Policy

log = logging.getLogger(__name__)


# built once (catalog.sql says why): every round's plan asks (and mostly finds none)
_FEEDERS = (
    select(m.Placement.feeder_site_id)
    .where(
        m.Placement.partition_id.in_(
            select(m.Partition.partition_id).where(m.Partition.table_id == bindparam("table_id"))
        ),
        m.Placement.feeder_site_id.is_not(None),
        m.Placement.removed_us.is_(None),
    )
    .distinct()
)


def update_fallbacks(s: Session, table_id: int, policy: Policy, now_us: int) -> None:
    """Mark (or clear) the fallback of every cascaded placement of the table by its feeder's back-off."""
    found = set(s.scalars(_FEEDERS, {"table_id": table_id}))
    feeders = {site_id for site_id in found if site_id is not None}
    if not feeders:
        return
    part_ids = select(m.Partition.partition_id).where(m.Partition.table_id == table_id)
    down: set[int] = set()
    if policy.feeder_fallback_s is not None:
        limit_us = now_us - policy.feeder_fallback_s * 1_000_000
        rows = s.execute(
            select(m.Backoff.site_id, m.Backoff.failing_since_us).where(
                m.Backoff.table_id == table_id, m.Backoff.site_id.in_(feeders), m.Backoff.failures > 0
            )
        )
        down = {site_id for site_id, since in rows if since is not None and since <= limit_us}
    for feeder in sorted(feeders):
        cascaded = (
            m.Placement.partition_id.in_(part_ids),
            m.Placement.feeder_site_id == feeder,
            m.Placement.removed_us.is_(None),
        )
        if feeder in down:
            res = s.execute(
                update(m.Placement)
                .where(*cascaded, m.Placement.feeder_fallback_us.is_(None))
                .values(feeder_fallback_us=now_us)
                .execution_options(synchronize_session=False)
            )
            if rowcount(res):
                log.warning("feeder site %s is down past the fallback limit: the leader feeds its replicas", feeder)
        else:
            s.execute(
                update(m.Placement)
                .where(*cascaded, m.Placement.feeder_fallback_us.is_not(None))
                .values(feeder_fallback_us=None)
                .execution_options(synchronize_session=False)
            )
