"""Where a fast-forward batch may end (``offers.whole_cuts``): never where the replica's chain lacks rows a
later offer of the same catch-up brings back."""

from __future__ import annotations

from segrep.catalog import models as m
from segrep.core.chain import Chain, SegmentRef
from segrep.core.states import Outcome
from segrep.replication.offers import whole_cuts

FF, EXISTS = Outcome.FAST_FORWARD, Outcome.SEGMENT_EXISTS


def seg(sid: str, base: str | None, included: tuple[str, ...] = (), major: bool = False) -> m.Segment:
    return m.Segment(segment_id=sid, base_segment_id=base, included_segment_ids=list(included), is_major=major)


# the replica: a, then x (its own segment, or one an earlier leader gave it) at the root
REPLICA = Chain.of([SegmentRef("a", None), SegmentRef("x", "a")], "x")


def test_a_catch_up_that_takes_a_segment_off_and_back_may_end_only_before_the_major_or_after_the_merge() -> None:
    offers = [(seg("M", "a", ("a",), True), FF), (seg("s", "M"), FF), (seg("O", "s", ("x",)), FF)]
    assert whole_cuts(REPLICA, offers) == [True, False, False, True]


def test_a_segment_no_later_offer_brings_back_does_not_hold_the_batch_open() -> None:
    """x is gone for good (the leader's chain never takes it back): every cut is as whole as the end."""
    offers = [(seg("M", "a", ("a",), True), FF), (seg("s", "M"), FF)]
    assert whole_cuts(REPLICA, offers) == [True, True, True]


def test_a_growing_chain_may_end_anywhere_and_answers_that_change_nothing_count_as_cuts() -> None:
    offers = [(seg("y", "x"), FF), (seg("z", "y"), EXISTS), (seg("w", "y"), FF)]
    assert whole_cuts(REPLICA, offers) == [True, True, True, True]


def test_a_major_that_folds_what_it_takes_off_the_chain_keeps_it_whole() -> None:
    offers = [(seg("M", "a", ("a", "x"), True), FF), (seg("s", "M"), FF)]
    assert whole_cuts(REPLICA, offers) == [True, True, True]


def test_an_empty_replica_is_whole_after_every_offer() -> None:
    offers = [(seg("a", None), FF), (seg("M", None, ("a",), True), FF)]
    assert whole_cuts(Chain.of([], None), offers) == [True, True, True]
