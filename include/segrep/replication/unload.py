"""UNLOAD_FINAL: a split's parent partition is retired once every child holds its segments everywhere.

Why here and not in ``segrep.split``: a split in UNLOAD finishes after the rounds that carry its children to the
replica sites, so the round's commit (``replication.commit``) retires every parent that no longer waits; the
split workflow calls :func:`finish` too, at the end of a split run. The CLI and the DAGs never call it apart.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from segrep.catalog import Catalog
from segrep.catalog import leases as ls
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.site_identity import open_site
from segrep.catalog.splits import SplitView, lacking_counts, replicas_behind, split_view
from segrep.catalog.sql import must_get
from segrep.config.definitions import Definitions
from segrep.core import faults, hlc
from segrep.core.states import PartitionState, SplitState


@dataclass(frozen=True)
class FinishReport:
    """What UNLOAD_FINAL did, or what it waits for (``waiting``: a reason, or child partition -> lacking, or
    ``<child>@<site>`` -> segments that replica lacks: then ``replicas_only``, and the next rounds finish it)."""

    split_id: int
    state: SplitState
    waiting: str | dict[str, int] | None = None
    files_removed: int = 0
    files_kept: list[str] = field(default_factory=list)
    replicas_only: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def finish(catalog: Catalog, defs: Definitions, split_id: int) -> FinishReport:
    """UNLOAD_FINAL once every parent placement's segments are held by every child: the parent and its
    placements are retired and its segment rows dropped in one transaction, then its files are removed at
    each site (a site that cannot be reached keeps them until a later run). Returns what it did or awaits."""
    with catalog.write() as s:
        split = must_get(s, m.Split, split_id, lock=True, what="split")
        table = must_get(s, m.Table, split.table_id).name
        parent_id = split.parent_partition_id
        if split.state == SplitState.SPLITTING:
            return FinishReport(split_id, SplitState(split.state), waiting="not finalized yet")
        if split.state == SplitState.UNLOAD:
            view = split_view(s, split_id)
            lacking = lacking_counts(view, None)
            if lacking:
                waiting = {str(c): n for c, n in sorted(lacking.items())}
                return FinishReport(split_id, SplitState(split.state), waiting=waiting)
            behind = replicas_behind(s, view)
            if behind:
                return FinishReport(split_id, SplitState(split.state), waiting=behind, replicas_only=True)
            _retire_parent(s, split, view)
        sites = {pl.site_id for pl in s.scalars(select(m.Placement).where(m.Placement.partition_id == parent_id))}
        site_rows = [must_get(s, m.Site, sid) for sid in sorted(sites)]
    faults.point("split_before_parent_files")
    removed, kept = _remove_parent_files(catalog, table, parent_id, site_rows)
    return FinishReport(split_id, SplitState.DONE, files_removed=removed, files_kept=kept)


def _retire_parent(s: Session, split: m.Split, view: SplitView) -> None:
    now = hlc.now_us()
    parent_pls = [pl.placement_id for pl in q.active_placements(s, [view.parent.partition_id])]
    view.parent.state = PartitionState.UNLOAD_FINAL
    for pl in s.scalars(select(m.Placement).where(m.Placement.placement_id.in_(parent_pls))):
        pl.removed_us = now
    ls.drop_acks(s, holders=parent_pls)
    ls.drop_acks(s, targets=parent_pls)
    ls.drop_leases(s, targets=parent_pls)
    s.execute(delete(m.Checkpoint).where(m.Checkpoint.partition_id == view.parent.partition_id))
    s.execute(delete(m.Segment).where(m.Segment.placement_id.in_(parent_pls)))
    split.state = SplitState.DONE
    split.finished_us = now


def _remove_parent_files(catalog: Catalog, table: str, parent_id: int, sites: list[m.Site]) -> tuple[int, list[str]]:
    """Every segment file under the retired parent's directory at each of its sites (a site whose identity
    marker is missing or foreign is not touched: it keeps the files, named in ``kept``)."""
    removed, kept = 0, []
    prefix = f"{table}/{parent_id}/"
    for row in sites:
        site = open_site(catalog, row)
        try:
            for rel in [r for r in site.list_segment_files() if r.startswith(prefix)]:
                site.delete(rel)
                removed += 1
        except OSError as exc:
            kept.append(f"{row.name}: {exc}")
    return removed, kept


def finish_unloaded(catalog: Catalog, defs: Definitions, table: str) -> list[FinishReport]:
    """UNLOAD_FINAL for every split of ``table`` in UNLOAD that no longer waits (after a round carried the
    children to the replica sites); returns what each finished or still awaits. No split in UNLOAD: no work."""
    with catalog.read() as s:
        table_id = q.table_info(s, table).table_id
        query = select(m.Split.split_id).where(m.Split.table_id == table_id, m.Split.state == SplitState.UNLOAD)
        split_ids = list(s.scalars(query.order_by(m.Split.split_id)))
    return [finish(catalog, defs, split_id) for split_id in split_ids]
