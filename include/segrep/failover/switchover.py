"""Planned switchover with RPO 0 (DESIGN section 11; YugabyteDB's planned switchover): pause writes to the
tables, drain rounds to the new leader until it holds every segment of the leaders' chains, promote, resume.

The pause is ``partitions.paused_us``: a writer refuses a paused table with a clear, retryable error, and a
write prepared before the pause cannot commit during it (its conditional update requires no pause). The
promotion (the same step as a failover, recorded as a switchover) moves the leaders and clears the pause in
one transaction per table, and only if the new leader lacks nothing: RPO 0 by construction. On timeout or
any error the pause is lifted at the old leader and nothing else changes. The old leader then follows by
fast-forward, its chain being the new leader's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import update

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.config.definitions import Definitions
from segrep.core import faults, hlc
from segrep.core.errors import RefusedError, SegrepError
from segrep.failover.assess import assess
from segrep.failover.promote import Cut, FailoverReport, Move, MoveKind, promote_table
from segrep.replication.orchestrator import run_round
from segrep.replication.publication import publish
from segrep.spark import launch
from segrep.spark.launch import Submit


@dataclass(frozen=True)
class DrainRound:
    table: str
    to_site: str
    segments_copied: int
    lacking: int  # segments of the leaders' chains the new leader still lacks after this round

    def __str__(self) -> str:
        return (
            f"drain {self.table}: copied {self.segments_copied} segment(s) to {self.to_site}, "
            f"{self.lacking} still lacking"
        )


def switchover(
    catalog: Catalog,
    defs: Definitions,
    tables: Sequence[str],
    to: str,
    *,
    timeout_s: float = 600.0,
    submit: Submit = launch.submit,
) -> tuple[FailoverReport, list[DrainRound]]:
    """Pause, drain, promote, resume; SegrepError (with writes resumed at the old leader and nothing else
    changed) if ``to`` cannot lead, or does not hold everything within ``timeout_s``. A ``timeout_s`` of 0
    does not wait: no round runs, and the leaders move only if ``to`` already holds everything."""
    wanted = list(dict.fromkeys(tables))
    if not wanted:
        raise SegrepError("name at least one table to switch over")
    with catalog.read() as s:
        for table in wanted:
            assess(s, table, to)  # refuses a site that cannot lead, before anything is paused
    _pause(catalog, wanted)
    drained: list[DrainRound] = []
    try:
        deadline = time.monotonic() + timeout_s
        pending = list(wanted)
        if timeout_s <= 0:
            _require_nothing_to_drain(catalog, wanted, to)
            pending = []
        while pending:
            for table in list(pending):
                report = run_round(catalog, defs, table, target=to, submit=submit)
                with catalog.read() as s:
                    lacking = assess(s, table, to).segments_lost
                copied = report.targets[to].segments_copied if to in report.targets else 0
                drained.append(DrainRound(table, to, copied, lacking))
                if not lacking:
                    pending.remove(table)
            if pending and time.monotonic() > deadline:
                left = ", ".join(f"{d.table}: {d.lacking}" for d in drained[-len(pending) :])
                raise SegrepError(
                    f"switchover to {to} timed out after {timeout_s:g} s: {to} still lacks segments ({left}); "
                    "writes resumed at the old leader, nothing else changed"
                )
        faults.point("switchover_before_promote")
        moves: list[Move] = []
        for table in wanted:
            with catalog.write() as s:
                on_return = defs.policy(table).on_return
                move = promote_table(s, table, to, Cut.LATEST, MoveKind.SWITCHOVER, "a planned switchover", on_return)
                if move.assessment.loss:
                    raise RefusedError(f"switchover of {table}: {to} lacks segments after the drain")  # rolls back
                moves.append(move)
    except BaseException:
        _resume(catalog, wanted)
        raise
    published = [publish(catalog, defs, table) for table in wanted]
    return FailoverReport(MoveKind.SWITCHOVER, False, Cut.LATEST, to, moves, published=published), drained


def _require_nothing_to_drain(catalog: Catalog, tables: Sequence[str], to: str) -> None:
    """Zero timeout: refuse unless ``to`` lacks nothing already (read after the pause, so no write slips in
    between). A drain round copies and may take long: zero means no time for one."""
    with catalog.read() as s:
        lacking = {table: assess(s, table, to).segments_lost for table in tables}
    left = ", ".join(f"{table}: {n}" for table, n in lacking.items() if n)
    if left:
        raise SegrepError(
            f"switchover to {to} with a timeout of 0 does not wait for a drain, and {to} still lacks segments "
            f"({left}); writes resumed at the old leader, nothing else changed: give a timeout, or let rounds "
            "catch up first"
        )


def _pause(catalog: Catalog, tables: Sequence[str]) -> None:
    """Pause writes to every partition of ``tables`` in one transaction. A partition paused already (by a
    switchover that was killed: nothing else pauses) keeps its pause: this run continues that switchover,
    and either promotes or resumes writes, so a killed switchover never leaves writes paused for good."""
    now = hlc.now_us()
    with catalog.write() as s:
        ids = [q.table_info(s, t).table_id for t in tables]
        s.execute(
            update(m.Partition)
            .where(m.Partition.table_id.in_(ids), m.Partition.paused_us.is_(None))
            .values(paused_us=now)
            .execution_options(synchronize_session=False)
        )


def _resume(catalog: Catalog, tables: Sequence[str]) -> None:
    with catalog.write() as s:
        ids = [q.table_info(s, t).table_id for t in tables]
        s.execute(
            update(m.Partition)
            .where(m.Partition.table_id.in_(ids))
            .values(paused_us=None)
            .execution_options(synchronize_session=False)
        )
