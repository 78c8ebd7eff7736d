"""A replication round as the replication DAG's tasks see it, read from segrep's catalog every time.

Why a module of its own: after a failure, Airflow's "Clear only failed tasks" re-runs a failed ``fast_forward``
and the ``report`` but not ``commit``, so the report must not trust the commit's XCom (it would repeat the
old error). :func:`recommit` runs the idempotent ``commit_round`` again and so reads the round's state from the
catalog as it is now; :func:`round_view` adds what is still pending per target, the lag and the RPO, from
``segrep.replication.status`` (the numbers of ``segrep status``). :func:`report_lines` turns it into the lines
the report task logs (ISO times, human sizes, one line per target); the XCom keeps the machine values
(:meth:`RoundView.to_xcom`).

Nothing here imports Airflow: the tasks hand in what they read from their context.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from segrep.core import hlc

if TYPE_CHECKING:
    from segrep.catalog import Catalog
    from segrep.config.definitions import Definitions
    from segrep.replication.reports import RoundReport
    from segrep.replication.status import TargetState

MANUAL = "manual"


def run_kind(run_type: object) -> str:
    """A run type as its value ("manual", "scheduled", ...): the task context's DagRunType is a plain
    ``(str, Enum)``, whose ``str()`` is "DagRunType.MANUAL"."""
    return str(getattr(run_type, "value", run_type or ""))


def round_end(run_type: object, run_after: datetime | None, interval_end: datetime | None) -> datetime | None:
    """Where a run's round ends: a manual run (the Trigger button, ``airflow dags trigger``, the REST API,
    ``dag.test``) replicates up to the moment it was triggered (its ``run_after``), not to the end of the
    last whole interval before it; scheduled and backfill runs end at their data interval's end. None: now
    (``plan_round`` never looks past the present either way)."""
    if run_kind(run_type) == MANUAL and run_after is not None:
        return run_after
    return interval_end


def safe_times(catalog: Catalog, table: str) -> dict[str, int]:
    """Each replica site's safe time now (µs), read before a commit so a task can tell which advanced."""
    from sqlalchemy import select

    from segrep.catalog import models as m
    from segrep.catalog import queries as q

    with catalog.read() as s:
        info = q.table_info(s, table)
        sites = q.sites_by_id(s)
        rows = s.execute(
            select(m.SafeTime.site_id, m.SafeTime.safe_time_us).where(m.SafeTime.table_id == info.table_id)
        )
        return {sites[site_id].name: int(us) for site_id, us in rows}


def advanced(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """The sites whose safe time moved forward between two reads (a site seen for the first time counts)."""
    return sorted(site for site, us in after.items() if us > before.get(site, -1))


def recommit(catalog: Catalog, defs: Definitions, table: str, end_us: int, *, merge_ran: bool) -> RoundReport:
    """The round's report as the catalog has it now: ``commit_round`` again (idempotent: merge results are
    registered once, checkpoints and safe time only move forward, the report is rebuilt from the targets' rows),
    so a fast_forward re-run after a failure is counted and its site's safe time advances."""
    from sqlalchemy import select

    from segrep.catalog import models as m
    from segrep.catalog import queries as q
    from segrep.replication.commit import commit_round
    from segrep.spark.results import CommitSummary

    with catalog.read() as s:
        info = q.table_info(s, table)
        row = s.scalars(
            select(m.Round).where(m.Round.table_id == info.table_id, m.Round.interval_end_us == end_us)
        ).one_or_none()
        done = row is not None and row.finished_us is not None and "merges" in (row.report or {})
        merges = CommitSummary.from_dict(row.report["merges"]) if row is not None and done else None
    # A round already committed has registered its merge outputs: registering them again finds them present and
    # would report "0 committed", so the merges are not re-read and the first commit's summary is kept.
    report = commit_round(catalog, defs, table, end_us, merge_ran=merge_ran and merges is None)
    if merges is not None and merges.items:
        report.merges = merges
        report.spark_apps = merges.spark_apps + sum(t.spark_apps for t in report.targets.values())
        with catalog.write() as s:
            stored = s.scalars(
                select(m.Round).where(m.Round.table_id == info.table_id, m.Round.interval_end_us == end_us)
            ).one()
            stored.report = report.stored()
    return report


@dataclass(frozen=True)
class TargetView:
    """One target site after the round: what the round did there and what is still pending."""

    site: str
    status: str
    segments_copied: int
    bytes_copied: int
    outcomes: dict[str, int]
    declines: dict[str, int]
    error: str | None
    safe_time_us: int | None
    lag_s: float | None
    pending_segments: int
    pending_bytes: int
    planned_segments: int  # what the plan offered this target (its forecast), 0 when the plan is unknown
    planned_bytes: int
    rpo_s: int | None
    bytes_from: dict[str, int] = field(default_factory=dict)  # per source site: each link's bytes
    superseded: int = 0  # copied, not committed: leadership changed or the placement was removed meanwhile

    @property
    def rpo_breached(self) -> bool:
        """Behind the objective: lag above the RPO, or no safe time at all while an RPO is set."""
        if self.rpo_s is None:
            return False
        return self.lag_s is None or self.lag_s > self.rpo_s


@dataclass(frozen=True)
class RoundView:
    """The round's report with each target's pending work, lag and objective."""

    report: RoundReport
    targets: list[TargetView]
    duration_s: float | None  # the round from its plan to its (last) commit
    problems: list[str] = field(default_factory=list)  # the round's own problems (a failed target, INVALID...)
    # replica sites this round did not target (a run narrowed to one site): (pending segments, pending bytes)
    others: dict[str, tuple[int, int]] = field(default_factory=dict)

    def breaches(self) -> list[TargetView]:
        return [t for t in self.targets if t.rpo_breached]

    def failure(self) -> str | None:
        """Why the report task fails, naming the table, each site and its lag; None if it passes."""
        table = self.report.table
        parts = [f"round of {table}: {p}" for p in self.problems]
        for t in self.breaches():
            lag = "no safe time yet" if t.lag_s is None else f"lag {human_seconds(t.lag_s)}"
            parts.append(
                f"RPO breach: {table} at {t.site} is behind its objective of {human_seconds(float(t.rpo_s or 0))} "
                f"({lag}; safe time {iso_or_dash(t.safe_time_us)})"
            )
        return "; ".join(parts) or None

    def to_xcom(self) -> dict[str, Any]:
        """Machine values only (µs, bytes, seconds): what a downstream task or the API reads."""
        r = self.report
        return {
            "round_id": r.round_id,
            "table": r.table,
            "end_us": r.end_us,
            "status": str(r.status),
            "safe_time_us": dict(r.safe_time_us),
            "spark_apps": r.spark_apps,
            "duration_s": self.duration_s,
            "targets": {
                t.site: {
                    "status": t.status,
                    "segments_copied": t.segments_copied,
                    "bytes_copied": t.bytes_copied,
                    "safe_time_us": t.safe_time_us,
                    "lag_s": t.lag_s,
                    "pending_segments": t.pending_segments,
                    "pending_bytes": t.pending_bytes,
                    "declines": dict(t.declines),
                    "rpo_s": t.rpo_s,
                    "rpo_breached": t.rpo_breached,
                }
                for t in self.targets
            },
        }


def round_view(catalog: Catalog, report: RoundReport, rpo_s: int | None) -> RoundView:
    """The report plus, per target, what ``segrep status`` says now: pending segments and bytes, lag."""

    from segrep.catalog import models as m
    from segrep.replication.status import DECLINES, status_rows

    states: dict[str, TargetState] = {s.target: s for s in status_rows(catalog, report.table)}
    with catalog.read() as s:
        row = s.get(m.Round, report.round_id)
        times = None if row is None else (row.started_us, row.finished_us)
    duration = None if times is None or times[1] is None else round((times[1] - times[0]) / 1e6, 3)
    decline_names = {str(d) for d in DECLINES}
    plan = report.plan.targets if report.plan is not None else {}
    targets = []
    targets_of = set(report.targets) | set(plan)
    for site in sorted(targets_of):
        tr = report.targets.get(site)
        st = states.get(site)
        forecast = plan.get(site)
        targets.append(
            TargetView(
                site=site,
                status=str(tr.status) if tr else "not run",
                segments_copied=tr.segments_copied if tr else 0,
                superseded=tr.superseded if tr else 0,
                bytes_copied=tr.bytes_copied if tr else 0,
                outcomes=dict(tr.outcomes) if tr else {},
                declines={k: v for k, v in (tr.outcomes if tr else {}).items() if k in decline_names},
                error=tr.error if tr else None,
                safe_time_us=st.safe_time_us if st else report.safe_time_us.get(site),
                lag_s=st.lag_s if st else None,
                pending_segments=st.pending_segments if st else 0,
                pending_bytes=st.pending_bytes if st else 0,
                planned_segments=sum(forecast.outcomes.values()) if forecast else 0,
                planned_bytes=forecast.fast_forward_bytes if forecast else 0,
                rpo_s=rpo_s,
                bytes_from=dict(tr.bytes_from) if tr else {},
            )
        )
    others = {
        site: (st.pending_segments, st.pending_bytes) for site, st in sorted(states.items()) if site not in targets_of
    }
    return RoundView(report, targets, duration, report.problems() if report.has_problems else [], others)


def report_lines(view: RoundView) -> list[str]:
    """The round for a person reading the task log: one line per target with what was copied, its safe time
    (ISO) and lag, and what is still pending; then merges, Spark applications and the objective."""
    r = view.report
    took = "" if view.duration_s is None else f" in {human_seconds(view.duration_s)}"
    lines = [f"round {r.round_id} of {r.table} up to {hlc.iso(r.end_us)}: {r.status}{took}"]
    for t in view.targets:
        lines.append(f"  {t.site}: {_target_text(t)}")
    m = r.merges
    if m.items:
        lines.append(
            f"  merges: {m.committed}/{m.items} committed, {m.rows_merged:,} rows kept of {m.rows_in:,} pushed"
        )
    for c in m.conflicts:
        keys = "; ".join(json.dumps(k) for k in c.sample)
        lines.append(f"  conflicts: {c.rows:,} row(s) written at {c.site} overwritten by {c.by} (e.g. {keys})")
    lines.append(f"  spark applications: {r.spark_apps}")
    pending = [(t.site, t.pending_segments, t.pending_bytes) for t in view.targets if t.pending_segments]
    pending += [(site, segs, size) for site, (segs, size) in view.others.items() if segs]
    if pending:
        still = ", ".join(f"{site} {_segments(segs)} ({human_bytes(size)})" for site, segs, size in sorted(pending))
        lines.append(f"  still pending (committed after {hlc.iso(r.end_us)}, or not copied): {still}")
    else:
        lines.append("  still pending: nothing, every target holds every segment of the leaders")
    return lines


def _target_text(t: TargetView) -> str:
    if t.segments_copied:
        did = f"copied {_segments(t.segments_copied)} ({human_bytes(t.bytes_copied)})"
        if t.bytes_from:  # the link(s) they crossed: the leader's, or a feeder's in a cascade
            did += " from " + ", ".join(f"{src} {human_bytes(n)}" for src, n in sorted(t.bytes_from.items()))
    elif t.outcomes:
        did = "copied nothing (" + ", ".join(f"{k} {v}" for k, v in sorted(t.outcomes.items())) + ")"
    elif t.status == "failed" and t.planned_segments:
        did = f"copied nothing of the {_segments(t.planned_segments)} ({human_bytes(t.planned_bytes)}) planned"
    elif t.status == "failed":
        did = "copied nothing"
    else:
        did = "nothing to copy"
    if t.superseded:
        did += (
            f"; {_segments(t.superseded)} copied but not committed (leadership changed or the placement was "
            "removed during the round)"
        )
    parts = [t.status, did, f"safe time {iso_or_dash(t.safe_time_us)}"]
    if t.lag_s is not None:
        parts.append(f"lag {human_seconds(t.lag_s)}")
    parts.append(f"pending {_segments(t.pending_segments)} ({human_bytes(t.pending_bytes)})")
    if t.declines:
        parts.append("declined " + ", ".join(f"{k} {v}" for k, v in sorted(t.declines.items())))
    if t.rpo_s is not None:
        verdict = "BREACHED" if t.rpo_breached else "met"
        parts.append(f"RPO {human_seconds(float(t.rpo_s))} {verdict}")
    if t.error:
        parts.append(f"error: {t.error}")
    return "; ".join(parts)


def _segments(n: int) -> str:
    return f"{n} segment{'' if n == 1 else 's'}"


def iso_or_dash(us: int | None) -> str:
    return "-" if us is None else hlc.iso(us)


def human_bytes(n: int) -> str:
    """Bytes for people, in powers of 1000 as S3 and most dashboards show them: 4.7 MB, 512 B."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def human_seconds(s: float) -> str:
    """A duration for people: 0.8 s, 42 s, 15 min 3 s, 2 h 5 min, 3 d 4 h."""
    if s < 10:
        return f"{s:.1f} s"
    whole = round(s)
    if whole < 60:
        return f"{whole} s"
    for size, unit, sub_size, sub_unit in ((86400, "d", 3600, "h"), (3600, "h", 60, "min"), (60, "min", 1, "s")):
        if whole >= size:
            rest = (whole % size) // sub_size
            return f"{whole // size} {unit}" + (f" {rest} {sub_unit}" if rest else "")
    raise AssertionError("unreachable")
