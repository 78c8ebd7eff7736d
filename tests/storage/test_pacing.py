"""The scrub's pacing: bytes never run ahead of the rate (a fake clock: no timing in the test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from segrep.core.errors import SegrepError
from segrep.storage.atomic import hash_local
from segrep.storage.pacing import DEFAULT_SCRUB_BYTES_PER_S, Pacer, paced_facts, scrub_rate
from segrep.storage.site import Site


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_the_pacer_sleeps_until_the_bytes_fit_the_rate(tmp_path: Path) -> None:
    clock = FakeClock()
    pacer = Pacer(1000, clock=clock, sleep=clock.sleep)
    pacer.consume(500)
    assert clock.now == pytest.approx(0.5)
    clock.now += 2.0  # time passed elsewhere: no sleep owed
    pacer.consume(500)
    assert clock.now == pytest.approx(2.5)
    pacer.consume(3000)
    assert clock.now == pytest.approx(4.0) and pacer.consumed == 4000
    unpaced = Pacer(0, clock=clock, sleep=clock.sleep)
    unpaced.consume(10**9)
    assert clock.now == pytest.approx(4.0)

    site = Site("s", str(tmp_path))
    (tmp_path / "f.bin").write_bytes(b"x" * 5000)
    slow = Pacer(1000, clock=clock, sleep=clock.sleep)
    assert paced_facts(site, "f.bin", slow) == hash_local(str(tmp_path / "f.bin"), fsync=False)
    assert slow.slept_s == pytest.approx(5.0)


def test_the_rate_comes_from_the_option_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEGREP_SCRUB_BYTES_PER_S", raising=False)
    assert scrub_rate(None) == DEFAULT_SCRUB_BYTES_PER_S
    monkeypatch.setenv("SEGREP_SCRUB_BYTES_PER_S", "123")
    assert scrub_rate(None) == 123 and scrub_rate(7) == 7
    for bad in ("-1", "1e6", "fast", str(2**41)):
        monkeypatch.setenv("SEGREP_SCRUB_BYTES_PER_S", bad)
        with pytest.raises(SegrepError, match="SEGREP_SCRUB_BYTES_PER_S"):
            scrub_rate(None)
