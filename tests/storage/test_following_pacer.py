"""A pacer that follows a rate set elsewhere (a Spark task's or a merge reader's share of a link, issue 36): a
cap lowered while a file is copied or read slows its remaining bytes within a second and a chunk; a hold
stops them; a rate file that cannot be read leaves the last rate. Bytes are counted over a fake clock's time
as they move: no timing in the test."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from segrep.storage.content import ContentSum, load_local, load_stream
from segrep.storage.live_rates import follower, read_rate, write_rates
from segrep.storage.pacing import FollowingPacer, Pacer
from segrep.storage.site import Site
from segrep.storage.transport import CopyItem, task_pacer
from tests.support.fake_clock import FakeClock

MIB = 1024 * 1024


class Moves:
    """The bytes a pacer was asked to pay for, at the (fake) time they moved: just before ``consume``."""

    def __init__(self, pacer: Pacer, clock: FakeClock) -> None:
        self.at: list[tuple[float, int]] = []
        inner = pacer.consume

        def consume(n: int) -> None:
            self.at.append((clock.now, n))
            inner(n)

        pacer.consume = consume  # type: ignore[method-assign]

    def between(self, start: float, end: float) -> int:
        return sum(n for t, n in self.at if start <= t < end)


def schedule(
    clock: FakeClock, steps: list[tuple[float, int | None]], broken: tuple[float, float] = (0, 0)
) -> Callable[[], int | None]:
    """A ``follow`` giving the rate of the last step started by now; raising OSError within ``broken``."""

    def follow() -> int | None:
        if broken[0] <= clock.now < broken[1]:
            raise OSError("rate file away")
        rate = steps[0][1]
        for start, r in steps:
            if clock.now >= start:
                rate = r
        return rate

    return follow


def run(pacer: Pacer, clock: FakeClock, until: float) -> None:
    while clock.now < until:
        pacer.consume(pacer.chunk_bytes(4 * MIB))


def test_a_lowered_rate_slows_the_rest_of_a_copy_and_a_hold_stops_it() -> None:
    clock = FakeClock()
    steps: list[tuple[float, int | None]] = [(0, 4 * MIB), (10, MIB), (20, 0), (22, 2 * MIB)]
    pacer = FollowingPacer(4 * MIB, schedule(clock, steps, broken=(25, 28)), clock, clock.sleep)
    moves = Moves(pacer, clock)
    run(pacer, clock, 32.0)
    assert 0.9 * 40 * MIB <= moves.between(0, 10) <= 1.1 * 40 * MIB
    # asked again within a second of the change: from then on at most the new rate (one chunk's slack)
    assert 0.9 * 8 * MIB <= moves.between(11.5, 19.5) <= 1.1 * 8 * MIB
    assert moves.between(10, 20) <= 1.1 * (4 * MIB * 1.25 + 9 * MIB)
    assert moves.between(21.5, 22) == 0  # held: nothing moves until a rate is set again
    # back at 2 MiB/s, and kept while the rate cannot be read (25 to 28)
    assert 0.9 * 16 * MIB <= moves.between(23.5, 31.5) <= 1.1 * 16 * MIB


def test_an_unpaced_start_follows_a_cap_that_begins_later() -> None:
    clock = FakeClock()
    pacer = FollowingPacer(0, schedule(clock, [(0, None), (5, MIB)]), clock, clock.sleep)
    moves = Moves(pacer, clock)
    assert pacer.paced  # never the kernel's copy: a rate may come at any chunk
    for _ in range(3):  # unpaced: no time passes
        pacer.consume(10 * MIB)
    assert clock.now == 0.0
    clock.now = 5.0  # a window starts
    run(pacer, clock, 15.0)
    assert moves.between(6.5, 15) <= 1.1 * 8.5 * MIB


def test_a_copy_task_follows_its_items_rate_file(tmp_path: Path) -> None:
    rates = tmp_path / "rates.json"
    write_rates(rates, {("primary", "dr"): 2 * MIB, ("primary", "edge"): None})
    assert read_rate(rates, "primary", "dr") == 2 * MIB and read_rate(rates, "primary", "edge") is None
    with pytest.raises(ValueError, match="names no link"):
        read_rate(rates, "dr", "primary")
    item = CopyItem("primary", "p", "dr", "d", "t/1.parquet", 10, "0" * 64, bytes_per_s=2 * MIB, rate_file=str(rates))
    clock = FakeClock()
    pacer = task_pacer(item, clock, clock.sleep)
    assert isinstance(pacer, FollowingPacer) and pacer.rate == 2 * MIB
    moves = Moves(pacer, clock)
    run(pacer, clock, 5.0)
    write_rates(rates, {("primary", "dr"): MIB // 4, ("primary", "edge"): None})  # the holder's beat
    run(pacer, clock, 15.0)
    assert 0.9 * 10 * MIB <= moves.between(0, 5) <= 1.1 * 10 * MIB
    assert moves.between(6.5, 15) <= 1.1 * 8.5 * MIB // 4
    fixed = task_pacer(CopyItem("primary", "p", "dr", "d", "t/1.parquet", 10, "0" * 64, bytes_per_s=MIB))
    assert type(fixed) is Pacer and fixed.rate == MIB  # no rate file: the share it was given
    assert task_pacer(CopyItem("primary", "p", "dr", "d", "t/1.parquet", 10, "0" * 64)) is None


@pytest.mark.parametrize("rate_after", [256 * 1024, 0])
def test_a_merge_input_is_paid_per_chunk_as_it_is_read(tmp_path: Path, rate_after: int) -> None:
    """A file read across a link (``Site.read_segment(pace=...)``, what a merge's reader runs): its bytes are
    paid as they are read, so a share lowered after the first second slows the rest of the file (or, held,
    stops it until a rate is set again) instead of the whole file being paid up front."""
    root = tmp_path / "site"
    (root / "t").mkdir(parents=True)
    table = pa.table({"k": pa.array(range(3000), pa.int64()), "v": [os.urandom(500).hex() for _ in range(3000)]})
    pq.write_table(table, root / "t" / "f.parquet", compression="none", write_page_checksum=True)
    size = (root / "t" / "f.parquet").stat().st_size
    assert size > 2 * MIB
    clock = FakeClock()
    steps: list[tuple[float, int | None]] = [(0, MIB), (1, rate_after)]
    if rate_after == 0:
        steps.append((5, 256 * 1024))  # held for four seconds, then the lower rate
    pacer = FollowingPacer(MIB, schedule(clock, steps), clock, clock.sleep)
    moves = Moves(pacer, clock)
    got = Site("dr", str(root)).read_segment("t/f.parquet", pace=pacer)
    assert got.equals(table) and sum(n for _, n in moves.at) == size
    end = clock.now
    resumed = 2.5 if rate_after else 5.0
    assert moves.between(resumed, end + 1) <= 1.1 * 256 * 1024 * (end - resumed) + 64 * 1024
    assert end >= 1 + (size - 1.5 * MIB) / (256 * 1024)  # not the 3 s the first share would have taken
    if not rate_after:
        assert moves.between(2.5, 5.0) == 0


def test_follower_reads_again_each_time(tmp_path: Path) -> None:
    rates = tmp_path / "r.json"
    follow: Callable[[], int | None] = follower(rates, "a", "b")
    with pytest.raises(OSError):
        follow()
    write_rates(rates, {("a", "b"): 5})
    assert follow() == 5
    write_rates(rates, {("a", "b"): 0})
    assert follow() == 0


@pytest.mark.parametrize("how", ["local", "stream"])
def test_a_checked_read_pays_each_chunk_as_it_loads_the_file(tmp_path: Path, how: str) -> None:
    """``read_checked``'s load (``storage.content``), local file or store stream: the bytes and their digest
    are those of the file, and a share lowered one second in slows the rest of the load."""
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(3 * MIB))
    clock = FakeClock()
    pacer = FollowingPacer(MIB, schedule(clock, [(0, MIB), (1, 256 * 1024)]), clock, clock.sleep)
    moves = Moves(pacer, clock)
    if how == "local":
        loaded = load_local(str(path), ContentSum.SHA256, pacer)
    else:
        with open(path, "rb") as stream:
            loaded = load_stream(stream, ContentSum.SHA256, pacer)
    assert loaded.data.to_pybytes() == path.read_bytes()
    assert loaded.hexdigest == load_local(str(path), ContentSum.SHA256).hexdigest
    assert sum(n for _, n in moves.at) == 3 * MIB
    end = clock.now
    assert moves.between(2.5, end + 1) <= 1.1 * 256 * 1024 * (end - 2.5) + 64 * 1024
    assert end >= 1 + 1.5 * MIB / (256 * 1024)
