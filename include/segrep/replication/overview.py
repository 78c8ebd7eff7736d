"""What the operator's page shows, assembled from the catalog: per table and site the role, leader epochs and
state with the replication numbers of ``segrep status`` and the schema version of the site's newest segment
(beside the table's), the lag over time from the kept round reports, and the last leader moves.

The replication numbers are :func:`segrep.replication.status.status_rows`' own records (one call, one
``now``), never recomputed here, so the page, its Prometheus endpoint and ``segrep status --json`` agree.
Everything else is read with a fixed number of set-based queries per table (GROUP BY, JSON paths into the
round reports), whatever the number of partitions or rounds; the lag history is bounded to a number of points
per series by keeping each time bucket's worst lag, so an RPO breach is never averaged away.

No Airflow here (the package never imports it): the Airflow plugin (``plugins/segrep_page``) renders these
records and adds the split progress (``segrep.split``, a layer above this one).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.leadership import Leadership, leadership
from segrep.catalog.schemas import schema_text
from segrep.core import hlc
from segrep.replication.reports import TargetStatus
from segrep.replication.status import TargetState, status_rows

HISTORY_WINDOWS_S = (86_400, 7 * 86_400)  # the chart's ranges: last 24 h, last 7 days
MAX_POINTS = 720  # per series and window: one point per two minutes of a day, per 14 minutes of a week
LAST_FAILOVERS = 10


class Role(StrEnum):
    LEADER = "leader"
    REPLICA = "replica"
    LEADER_AND_REPLICA = "leader+replica"  # leads some partitions, replicates others (a partial move)


class SiteState(StrEnum):
    LIVE = "LIVE"
    JOINING = "JOINING"
    NEEDS_BOOTSTRAP = "NEEDS BOOTSTRAP"
    PAUSED = "PAUSED"  # writes paused at the leader by a switchover under way
    DOWN = "DOWN"  # its last round found it down (an old leader away after a failover): nothing moves there


@dataclass(frozen=True)
class SiteRow:
    """One site of one table. ``target`` is the site's ``segrep status`` record when it holds replicas (None
    for a site that only leads): the page shows its numbers as they are."""

    table: str
    site: str
    role: Role
    led_partitions: int
    state: SiteState
    target: TargetState | None
    schema_version: int | None = None  # the newest segment's at this site (None: it holds none)
    table_schema_version: int = 1  # the table's current one

    @property
    def schema_text(self) -> str:
        """``v3``, or ``v2 (table v3)`` while the site holds nothing written at the current version."""
        return schema_text(self.schema_version, self.table_schema_version)


@dataclass(frozen=True)
class LagPoint:
    at_us: int  # when the lag was this: a round's start (before it copied) or its commit (after)
    lag_s: float
    round_end_us: int  # the round's data interval end: which DAG run it was
    status: str | None  # the site's status in that round (ok, failed, backoff, ...)


@dataclass(frozen=True)
class LagSeries:
    """A site's lag over one window, from the round reports: before each round (its start against the safe
    time the previous round left) and after it (its commit against the safe time it reached)."""

    table: str
    site: str
    window_s: int
    points: list[LagPoint]


@dataclass(frozen=True)
class FailoverRow:
    table: str
    kind: str  # failover | switchover
    from_site: str
    to_site: str
    cut: str
    on_return: str
    done_us: int
    segments_lost: int
    rows_lost: int


@dataclass(frozen=True)
class TableOverview:
    name: str
    leadership: Leadership
    rpo_s: int | None
    rows: list[SiteRow]
    history: list[LagSeries]

    @property
    def breached(self) -> list[str]:
        """The sites past the table's objective."""
        return [r.site for r in self.rows if r.target is not None and r.target.rpo_breached]


@dataclass(frozen=True)
class Overview:
    now_us: int
    tables: list[TableOverview]
    failovers: list[FailoverRow] = field(default_factory=list)

    @property
    def targets(self) -> list[TargetState]:
        """Every replica record, in ``segrep status`` order (tables by name, sites by id)."""
        return [r.target for t in self.tables for r in t.rows if r.target is not None]


def build_overview(
    catalog: Catalog,
    *,
    rpo: Mapping[str, int | None] | None = None,
    tables: Collection[str] | None = None,
    history: bool = True,
    now_us: int | None = None,
) -> Overview:
    """The page's records for ``tables`` (default: every table in the catalog); ``rpo`` maps a table to its
    objective (seconds; from the definitions). ``history=False`` leaves the lag series out (the metrics)."""
    now = hlc.now_us() if now_us is None else now_us
    objectives = dict(rpo or {})
    with catalog.read() as s:
        names = sorted(s.scalars(select(m.Table.name)))
    if tables is not None:
        wanted = set(tables)
        names = [n for n in names if n in wanted]
    targets = {name: status_rows(catalog, name, rpo=objectives, now_us=now) for name in names}
    leaders = {name: leadership(catalog, name)[0] for name in names}
    out = []
    with catalog.read() as s:
        table_ids = {row.name: row.table_id for row in s.scalars(select(m.Table).where(m.Table.name.in_(names)))}
        for name in names:
            lead = leaders[name]
            rows = _site_rows(lead, targets[name])
            series = _history(s, table_ids[name], name, [r.target for r in targets[name]], now) if history else []
            out.append(TableOverview(name, lead, objectives.get(name), rows, series))
        failovers = _failovers(s, table_ids)
    return Overview(now, out, failovers)


def _site_rows(lead: Leadership, targets: Sequence[TargetState]) -> list[SiteRow]:
    """Leader sites first (by name), then the replica sites in status order."""
    by_site = {t.target: t for t in targets}
    rows = []
    for site in sorted(set(lead.leaders) - set(by_site)):
        state = SiteState.PAUSED if lead.paused_since_us is not None else SiteState.LIVE
        version = lead.leader_schema_versions.get(site)
        rows.append(
            SiteRow(lead.table, site, Role.LEADER, lead.leaders[site], state, None, version, lead.schema_version)
        )
    for t in targets:
        led = lead.leaders.get(t.target, 0)
        if t.last_status == TargetStatus.DOWN:
            state = SiteState.DOWN
        elif t.needs_bootstrap:
            state = SiteState.NEEDS_BOOTSTRAP
        elif t.joining:
            state = SiteState.JOINING
        elif led and lead.paused_since_us is not None:
            state = SiteState.PAUSED
        else:
            state = SiteState.LIVE
        role = Role.LEADER_AND_REPLICA if led else Role.REPLICA
        rows.append(SiteRow(lead.table, t.target, role, led, state, t, t.schema_version, lead.schema_version))
    return rows


def _history(s: Session, table_id: int, table: str, sites: Sequence[str], now_us: int) -> list[LagSeries]:
    """Each site's lag series over each window, from the finished rounds of the longest window."""
    if not sites:
        return []
    points_of = lag_points(s, table_id, sites, now_us - max(HISTORY_WINDOWS_S) * 1_000_000)
    out = []
    for site in sites:
        for window in HISTORY_WINDOWS_S:
            start = now_us - window * 1_000_000
            kept = [p for p in points_of[site] if p.at_us >= start]
            out.append(LagSeries(table, site, window, _worst_per_bucket(kept, start, now_us)))
    return out


def lag_points(s: Session, table_id: int, sites: Sequence[str], since_us: int) -> dict[str, list[LagPoint]]:
    """Each site's lag at each finished round since ``since_us`` (at its start: against the safe time before
    it; at its end: against the safe time it reached), oldest first: one query, the safe times and statuses
    taken out of the reports by JSON path (no report is loaded whole). Shared by the operator page's windows."""
    r = m.Round
    columns: list[Any] = [r.interval_end_us, r.started_us, r.finished_us]
    for site in sites:
        columns.append(r.report[("safe_time_us", site)].as_string())
        columns.append(r.report[("targets", site, "status")].as_string())
    # The round before the window too: the lag at the window's first round start is measured against it.
    first = s.scalar(
        select(r.interval_end_us)
        .where(r.table_id == table_id, r.finished_us.is_not(None), r.finished_us < since_us)
        .order_by(r.interval_end_us.desc())
        .limit(1)
    )
    rows = s.execute(
        select(*columns)
        .where(
            r.table_id == table_id,
            r.finished_us.is_not(None),
            r.interval_end_us >= (since_us if first is None else first),
        )
        .order_by(r.interval_end_us)
    ).all()
    out: dict[str, list[LagPoint]] = {}
    for i, site in enumerate(sites):
        points = out.setdefault(site, [])
        previous: int | None = None
        for row in rows:
            end_us, started_us, finished_us = int(row[0]), int(row[1]), int(row[2])  # finished: filtered above
            raw_safe, raw_status = row[3 + 2 * i], row[4 + 2 * i]
            safe = None if raw_safe is None else int(raw_safe)
            status = None if raw_status is None else str(raw_status)
            if previous is not None and started_us >= since_us:
                points.append(LagPoint(started_us, _seconds(started_us - previous), end_us, status))
            if safe is not None:
                if finished_us >= since_us:
                    points.append(LagPoint(finished_us, _seconds(finished_us - safe), end_us, status))
                previous = safe if previous is None else max(previous, safe)
    return out


def _seconds(us: int) -> float:
    return round(max(us, 0) / 1e6, 1)


def _worst_per_bucket(points: list[LagPoint], start_us: int, end_us: int) -> list[LagPoint]:
    """At most MAX_POINTS points: the worst lag of each time bucket (a peak, and so a breach, stays visible)."""
    if len(points) <= MAX_POINTS:
        return points
    width = max((end_us - start_us) // MAX_POINTS + 1, 1)
    worst: dict[int, LagPoint] = {}
    for p in points:
        key = (p.at_us - start_us) // width
        if key not in worst or p.lag_s > worst[key].lag_s:
            worst[key] = p
    return [worst[k] for k in sorted(worst)]


def _failovers(s: Session, table_ids: Mapping[str, int]) -> list[FailoverRow]:
    """The last leader moves of the tables, newest first (one query)."""
    if not table_ids:
        return []
    name_of = {tid: name for name, tid in table_ids.items()}
    sites = q.sites_by_id(s)
    moves = s.scalars(
        select(m.Failover)
        .where(m.Failover.table_id.in_(list(name_of)))
        .order_by(m.Failover.done_us.desc())
        .limit(LAST_FAILOVERS)
    )
    return [
        FailoverRow(
            name_of[f.table_id],
            f.kind,
            sites[f.from_site_id].name,
            sites[f.to_site_id].name,
            f.cut,
            f.on_return,
            f.done_us,
            sum(int(x["segments"]) for x in f.loss),
            sum(int(x["rows"]) for x in f.loss),
        )
        for f in moves
    ]
