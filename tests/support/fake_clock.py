"""A clock a test moves by hand: called for the time, ``sleep`` advances it (pacing tests without timing)."""

from __future__ import annotations


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
