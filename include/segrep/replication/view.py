"""A round as its operator reads it: the report plus, per target, what is still pending, the lag and the RPO.

Why apart from the report: the report says what the round did; the view adds what ``segrep status`` says now
(pending segments and bytes, lag; ``replication.status``), read once after the commit, and the objective. The
view renders itself (``str``: the lines the CLI prints and the DAG's task logs), names the round's problems
(:meth:`RoundView.failure`) and raises on them (:meth:`RoundView.raise_on_problems`): a failed target, a file
that failed verification, a target behind its RPO. ``to_xcom``/``from_xcom`` carry it between tasks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from segrep.catalog import Catalog
from segrep.core import hlc
from segrep.core.errors import SegrepError
from segrep.core.human import human_bytes, human_seconds, iso_or_dash
from segrep.replication.reports import RoundReport, TargetStatus
from segrep.replication.status import DECLINES, TargetState, status_rows


class RoundProblems(SegrepError):
    """The round needs a person (:meth:`RoundView.failure` says why): ``segrep round`` exits 1 on it and the
    DAG's task fails with it."""


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
    throttled: dict[str, int] = field(default_factory=dict)  # per store site: throttled requests retried

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

    def __str__(self) -> str:
        return "\n".join(report_lines(self))

    def raise_on_problems(self) -> None:
        """Raise :class:`RoundProblems` naming the table, each failed target and each breach, if there is one."""
        failure = self.failure()
        if failure:
            raise RoundProblems(failure)

    def breaches(self) -> list[TargetView]:
        return [t for t in self.targets if t.rpo_breached]

    def held_back(self) -> list[TargetView]:
        """Targets the round meant to serve but did not try, held back by their back-off, with segments still
        pending there: the round did not do what it planned, so it does not pass."""
        return [t for t in self.targets if t.status == TargetStatus.BACKOFF and t.pending_segments > 0]

    def failure(self) -> str | None:
        """Why the report task fails, naming the table, each site and its lag; None if it passes."""
        table = self.report.table
        parts = [f"round of {table}: {p}" for p in self.problems]
        for t in self.held_back():
            parts.append(
                f"round of {table}: {t.site} was not tried and lacks {t.pending_segments} segment(s): {t.error}; "
                + retry_now(table, t.site, "the failed task")
            )
        for t in self.breaches():
            lag = "no safe time yet" if t.lag_s is None else f"lag {human_seconds(t.lag_s)}"
            parts.append(
                f"RPO breach: {table} at {t.site} is behind its objective of {human_seconds(float(t.rpo_s or 0))} "
                f"({lag}; safe time {iso_or_dash(t.safe_time_us)})"
            )
        return "; ".join(parts) or None

    def to_xcom(self) -> dict[str, Any]:
        """Machine values only (µs, bytes, seconds): what a downstream task or the API reads, and what
        :meth:`from_xcom` rebuilds the view from."""
        r = self.report
        return {
            "round_id": r.round_id,
            "table": r.table,
            "end_us": r.end_us,
            "status": str(r.status),
            "safe_time_us": dict(r.safe_time_us),
            "spark_apps": r.spark_apps,
            "duration_s": self.duration_s,
            "targets": {t.site: {**asdict(t), "rpo_breached": t.rpo_breached} for t in self.targets},
            "report": r.to_dict(),
            "problems": list(self.problems),
            "others": {site: list(pending) for site, pending in self.others.items()},
        }

    @classmethod
    def from_xcom(cls, doc: dict[str, Any]) -> RoundView:
        names = {f.name for f in fields(TargetView)}
        targets = [TargetView(**{k: v for k, v in t.items() if k in names}) for t in doc["targets"].values()]
        others = {site: (int(p[0]), int(p[1])) for site, p in doc.get("others", {}).items()}
        return cls(RoundReport.from_dict(doc["report"]), targets, doc["duration_s"], list(doc["problems"]), others)


def retry_now(table: str, site: str, task: str) -> str:
    """How to try a target its back-off holds back now, rather than when the back-off ends."""
    return (
        f"to retry now, clear {task} (a cleared task ignores the back-off) or run "
        f"`segrep round {table} --target {site} --reoffer`"
    )


def round_view(catalog: Catalog, report: RoundReport, rpo_s: int | None) -> RoundView:
    """The report plus, per target, what ``segrep status`` says now: pending segments and bytes, lag."""

    states: dict[str, TargetState] = {s.target: s for s in status_rows(catalog, report.table)}
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
                planned_segments=forecast.offers if forecast else 0,
                planned_bytes=forecast.fast_forward_bytes if forecast else 0,
                rpo_s=rpo_s,
                bytes_from=dict(tr.bytes_from) if tr else {},
                throttled=dict(tr.throttled) if tr else {},
            )
        )
    others = {
        site: (st.pending_segments, st.pending_bytes) for site, st in sorted(states.items()) if site not in targets_of
    }
    return RoundView(report, targets, report.duration_s, report.problems() if report.has_problems else [], others)


def report_lines(view: RoundView) -> list[str]:
    """The round for a person reading the task log: one line per target with what was copied, its safe time
    (ISO) and lag, and what is still pending; then merges, Spark applications and the objective."""
    r = view.report
    took = "" if view.duration_s is None else f" in {human_seconds(view.duration_s)}"
    lines = [f"round {r.round_id} of {r.table} up to {hlc.iso(r.end_us)}: {r.status}{took}"]
    for t in view.targets:
        lines.append(f"  {t.site}: {_target_text(t)}")
    lines += r.merges.lines()
    lines.append(f"  spark applications: {r.spark_apps}")
    for split_id in r.splits_retired:
        lines.append(f"  split {split_id} of {r.table}: every replica holds the children; parent retired")
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
    if t.throttled:
        parts.append("throttled by the store, retried " + ", ".join(f"{s} {n}" for s, n in sorted(t.throttled.items())))
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
