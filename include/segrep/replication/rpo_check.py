"""The RPO watchdog's check: every replica of every table against its objective, measured from now.

Why a check of its own: a replication round reports a breach only when it runs, so a paused replication DAG, a
failing one or a replica nobody ever replicated raised nothing. This check reads :func:`status_rows` (the
records of ``segrep status``, the operator's page and its Prometheus gauges), whose lag counts from now: from
the safe time, or for a never-replicated target from its start. It needs no round to have run, so a job that
runs it on its own (the Airflow watchdog DAG ``segrep_watchdog``, or cron around ``segrep status --json``) fires
when the rounds do not. Each breach says why the target is behind, from what the catalog knows: no round
finished for longer than the objective (rounds not running: a paused DAG, runs failing before they commit, a
stopped scheduler), never replicated, backing off, the last round's failure, what it still lacks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from segrep.catalog import Catalog
from segrep.core import hlc
from segrep.core.errors import SegrepError
from segrep.core.human import human_bytes, human_seconds
from segrep.replication.status import TargetState, status_rows


@dataclass(frozen=True)
class Breach:
    """One replica past its table's objective, and why."""

    table: str
    site: str
    lag_s: float | None  # None: not known (counted as breached because the target lacks segments)
    rpo_s: int
    behind_since_us: int | None  # the safe time, or a never-replicated target's start
    reasons: tuple[str, ...]

    def __str__(self) -> str:
        lag = "unknown" if self.lag_s is None else human_seconds(self.lag_s)
        since = "" if self.behind_since_us is None else f", behind since {hlc.iso(self.behind_since_us)}"
        why = "; ".join(self.reasons) or "no reason the catalog shows"
        return (
            f"{self.table} at {self.site}: lag {lag} past its RPO of {human_seconds(float(self.rpo_s))}{since}: {why}"
        )


@dataclass(frozen=True)
class RpoCheck:
    """Every replica checked at ``now_us``: the breaches, and the tables that have no objective to check."""

    now_us: int
    targets: list[TargetState]
    breaches: list[Breach]
    no_objective: list[str] = field(default_factory=list)  # tables without `policy.rpo` (their lag is shown only)

    @property
    def ok(self) -> bool:
        return not self.breaches

    def lines(self) -> list[str]:
        """One line per replica: its lag against the objective (what a passing watchdog run logs)."""
        out = [f"RPO check at {hlc.iso(self.now_us)}: {len(self.targets)} replica(s), {len(self.breaches)} breached"]
        breached = {(b.table, b.site): b for b in self.breaches}
        for t in self.targets:
            lag = "lag unknown" if t.lag_s is None else f"lag {human_seconds(t.lag_s)}"
            if t.never_replicated:
                lag += " (never replicated)"
            if t.rpo_s is None:
                verdict = "no objective"
            else:
                verdict = f"RPO {human_seconds(float(t.rpo_s))} " + (
                    "BREACHED" if (t.table, t.target) in breached else "met"
                )
            out.append(f"  {t.table} at {t.target}: {lag}; {verdict}")
        return out

    def failure(self) -> str | None:
        """The message a failed check raises: each breached table and site with its lag, objective and why."""
        if self.ok:
            return None
        head = f"RPO breach: {len(self.breaches)} replica(s) behind their objective"
        return head + ": " + " | ".join(str(b) for b in self.breaches)

    def raise_on_breach(self) -> None:
        if not self.ok:
            raise RpoBreached(self)

    def to_dict(self) -> dict[str, Any]:
        """Machine values (what the watchdog task returns as its XCom)."""
        return {
            "now_us": self.now_us,
            "checked": [
                {"table": t.table, "site": t.target, "lag_s": t.lag_s, "rpo_s": t.rpo_s, "rpo_breached": t.rpo_breached}
                for t in self.targets
            ],
            "breaches": [
                {"table": b.table, "site": b.site, "lag_s": b.lag_s, "rpo_s": b.rpo_s, "reasons": list(b.reasons)}
                for b in self.breaches
            ],
            "no_objective": list(self.no_objective),
        }


class RpoBreached(SegrepError):
    """Some replica is past its objective; the message names each with its lag, objective and why. ``check``
    keeps the records, for an alert callback that wants more than the message."""

    def __init__(self, check: RpoCheck) -> None:
        super().__init__(check.failure())
        self.check = check

    @property
    def breaches(self) -> list[Breach]:
        return self.check.breaches


def reasons(t: TargetState, now_us: int) -> tuple[str, ...]:
    """Why a target is behind, from the catalog: rounds not running, never replicated, backing off, the last
    round's failure, what stands in its way (``TargetState.note``), what it lacks."""
    out = []
    objective_us = (t.rpo_s or 0) * 1_000_000
    if t.last_round_finished_us is None:
        out.append(
            f"no round of {t.table} has finished yet (its replication DAG paused or never run, its runs failing "
            "before they commit, or the scheduler down)"
        )
    elif now_us - t.last_round_finished_us > objective_us:
        ago = human_seconds((now_us - t.last_round_finished_us) / 1e6)
        out.append(
            f"no round of {t.table} has finished for {ago} (since {hlc.iso(t.last_round_finished_us)}): its "
            "replication DAG paused, its runs failing before they commit, or the scheduler down"
        )
    if t.last_status is not None and t.last_status != "ok":
        out.append(f"its last round: {t.last_status}")
    note = t.note()
    if note:
        out.append(note)
    if t.pending_segments:
        out.append(f"lacks {t.pending_segments} segment(s) ({human_bytes(t.pending_bytes)})")
    return tuple(out)


def check_rpo(catalog: Catalog, objectives: Mapping[str, int | None], *, now_us: int | None = None) -> RpoCheck:
    """Every replica of every table in the catalog at one ``now`` (default: now) against ``objectives`` (table
    -> RPO seconds, from the definitions' policies; a table not in it, or None, has no objective)."""
    now = hlc.now_us() if now_us is None else now_us
    rows = status_rows(catalog, rpo=objectives, now_us=now)
    breaches = [
        Breach(t.table, t.target, t.lag_s, t.rpo_s, t.behind_since_us, reasons(t, now))
        for t in rows
        if t.rpo_breached and t.rpo_s is not None
    ]
    tables = sorted({t.table for t in rows})
    return RpoCheck(now, rows, breaches, [name for name in tables if objectives.get(name) is None])
