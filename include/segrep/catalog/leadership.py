"""Who leads each table now and how it got there: the leader sites, their epochs, a switchover's pause, and
the last recorded move (``segrep failover`` / ``switchover``) with what it gave up, the table's schema version
and the one each leader's newest segment is at. Read by ``segrep status`` and ``segrep table describe``: one
query per question, whatever the number of partitions."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.schemas import schema_text, site_schema_versions
from segrep.core import hlc
from segrep.core.schema_versions import FIRST_VERSION


@dataclass(frozen=True)
class LastMove:
    kind: str
    done_us: int
    from_site: str
    to_site: str
    cut: str
    on_return: str
    segments_lost: int
    rows_lost: int


@dataclass(frozen=True)
class Leadership:
    table: str
    leaders: dict[str, int]  # leader site -> partitions it leads
    min_epoch: int
    max_epoch: int
    paused_since_us: int | None  # writes paused by a switchover under way
    last_move: LastMove | None
    schema_version: int = 1  # the table's current schema version
    # per leader site: the schema version of the newest segment it holds (absent: it holds none)
    leader_schema_versions: dict[str, int] = field(default_factory=dict)

    def schema_text(self) -> str:
        """``schema v3``; ``schema v2 (table v3)`` while the leader has written nothing at the current version
        (not an error); with several leader sites, each one's."""
        leads = sorted(self.leaders)
        if all(self.leader_schema_versions.get(site) == self.schema_version for site in leads):
            return f"schema v{self.schema_version}"
        if len(leads) == 1:
            return f"schema {schema_text(self.leader_schema_versions.get(leads[0]), self.schema_version)}"
        each = ", ".join(f"{site} {_v(self.leader_schema_versions.get(site))}" for site in leads)
        return f"schema {each} (table v{self.schema_version})"

    def __str__(self) -> str:
        """One line: the leader site(s), epochs, the schema versions once the columns have changed, a
        switchover's pause, and the last leader move."""
        leads = ", ".join(f"{site} ({n} partition{'s' if n != 1 else ''})" for site, n in sorted(self.leaders.items()))
        epochs = (
            f"epoch {self.max_epoch}"
            if self.min_epoch == self.max_epoch
            else f"epochs {self.min_epoch}-{self.max_epoch}"
        )
        line = f"{self.table}: leader {leads or '-'}, {epochs}"
        if self.schema_version > FIRST_VERSION:  # a table whose columns never changed: nothing to say
            line += f", {self.schema_text()}"
        if self.paused_since_us is not None:
            line += f"; SWITCHING OVER: writes paused since {hlc.iso(self.paused_since_us)}"
        if self.last_move is not None:
            mv = self.last_move
            line += (
                f"; last {mv.kind} {hlc.iso(mv.done_us)} {mv.from_site} -> {mv.to_site} at {mv.cut}, "
                f"given up {mv.segments_lost} segment(s), {mv.rows_lost:,} rows (on return: {mv.on_return})"
            )
        return line

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def leadership(catalog: Catalog, table: str | None = None) -> list[Leadership]:
    with catalog.read() as s:
        names = [table] if table is not None else sorted(s.scalars(select(m.Table.name)))
        return [_of(s, q.table_info(s, name)) for name in names]


def _of(s: Session, info: q.TableInfo) -> Leadership:
    sites = q.sites_by_id(s)
    rows = s.execute(
        select(m.Placement.site_id, func.count(), func.min(m.Partition.epoch), func.max(m.Partition.epoch))
        .join(m.Partition, m.Partition.leader_placement_id == m.Placement.placement_id)
        .where(m.Partition.table_id == info.table_id, m.Placement.removed_us.is_(None))  # not a retired parent
        .group_by(m.Placement.site_id)
    ).all()
    versions = site_schema_versions(s, info.table_id)
    paused = s.scalar(select(func.min(m.Partition.paused_us)).where(m.Partition.table_id == info.table_id))
    move = q.last_failover(s, info.table_id)
    last = None
    if move is not None:
        last = LastMove(
            move.kind,
            move.done_us,
            sites[move.from_site_id].name,
            sites[move.to_site_id].name,
            move.cut,
            move.on_return,
            sum(int(x["segments"]) for x in move.loss),
            sum(int(x["rows"]) for x in move.loss),
        )
    return Leadership(
        info.name,
        {sites[site_id].name: int(n) for site_id, n, _lo, _hi in rows},
        min((int(lo) for _s, _n, lo, _hi in rows), default=0),
        max((int(hi) for _s, _n, _lo, hi in rows), default=0),
        paused,
        last,
        info.row.schema_version,
        {sites[site_id].name: versions[site_id] for site_id, *_ in rows if site_id in versions},
    )


def _v(version: int | None) -> str:
    return "-" if version is None else f"v{version}"
