"""Spacing of rounds on write (``schedule: on_write``, ``min_interval``; DESIGN section 15).

Every committed write of an on_write table emits an Airflow asset event; the replication DAG runs one round at
a time (``max_active_runs=1``), and Airflow folds the events that arrive while a run is queued or running into
the next run. The plan step of an asset-triggered run first waits until ``min_interval`` has passed since the
start of the table's latest round, so a burst of writes gives one round per ``min_interval`` rather than one
per write, at the cost of up to ``min_interval`` of extra lag for the first write after a quiet spell.

No write is left behind by the wait: a round ends when its plan runs (after the wait), so it covers every write
committed before; a write committed later emits an event of its own, which triggers the next run. The time
comes from segrep's catalog (the rounds' ``started_us``), never from Airflow's database, so the rounds of
``segrep round`` and of any DAG run count alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import bindparam, select

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.core import hlc


def spacing_wait_s(catalog: Catalog, table: str, min_interval_s: float, now_us: int | None = None) -> float:
    """Seconds left until ``min_interval_s`` has passed since the start of ``table``'s latest round (0: none
    left, or no round yet). Never more than ``min_interval_s``, whatever the clock of the round's writer said."""
    if min_interval_s <= 0:
        return 0.0
    with catalog.read() as s:
        table_id = q.table_info(s, table).table_id
        started_us = s.scalar(_LATEST_START, {"table_id": table_id})
    if started_us is None:
        return 0.0
    now = hlc.now_us() if now_us is None else now_us
    left_s = (started_us + min_interval_s * 1_000_000 - now) / 1_000_000
    return min(max(left_s, 0.0), float(min_interval_s))


def wait_for_spacing(
    catalog: Catalog, table: str, min_interval_s: float, *, sleep: Callable[[float], None] = time.sleep
) -> float:
    """Wait out :func:`spacing_wait_s` (call it before the round is planned); return the seconds waited."""
    wait_s = spacing_wait_s(catalog, table, min_interval_s)
    if wait_s > 0:
        sleep(wait_s)
    return wait_s


# built once (catalog.sql says why): the latest round is the one created last (started_us is its creation time)
_LATEST_START = (
    select(m.Round.started_us)
    .where(m.Round.table_id == bindparam("table_id"))
    .order_by(m.Round.round_id.desc())
    .limit(1)
)
