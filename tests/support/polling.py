"""Waiting for something another thread or process does: a bounded poll, never a timed assertion."""

from __future__ import annotations

import time
from collections.abc import Callable


def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Whether ``check()`` became true within ``timeout_s`` (polled every 50 ms)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()
