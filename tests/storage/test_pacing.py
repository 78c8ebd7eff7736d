"""The scrub's pacing: bytes never run ahead of the rate (a fake clock: no timing in the test)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from segrep.core.errors import SegrepError
from segrep.storage.atomic import hash_local
from segrep.storage.pacing import DEFAULT_SCRUB_BYTES_PER_S, Pacer, paced_facts, scrub_rate
from segrep.storage.site import Site
from tests.support.fake_clock import FakeClock


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


def test_a_rate_change_applies_to_the_next_bytes_and_an_idle_credit_is_bounded() -> None:
    clock = FakeClock()
    pacer = Pacer(1000, clock=clock, sleep=clock.sleep, burst_s=0.25)
    pacer.consume(500)
    assert clock.now == pytest.approx(0.5)
    pacer.set_rate(2000)  # the share grew: the next bytes go twice as fast
    pacer.consume(1000)
    assert clock.now == pytest.approx(1.0) and pacer.rate == 2000 and pacer.paced
    clock.now += 10.0  # idle: at most a quarter second's worth may go without waiting
    pacer.consume(1000)
    assert clock.now == pytest.approx(11.25)
    pacer.set_rate(None)
    pacer.consume(10**9)
    assert clock.now == pytest.approx(11.25) and not pacer.paced
    assert pacer.chunk_bytes(4 << 20) == 4 << 20
    pacer.set_rate(1 << 20)
    assert pacer.chunk_bytes(4 << 20) == 256 * 1024  # a quarter second's worth, not 4 s
    pacer.set_rate(1000)
    assert pacer.chunk_bytes(4 << 20) == 64 * 1024


def test_a_held_pacer_stops_its_consumers_until_a_rate_is_set() -> None:
    pacer = Pacer(1000)
    pacer.hold()
    done = threading.Event()

    def copy() -> None:
        pacer.consume(1)
        done.set()

    worker = threading.Thread(target=copy)
    worker.start()
    assert not done.wait(0.3)  # held
    pacer.set_rate(None)
    assert done.wait(5.0)
    worker.join()


def test_threads_sharing_a_pacer_never_go_faster_together_than_its_rate() -> None:
    rate, chunk, per_thread, threads = 4 << 20, 64 * 1024, 8, 4
    pacer = Pacer(rate, burst_s=0.05)
    started = time.monotonic()
    workers = [
        threading.Thread(target=lambda: [pacer.consume(chunk) for _ in range(per_thread)]) for _ in range(threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.monotonic() - started
    total = chunk * per_thread * threads  # 2 MiB at 4 MiB/s: half a second, less the burst and one chunk
    assert pacer.consumed == total
    assert elapsed >= (total - chunk) / rate - 0.05
