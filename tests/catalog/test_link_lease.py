"""Link leases (issue 36): a holder's background beats renew its slot, follow the shares as holders come and
go and as the cap changes, admit a waiting holder when a slot frees, and release the slot on exit; a link
without limits takes no slot. Real threads with beats of 0.1 s; waits are bounded polls, not sleeps."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from segrep.catalog import Catalog
from segrep.catalog import link_slots as lk
from segrep.catalog.link_lease import LinkLease, LinkPacing
from segrep.core import hlc
from segrep.core.links import CopyPriority
from segrep.storage.live_rates import read_rate
from segrep.storage.pacing import FollowingPacer
from segrep.storage.transport import CopyItem, CopyOutcome, task_pacer
from tests.support.env import Env
from tests.support.polling import eventually

BEAT_S = 0.1
TTL_US = 3_000_000


@pytest.fixture
def lease_catalog(env: Env) -> Iterator[Catalog]:
    yield env.catalog


def lease(catalog: Catalog, what: CopyPriority, limits: Callable[[], lk.Limits]) -> LinkLease:
    return LinkLease(catalog, "primary", "dr", what, limits, beat_s=BEAT_S, ttl_us=TTL_US)


def holders(catalog: Catalog) -> dict[str, lk.SlotView]:
    with catalog.read() as s:
        return {v.holder: v for v in lk.slots(s, hlc.now_us())}


def test_leases_follow_the_shares_and_a_cap_change(lease_catalog: Catalog) -> None:
    cap = [lk.Limits(cap_bytes_per_s=10_000)]
    with lease(lease_catalog, CopyPriority.BOOTSTRAP, lambda: cap[0]) as boot:
        assert boot.pacer.rate == 10_000  # alone: all of it
        with lease(lease_catalog, CopyPriority.ROUND, lambda: cap[0]) as rnd:
            assert eventually(lambda: (rnd.pacer.rate, boot.pacer.rate) == (8000, 2000))
            assert set(holders(lease_catalog)) == {rnd.holder, boot.holder}
            cap[0] = lk.Limits(cap_bytes_per_s=1000)  # a window closes
            assert eventually(lambda: (rnd.pacer.rate, boot.pacer.rate) == (800, 200))
            assert sum(v.share or 0 for v in holders(lease_catalog).values()) <= 1000
        assert set(holders(lease_catalog)) == {boot.holder}  # released on exit
        assert eventually(lambda: boot.pacer.rate == 1000)
    assert holders(lease_catalog) == {}


def test_a_holder_waits_for_a_slot_and_enters_when_it_frees(lease_catalog: Catalog) -> None:
    one = lk.Limits(cap_bytes_per_s=5000, max_concurrent=1)
    entered = threading.Event()

    def second() -> None:
        with lease(lease_catalog, CopyPriority.SCRUB, lambda: one) as scrub:
            assert scrub.pacer.rate > 0 or scrub.grant.share == 0
            entered.set()

    with lease(lease_catalog, CopyPriority.ROUND, lambda: one):
        waiter = threading.Thread(target=second)
        waiter.start()
        assert eventually(lambda: any(v.waiting for v in holders(lease_catalog).values()))
        assert not entered.is_set()
    assert entered.wait(10.0)
    waiter.join()


def test_a_dead_holders_slot_lapses_and_an_unlimited_link_takes_none(lease_catalog: Catalog) -> None:
    cap = lk.Limits(cap_bytes_per_s=6000)
    with lease_catalog.write() as s:  # a holder that died right after taking its slot: it never renews
        lk.acquire(s, lk.Link(1, 2), "dead", CopyPriority.ROUND, cap, hlc.now_us(), TTL_US)
    with lease(lease_catalog, CopyPriority.ROUND, lambda: cap) as alive:
        assert alive.pacer.rate == 0  # admitted, but "dead" holds the whole cap until its slot lapses
        started = time.monotonic()
        assert eventually(lambda: alive.pacer.rate == 6000)  # it lapsed after its TTL
        assert time.monotonic() - started < TTL_US / 1e6 + 2
    with LinkPacing(lease_catalog, CopyPriority.ROUND) as free:
        assert free.pacer("primary", "dr") is None
        assert holders(lease_catalog) == {}
    with LinkPacing(lease_catalog, CopyPriority.ROUND, lambda source, target: cap) as capped:
        pacer = capped.pacer("primary", "dr")
        assert pacer is not None and capped.pacer("primary", "dr") is pacer  # one lease per link
        assert len(holders(lease_catalog)) == 1
    assert holders(lease_catalog) == {}


def test_a_batch_handed_to_spark_holds_a_slot_and_its_items_carry_their_share(
    lease_catalog: Catalog, tmp_path: Path
) -> None:
    cap = lk.Limits(cap_bytes_per_s=8000)
    seen: list[CopyItem] = []
    held: list[dict[str, lk.SlotView]] = []

    def spark(items: list[CopyItem]) -> list[CopyOutcome]:
        seen.extend(items)
        held.append(holders(lease_catalog))
        return [CopyOutcome(i.relpath, True) for i in items]

    def item(n: int, target: str) -> CopyItem:
        return CopyItem("primary", "sites/primary", target, f"sites/{target}", f"t/{n}.parquet", 10, "0" * 64)

    limits = {("primary", "dr"): cap}
    with LinkPacing(lease_catalog, CopyPriority.ROUND, lambda s, t: limits.get((s, t))) as pacing:
        outcomes = pacing.paced_batches(spark, tmp_path)([item(1, "dr"), item(2, "dr"), item(3, "dr"), item(4, "edge")])
    assert [o.ok for o in outcomes] == [True] * 4
    assert [i.bytes_per_s for i in seen] == [2666, 2666, 2666, None]  # the share over the link's 3 tasks
    rate_file = seen[0].rate_file
    assert rate_file is not None and [i.rate_file for i in seen] == [rate_file] * 3 + [None]  # no link to edge
    assert Path(rate_file).parent == tmp_path and not Path(rate_file).exists()  # removed after the batch
    assert [v.what for v in held[0].values()] == [CopyPriority.ROUND]  # the driver held one slot meanwhile
    assert holders(lease_catalog) == {}  # released after the batch


def test_a_cap_lowered_during_a_spark_batch_slows_the_copies_already_running(
    lease_catalog: Catalog, tmp_path: Path
) -> None:
    """The batch's tasks follow the share the driver's beats write to the rate file: a window that lowers the
    cap mid-batch slows the rest of a file being copied (bytes counted over a fake clock's time in the task,
    the driver's beats real)."""
    mib = 1024 * 1024
    cap = {("primary", "dr"): lk.Limits(cap_bytes_per_s=8 * mib)}
    moved: list[tuple[float, int]] = []
    rates_seen: list[int | None] = []

    def spark(items: list[CopyItem]) -> list[CopyOutcome]:
        clock = [0.0]
        pacers = [task_pacer(i, lambda: clock[0], lambda s: clock.__setitem__(0, clock[0] + s)) for i in items]
        assert all(isinstance(p, FollowingPacer) for p in pacers)

        def copy_for(seconds: float) -> None:  # both tasks copy one chunk after the other, in step
            until = clock[0] + seconds
            while clock[0] < until:
                for p in pacers:
                    assert p is not None
                    n = p.chunk_bytes(4 * mib)
                    moved.append((clock[0], n))
                    p.consume(n)

        copy_for(10.0)
        rate_file = items[0].rate_file
        assert rate_file is not None
        rates_seen.append(read_rate(rate_file, "primary", "dr"))
        cap[("primary", "dr")] = lk.Limits(cap_bytes_per_s=2 * mib)  # a window starts
        assert eventually(lambda: read_rate(rate_file, "primary", "dr") == mib)  # the driver's next beats
        rates_seen.append(read_rate(rate_file, "primary", "dr"))
        copy_for(10.0)
        return [CopyOutcome(i.relpath, True) for i in items]

    def item(n: int) -> CopyItem:
        return CopyItem("primary", "sites/primary", "dr", "sites/dr", f"t/{n}.parquet", 10, "0" * 64)

    with LinkPacing(lease_catalog, CopyPriority.ROUND, lambda s, t: cap.get((s, t))) as pacing:
        pacing.paced_batches(spark, tmp_path)([item(1), item(2)])
    assert rates_seen == [4 * mib, mib]  # per task: the cap over the batch's two tasks

    def between(start: float, end: float) -> int:
        return sum(n for at, n in moved if start <= at < end)

    assert 0.9 * 80 * mib <= between(0, 10) <= 1.1 * 80 * mib  # 8 MiB/s for both tasks together
    assert between(11.5, 19.5) <= 1.1 * 2 * mib * 8  # within a second and a chunk: the new cap, in total
    assert between(11.5, 19.5) >= 0.9 * 2 * mib * 8


def test_a_cap_change_reaches_a_holder_within_five_seconds_at_the_default_beat(lease_catalog: Catalog) -> None:
    cap = [lk.Limits(cap_bytes_per_s=50_000)]
    with LinkLease(lease_catalog, "primary", "dr", CopyPriority.ROUND, lambda: cap[0]) as held:
        assert held.pacer.rate == 50_000
        cap[0] = lk.Limits(cap_bytes_per_s=5_000)  # a window closes
        changed = time.monotonic()
        assert eventually(lambda: held.pacer.rate == 5_000, timeout_s=5.0)
        assert time.monotonic() - changed < 5.0


def test_a_round_pauses_a_bootstrap_holding_the_only_slot(lease_catalog: Catalog) -> None:
    one = lk.Limits(cap_bytes_per_s=4000, max_concurrent=1)
    with lease(lease_catalog, CopyPriority.BOOTSTRAP, lambda: one) as boot:
        assert boot.pacer.rate == 4000
        with lease(lease_catalog, CopyPriority.ROUND, lambda: one) as rnd:  # enters at once
            assert eventually(lambda: boot.grant.waiting and boot.pacer.paced and boot.pacer.rate == 0)
            assert eventually(lambda: rnd.pacer.rate == 4000)
        assert eventually(lambda: not boot.grant.waiting and boot.pacer.rate == 4000)  # resumed
