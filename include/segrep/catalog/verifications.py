"""What verification leaves in the catalog: the last check of each file, and one record per table, site and
run, so ``segrep status`` can say when a site was last verified and with how many differences.

Writes take the caller's transaction (a verify records all of its results in one)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from segrep.catalog import models as m
from segrep.catalog import queries as q


@dataclass(frozen=True)
class FileCheckResult:
    """One placement's copy of one segment, checked at ``checked_us``; ``problem`` None means it was good."""

    placement_id: int
    segment_id: str
    checked_us: int
    problem: str | None


@dataclass(frozen=True)
class VerificationState:
    """The newest verification of a table at a site."""

    table: str
    site: str
    kind: str  # rows, files or rows+files
    as_of_us: int | None
    outcome: str  # equal or different
    differences: int
    started_us: int
    finished_us: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def record_file_checks(s: Session, results: Iterable[FileCheckResult]) -> None:
    """Upsert each file's last check; ``last_good_us`` moves only when the file proved good."""
    results = list(results)
    if not results:
        return
    wanted = {(r.placement_id, r.segment_id) for r in results}
    placements = sorted({p for p, _ in wanted})
    existing = {
        (row.placement_id, row.segment_id): row
        for row in s.scalars(select(m.FileCheck).where(m.FileCheck.placement_id.in_(placements)).with_for_update())
        if (row.placement_id, row.segment_id) in wanted
    }
    for r in results:
        row = existing.get((r.placement_id, r.segment_id))
        if row is None:
            row = m.FileCheck(placement_id=r.placement_id, segment_id=r.segment_id, last_good_us=None)
            s.add(row)
            existing[(r.placement_id, r.segment_id)] = row
        row.checked_us = r.checked_us
        row.problem = r.problem
        if r.problem is None:
            row.last_good_us = r.checked_us


def record_verification(
    s: Session,
    table_id: int,
    site_id: int,
    *,
    kind: str,
    as_of_us: int | None,
    differences: int,
    started_us: int,
    finished_us: int,
) -> None:
    s.add(
        m.Verification(
            table_id=table_id,
            site_id=site_id,
            kind=kind,
            as_of_us=as_of_us,
            outcome="different" if differences else "equal",
            differences=differences,
            started_us=started_us,
            finished_us=finished_us,
        )
    )


def last_verifications(s: Session, table: str) -> list[VerificationState]:
    """The newest verification of ``table`` at each site that has one, by site name."""
    info = q.table_info(s, table)
    newest = (
        select(m.Verification.site_id, func.max(m.Verification.verification_id).label("vid"))
        .where(m.Verification.table_id == info.table_id)
        .group_by(m.Verification.site_id)
        .subquery()
    )
    rows = s.execute(
        select(m.Verification, m.Site.name)
        .join(newest, newest.c.vid == m.Verification.verification_id)
        .join(m.Site, m.Site.site_id == m.Verification.site_id)
        .order_by(m.Site.name)
    ).all()
    return [
        VerificationState(
            table=info.name,
            site=name,
            kind=v.kind,
            as_of_us=v.as_of_us,
            outcome=v.outcome,
            differences=v.differences,
            started_us=v.started_us,
            finished_us=v.finished_us,
        )
        for v, name in rows
    ]


def last_good_checks(s: Session, placement_ids: Iterable[int]) -> dict[tuple[int, str], int | None]:
    """(placement id, segment id) -> when that copy last proved good (None: never), for checked files."""
    ids = sorted(set(placement_ids))
    if not ids:
        return {}
    rows = s.execute(
        select(m.FileCheck.placement_id, m.FileCheck.segment_id, m.FileCheck.last_good_us).where(
            m.FileCheck.placement_id.in_(ids)
        )
    ).all()
    return {(p, seg): good for p, seg, good in rows}
