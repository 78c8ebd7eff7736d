"""Link slots on SQLite and PostgreSQL (issue 36): shares of a capped link by class, the sum of the live
holders' shares within the cap after every step, concurrency (who waits, who is admitted first), a dead
holder's expiry and a cap change. Times are given explicitly: nothing here sleeps."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from segrep.catalog import Catalog
from segrep.catalog import link_slots as lk
from segrep.core.links import CopyPriority
from tests.support.env import Env

LINK = lk.Link(1, 2)  # primary -> dr of ORDERS_YAML
TTL = 5_000_000
T0 = 1_000_000_000_000


@pytest.fixture
def slots_catalog(env: Env) -> Iterator[Catalog]:
    yield env.catalog


def acquire(catalog: Catalog, holder: str, what: CopyPriority, limits: lk.Limits, now: int = T0) -> lk.Grant:
    with catalog.write() as s:
        return lk.acquire(s, LINK, holder, what, limits, now, TTL)


def renew(catalog: Catalog, holder: str, limits: lk.Limits, now: int = T0) -> lk.Grant:
    with catalog.write() as s:
        return lk.renew(s, LINK, holder, limits, now, TTL)


def live(catalog: Catalog, now: int = T0) -> dict[str, lk.SlotView]:
    with catalog.read() as s:
        return {v.holder: v for v in lk.slots(s, now)}


def total(catalog: Catalog, now: int = T0) -> int:
    return sum(v.share or 0 for v in live(catalog, now).values())


def test_fair_shares_follow_the_weights_and_never_exceed_the_cap() -> None:
    assert lk.fair_shares(10_000, {"r": CopyPriority.ROUND, "b": CopyPriority.BOOTSTRAP}) == {"r": 8000, "b": 2000}
    three = lk.fair_shares(1000, {"r": CopyPriority.ROUND, "f": CopyPriority.FAILBACK, "s": CopyPriority.SCRUB})
    assert three == {"r": 615, "f": 307, "s": 76} and sum(three.values()) <= 1000
    assert lk.fair_shares(None, {"r": CopyPriority.ROUND}) == {"r": None}
    assert lk.fair_shares(500, {"s": CopyPriority.SCRUB}) == {"s": 500}  # alone, a class takes all
    with pytest.raises(ValueError, match="more than 0"):
        lk.Limits(cap_bytes_per_s=0)
    with pytest.raises(ValueError, match="at least 1"):
        lk.Limits(max_concurrent=0)


def test_a_round_and_a_bootstrap_converge_to_their_weights_within_the_cap(slots_catalog: Catalog) -> None:
    cap = lk.Limits(cap_bytes_per_s=10_000)
    assert acquire(slots_catalog, "boot", CopyPriority.BOOTSTRAP, cap) == lk.Grant(10_000, False)
    # the round arrives while the bootstrap holds everything: it gets what is left until the bootstrap renews
    assert acquire(slots_catalog, "round", CopyPriority.ROUND, cap) == lk.Grant(0, False)
    assert total(slots_catalog) <= 10_000
    assert renew(slots_catalog, "boot", cap).share == 2000
    assert total(slots_catalog) <= 10_000
    assert renew(slots_catalog, "round", cap).share == 8000
    assert total(slots_catalog) == 10_000
    views = live(slots_catalog)
    assert views["round"].what == CopyPriority.ROUND and not views["round"].waiting
    with slots_catalog.read() as s:
        assert lk.budget(s, LINK) == cap
    # the round leaves: the bootstrap takes the whole cap at its next renew
    with slots_catalog.write() as s:
        assert lk.release(s, "round") and not lk.release(s, "round")
    assert renew(slots_catalog, "boot", cap).share == 10_000


def test_a_holder_beyond_the_concurrency_waits_and_a_higher_class_pauses_a_lower_one(slots_catalog: Catalog) -> None:
    one = lk.Limits(cap_bytes_per_s=1000, max_concurrent=1)
    assert acquire(slots_catalog, "scrub", CopyPriority.SCRUB, one, T0) == lk.Grant(1000, False)
    assert acquire(slots_catalog, "verify", CopyPriority.VERIFY, one, T0 + 1) == lk.Grant(0, True)  # same weight
    # a bootstrap pauses the scrub: admitted at once, but its share grows only once the scrub has paused
    assert acquire(slots_catalog, "boot", CopyPriority.BOOTSTRAP, one, T0 + 2) == lk.Grant(0, False)
    assert total(slots_catalog) <= 1000
    assert renew(slots_catalog, "scrub", one) == lk.Grant(0, True)
    assert renew(slots_catalog, "boot", one) == lk.Grant(1000, False)
    # a round pauses the bootstrap in turn: a long bootstrap never keeps a round waiting
    assert acquire(slots_catalog, "round", CopyPriority.ROUND, one, T0 + 3) == lk.Grant(0, False)
    assert renew(slots_catalog, "boot", one) == lk.Grant(0, True)
    assert renew(slots_catalog, "verify", one) == lk.Grant(0, True)  # nothing lower to pause
    assert renew(slots_catalog, "round", one) == lk.Grant(1000, False)
    views = live(slots_catalog)
    assert [h for h, v in views.items() if v.waiting] == ["boot", "scrub", "verify"]  # status order: class, age
    with slots_catalog.write() as s:
        lk.release(s, "round")
    # the slot is free: the scrub renews first but the paused bootstrap is ahead of it
    assert renew(slots_catalog, "scrub", one) == lk.Grant(0, True)
    assert renew(slots_catalog, "boot", one) == lk.Grant(1000, False)
    assert total(slots_catalog) == 1000


def test_a_dead_holder_expires_and_its_share_goes_to_the_others(slots_catalog: Catalog) -> None:
    cap = lk.Limits(cap_bytes_per_s=9000, max_concurrent=2)
    acquire(slots_catalog, "dead", CopyPriority.ROUND, cap)
    acquire(slots_catalog, "alive", CopyPriority.ROUND, cap)
    assert renew(slots_catalog, "dead", cap).share == 4500
    mid, later = T0 + TTL // 2, T0 + TTL
    assert renew(slots_catalog, "alive", cap, mid).share == 4500
    assert acquire(slots_catalog, "third", CopyPriority.ROUND, cap, mid).waiting  # over the concurrency
    # "dead" never renews again; one TTL after its last renew the others' renews drop it
    assert renew(slots_catalog, "third", cap, later) == lk.Grant(4500, False)  # admitted, in the dead's place
    assert renew(slots_catalog, "alive", cap, later).share == 4500
    assert renew(slots_catalog, "third", cap, later).share == 4500
    assert set(live(slots_catalog, later)) == {"alive", "third"}
    # a holder that stopped for longer than a TTL finds its slot gone and must acquire again
    assert renew(slots_catalog, "dead", cap, later).lost


def test_a_cap_change_takes_effect_at_the_holders_next_renews(slots_catalog: Catalog) -> None:
    old, new = lk.Limits(cap_bytes_per_s=10_000), lk.Limits(cap_bytes_per_s=1000)
    acquire(slots_catalog, "round", CopyPriority.ROUND, old)
    acquire(slots_catalog, "boot", CopyPriority.BOOTSTRAP, old)
    renew(slots_catalog, "round", old)
    renew(slots_catalog, "boot", old)
    assert total(slots_catalog) == 10_000
    # the window closes: the first to renew takes only what the other leaves under the new cap
    assert renew(slots_catalog, "round", new).share == 0
    assert renew(slots_catalog, "boot", new).share == 200
    assert renew(slots_catalog, "round", new).share == 800
    assert total(slots_catalog) == 1000
    with slots_catalog.read() as s:
        assert lk.budget(s, LINK) == new
    # unlimited again: shares are unpaced
    free = lk.Limits()
    assert renew(slots_catalog, "round", free).share is None
    assert renew(slots_catalog, "boot", free).share is None


def test_status_says_the_rate_in_force_and_why_each_holder_waits(slots_catalog: Catalog) -> None:
    two = lk.Limits(cap_bytes_per_s=10_000, max_concurrent=2)
    acquire(slots_catalog, "round", CopyPriority.ROUND, two, T0)
    acquire(slots_catalog, "boot", CopyPriority.BOOTSTRAP, two, T0 + 1)
    acquire(slots_catalog, "scrub", CopyPriority.SCRUB, two, T0 + 2)
    acquire(slots_catalog, "verify", CopyPriority.VERIFY, two, T0 + 3)
    renew(slots_catalog, "round", two)
    renew(slots_catalog, "boot", two)
    with slots_catalog.read() as s:
        (state,) = lk.link_states(s, T0)
    assert state.link == LINK and state.limits == two
    assert [v.holder for v in state.holders] == ["round", "boot"] and state.rate == 10_000
    assert [(v.holder, why) for v, why in state.waiting] == [
        ("scrub", "the link allows 2 copies at once, all held (bootstrap, round)"),
        ("verify", "the link allows 2 copies at once, all held (bootstrap, round); 1 waiting ahead of it"),
    ]
