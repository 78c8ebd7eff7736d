"""Hybrid logical clock for row versions: microseconds, strictly increasing per partition leader."""

from __future__ import annotations

import time

FOREVER_US = 2**63 - 1  # the largest catalog time (int64 microseconds): "no bound", "everything committed"


def now_us() -> int:
    return time.time_ns() // 1000


def next_version(last_version: int, now: int | None = None) -> int:
    """``max(now_us, last_version + 1)``: follows wall time, never repeats or goes back."""
    return max(now_us() if now is None else now, last_version + 1)


def iso(us: int) -> str:
    """A catalog time (microseconds since the epoch, UTC) as ISO-8601, for people."""
    import pendulum

    return pendulum.from_timestamp(us / 1_000_000).to_iso8601_string()
