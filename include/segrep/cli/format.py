"""The CLI's tables: aligned rows and the status table's cells.

The workflows' records render themselves (``str(report)``, ``lines()``), for the CLI and for the task logs of
the DAGs alike; only the terminal's table layout lives here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from segrep.catalog import link_slots as lk
from segrep.config.links import LinkState
from segrep.core import hlc
from segrep.core.human import human_rate
from segrep.replication.status import TargetState

STATUS_HEADER = [
    "table",
    "target",
    "safe time",
    "lag s",
    "pending segs",
    "pending bytes",
    "last round",
    "declines",
    "last verified",
    "schema",
    "note",
]

LINK_HEADER = ["link", "cap now", "in force by", "max copies", "next change"]
ACTIVITY_HEADER = ["link", "sending", "allowed", "cap", "holders (share)", "waiting"]


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


def status_table(rows: Sequence[TargetState]) -> list[list[object]]:
    return [
        [
            r.table,
            r.target,
            "-" if r.safe_time_us is None else hlc.iso(r.safe_time_us),
            "-" if r.lag_s is None else r.lag_s,
            r.pending_segments,
            r.pending_bytes,
            r.last_round_text() or "-",
            ", ".join(f"{k} {v}" for k, v in sorted(r.declines.items())) or "-",
            r.last_verified_text() or "-",
            r.schema_text(),
            Whole(r.note() or "-"),
        ]
        for r in rows
    ]


def activity_table(activity: Sequence[tuple[str, lk.LinkState]]) -> list[list[object]]:
    """One row per link in use: the rate measured, the rate its holders' shares allow, the cap in force, each
    holder's class and share, and each waiting holder with why it waits."""
    return [
        [
            pair,
            human_rate(st.sending),
            human_rate(st.rate),
            human_rate(st.limits.cap_bytes_per_s),
            Whole(", ".join(f"{v.what} {human_rate(v.share)}" for v in st.holders) or "-"),
            Whole("; ".join(f"{v.what}: {why}" for v, why in st.waiting) or "-"),
        ]
        for pair, st in activity
    ]


def link_table(states: Sequence[LinkState]) -> list[list[object]]:
    """One row per link: the pair, the cap in force and its window (or the default), the copy limit, and
    when the cap changes next and to what."""
    return [
        [
            st.link.pair,
            human_rate(st.cap.bytes_per_second),
            Whole(st.cap.source),
            st.link.max_concurrent_copies,
            Whole(st.next_change_text()),
        ]
        for st in states
    ]
