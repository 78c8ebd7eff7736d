"""The lag chart's series, at the resolution of the window shown (1 h, 6 h, 24 h or 7 days).

The points are those of ``segrep.replication.overview``'s lag history (each round gives two: the lag just
before it, its start against the safe time the previous round left, and just after it, its commit against
the safe time it reached), read from the kept round reports in one query per table. That module draws a
day and a week; an operator looking at the last hour needs it at seconds, not at a day's two-minute slots,
so each window here keeps up to ``MAX_POINTS`` and only above that the worst lag of each time slot
(window / MAX_POINTS wide: 5 s for an hour, 14 min for a week), so a peak, and so a breach, stays visible.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import select

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.replication.overview import MAX_POINTS, LagPoint, lag_points

WINDOWS: dict[str, int] = {"1h": 3_600, "6h": 6 * 3_600, "24h": 86_400, "7d": 7 * 86_400}  # name -> seconds
DEFAULT_WINDOW = "6h"


class BadWindow(ValueError):
    """A window name that is not one of WINDOWS."""


def window_names(value: str | None) -> list[str]:
    """The windows asked for: ``value`` alone, every window when None; BadWindow naming the choices."""
    if value is None:
        return list(WINDOWS)
    if value not in WINDOWS:
        shown = value if len(value) <= 20 else value[:20] + "..."
        raise BadWindow(f"invalid window {shown!r}: use one of {', '.join(WINDOWS)}")
    return [value]


@dataclass(frozen=True)
class Series:
    """One site's lag over one window; ``slot_s`` is the width of a time slot when the window had more than
    MAX_POINTS points and kept the worst of each (None: every point is there)."""

    table: str
    site: str
    window: str
    window_s: int
    slot_s: float | None
    points: list[LagPoint]


def lag_series(
    catalog: Catalog, sites: Mapping[str, Sequence[str]], windows: Sequence[str], now_us: int
) -> dict[str, list[Series]]:
    """Per table of ``sites`` (table -> its replica sites): each site's series over each of ``windows``."""
    if not windows:
        return {}
    since = now_us - max(WINDOWS[w] for w in windows) * 1_000_000
    out: dict[str, list[Series]] = {}
    with catalog.read() as s:
        query = select(m.Table.name, m.Table.table_id).where(m.Table.name.in_(list(sites)))
        ids = {name: table_id for name, table_id in s.execute(query)}
        for table, replicas in sites.items():
            points = lag_points(s, ids[table], list(replicas), since) if replicas and table in ids else {}
            out[table] = [_series(table, site, w, points.get(site, []), now_us) for site in replicas for w in windows]
    return out


def _series(table: str, site: str, window: str, points: Iterable[LagPoint], now_us: int) -> Series:
    start = now_us - WINDOWS[window] * 1_000_000
    kept = [p for p in points if p.at_us >= start]
    if len(kept) <= MAX_POINTS:
        return Series(table, site, window, WINDOWS[window], None, kept)
    slot_us = WINDOWS[window] * 1_000_000 / MAX_POINTS
    return Series(table, site, window, WINDOWS[window], slot_us / 1e6, worst_per_slot(kept, start, slot_us))


def worst_per_slot(points: Iterable[LagPoint], start_us: int, slot_us: float) -> list[LagPoint]:
    """The worst lag of each time slot of ``slot_us`` from ``start_us``, in time order."""
    worst: dict[int, LagPoint] = {}
    for p in points:
        key = int((p.at_us - start_us) // slot_us)
        if key not in worst or p.lag_s > worst[key].lag_s:
            worst[key] = p
    return [worst[k] for k in sorted(worst)]
