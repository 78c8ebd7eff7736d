"""Every formatter for people: aligned tables, round reports, replication status, split progress.

The workflows return typed records; this module alone decides how they read in a terminal (and in the task
logs of the DAGs, which print the same text).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from segrep.core import hlc
from segrep.replication.reports import InvalidSegment, RoundReport
from segrep.replication.status import TargetState
from segrep.split.progress import SplitProgress

STATUS_HEADER = [
    "table",
    "target",
    "safe time",
    "lag s",
    "pending segs",
    "pending bytes",
    "last round",
    "declines",
    "note",
]


def format_rows(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned table (no borders) that reads well in a terminal and in a README."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


class Whole(str):
    """A cell ``format_rows`` never shortens: a note that says what to run must be readable to its end."""


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    text = str(value)
    return text if len(text) <= 48 or isinstance(value, Whole) else text[:45] + "..."


def format_report(report: RoundReport, sites: Sequence[str] | None = None) -> str:
    """A few lines a person can read: per target what happened, merges, safe times."""
    lines = [f"round {report.round_id} of {report.table} up to {hlc.iso(report.end_us)}: {report.status}"]
    for site, r in sorted(report.targets.items()):
        if sites and site not in sites:
            continue
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(r.outcomes.items())) or "nothing to offer"
        extra = f"; {r.error}" if r.error else ""
        copied = f"; copied {r.segments_copied} segments, {r.bytes_copied:,} bytes"
        lines.append(f"  {site}: {r.status} ({outcomes}{copied}){extra}")
        for bad in r.invalid:
            lines.append(
                f"    INVALID: segment {bad.segment_id} of partition {bad.partition_id}, file {bad.path} "
                f"at {bad.site}: {bad.error}"
            )
        if r.invalid:
            lines.append(f"    to do: {invalid_advice(report.table, site, r.invalid)}")
    merges = report.merges
    if merges.items:
        lines.append(
            f"  merges: {merges.committed}/{merges.items} committed, {merges.rows_merged:,} rows"
            f" kept of {merges.rows_in:,} pushed"
        )
    for site, us in sorted(report.safe_time_us.items()):
        lines.append(f"  safe time at {site}: {hlc.iso(us)}")
    lines.append(f"  spark applications: {report.spark_apps}")
    return "\n".join(lines)


def invalid_advice(table: str, target: str, invalid: Sequence[InvalidSegment]) -> str:
    """What to run after copies to ``target`` failed verification: copy again at once; a file that fails
    again is damaged at its site and has to be restored from a good copy."""
    sources = ", ".join(sorted({bad.site for bad in invalid}))
    return (
        f"run `segrep round {table} --target {target} --reoffer` to copy again now; if a file fails again, "
        f"it is damaged at {sources}: restore it from a replica's copy"
    )


def status_note(state: TargetState) -> str:
    """Why a target is not catching up, and what to run about it ("" when nothing stands in its way)."""
    notes = []
    if state.invalid:
        files = ", ".join(f"segment {bad.segment_id} ({bad.path})" for bad in state.invalid)
        notes.append(f"INVALID copy of {files}: {invalid_advice(state.table, state.target, state.invalid)}")
    elif state.backing_off is not None and state.backing_off.startswith("INVALID"):
        retry = f"segrep round {state.table} --target {state.target} --reoffer"
        notes.append(f"a copy failed verification: run `{retry}` to copy again now")
    if state.backing_off is not None:
        notes.append(f"backing off ({state.backing_off})")
    if state.needs_major:
        notes.append(f"needs a major segment for partitions {state.needs_major}")
    if state.joining:
        notes.append("joining")
    if state.needs_bootstrap:
        notes.append(f"NEEDS BOOTSTRAP: run segrep bootstrap {state.table} {state.target}")
    return "; ".join(notes)


def last_round(state: TargetState) -> str | None:
    if state.last_round_end_us is None:
        return None
    return f"{hlc.iso(state.last_round_end_us)} {state.last_round_status}"


def status_table(rows: Sequence[TargetState]) -> list[list[object]]:
    return [
        [
            r.table,
            r.target,
            "-" if r.safe_time_us is None else hlc.iso(r.safe_time_us),
            "-" if r.lag_s is None else r.lag_s,
            r.pending_segments,
            r.pending_bytes,
            last_round(r) or "-",
            ", ".join(f"{k} {v}" for k, v in sorted(r.declines.items())) or "-",
            Whole(status_note(r) or "-"),
        ]
        for r in rows
    ]


def format_progress(rows: Sequence[SplitProgress]) -> str:
    lines = []
    for r in rows:
        mode = "async" if r.is_async else "sync"
        lines.append(
            f"split {r.split_id} of {r.table} partition {r.parent_partition_id} at {r.split_keys} "
            f"({mode}): {r.state}, parent {r.parent_state}, pushing from {', '.join(r.sources) or '-'}"
        )
        for c in r.children:
            lo, hi = c.begin_key, c.end_key
            lines.append(
                f"  child {c.partition_id} [{'-inf' if lo is None else lo}, {'+inf' if hi is None else hi}) "
                f"{c.state} at {c.site}: {c.acked} segment(s) acked, {c.lacking} lacking"
            )
    return "\n".join(lines)
