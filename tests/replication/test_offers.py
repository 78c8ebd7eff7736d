"""``segrep.replication.offers``, function by function: what a replica is offered and what it answers
(``offers_to``), a follower's forks (``forks_of``, ``pushes_from``), the leader's answer to a push
(``leader_decision``) and where a fast-forward batch may end (``whole_cuts``).

Most scenarios are partition snapshots built by hand (tests/support/snapshots.py), so each names exactly the
chain it is about; one reads a real catalog on both backends, to tie the hand-built snapshots to what the
catalog gives.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.catalog.queries import to_ref
from segrep.catalog.snapshot import snapshot
from segrep.core.chain import Chain, SegmentRef, referenced_ids
from segrep.core.hlc import FOREVER_US
from segrep.core.protocol import apply_fast_forward
from segrep.core.states import Outcome, PartitionState
from segrep.data.writer import write_batch
from segrep.replication.offers import forks_of, leader_decision, offers_to, pushes_from, whole_cuts
from segrep.replication.orchestrator import run_round
from tests.support.env import Env
from tests.support.rounds import no_spark
from tests.support.snapshots import Scenario
from tests.support.tables import TABLE, batch

FF, EXISTS, OOO = Outcome.FAST_FORWARD, Outcome.SEGMENT_EXISTS, Outcome.OUT_OF_ORDER
END = 10_000  # every segment of a scenario is committed before it unless it says otherwise


def ids(offers: Sequence[tuple[m.Segment, Outcome]]) -> list[tuple[str, Outcome]]:
    return [(seg.segment_id, outcome) for seg, outcome in offers]


def leader_with_major() -> Scenario:
    """primary: o, then M (a major folding o), then s1 <- s2 <- s3; dr holds M and s1 and acked them."""
    sc = Scenario.placed("primary", "dr")
    sc.seg("o", None, major=True)
    sc.seg("M", "o", included=["o"], major=True)
    sc.seg("s1", "M")
    sc.seg("s2", "s1")
    sc.seg("s3", "s2")
    sc.holds("primary", "o", "M", "s1", "s2", "s3")
    sc.holds("dr", "M", "s1")
    sc.ack("primary", ["M", "s1"], "dr")
    return sc


# -- offers_to --------------------------------------------------------------------------------------------------


def test_offers_follow_the_chain_from_the_newest_major_and_skip_what_the_replica_acked() -> None:
    part = leader_with_major().snapshot()
    offers, stuck = offers_to(part, part.replicas[0], END)
    assert ids(offers) == [("s2", FF), ("s3", FF)]  # o is behind the major: never offered
    assert not stuck


def test_an_empty_replica_is_offered_the_newest_major_first_then_each_segment_once() -> None:
    sc = leader_with_major()
    sc.lists["dr"].clear()
    sc.placements["dr"].root_segment_id = None
    sc.acks.clear()
    part = sc.snapshot()
    offers, stuck = offers_to(part, part.replicas[0], END)
    assert ids(offers) == [("M", FF), ("s1", FF), ("s2", FF), ("s3", FF)]
    assert not stuck


def test_nothing_committed_at_or_after_the_interval_end_is_offered_nor_anything_after_it() -> None:
    sc = leader_with_major()
    sc.seg("s2", "s1", committed_us=END)  # at the end: not this round's
    sc.seg("s3", "s2", committed_us=END - 1)  # before the end, but after s2 in offer order
    part = sc.snapshot()
    assert ids(offers_to(part, part.replicas[0], END)[0]) == []
    assert ids(offers_to(part, part.replicas[0], END + 1)[0]) == [("s2", FF), ("s3", FF)]


def test_a_reoffer_offers_everything_again_and_the_replica_answers_that_it_holds_it() -> None:
    part = leader_with_major().snapshot()
    offers, _ = offers_to(part, part.replicas[0], END, reoffer=True)
    assert ids(offers) == [("M", EXISTS), ("s1", EXISTS), ("s2", FF), ("s3", FF)]


def test_a_full_window_or_a_segment_in_flight_stops_the_offers_at_once() -> None:
    part = leader_with_major().snapshot()
    dr = part.replicas[0]
    full = frozenset({"x1", "x2"})
    assert ids(offers_to(part, dr, END, in_flight=full, max_incoming=2)[0]) == [("s2", Outcome.OVERLOADED)]
    assert ids(offers_to(part, dr, END, in_flight=frozenset({"s2"}))[0]) == [("s2", Outcome.INFLIGHT)]
    assert ids(offers_to(part, dr, END, in_flight=frozenset({"s3"}))[0]) == [("s2", FF), ("s3", Outcome.INFLIGHT)]


def test_out_of_order_restarts_from_the_newest_major_which_the_replica_fast_forwards() -> None:
    """dr's acks say it holds M and s1, but its chain is another one (r, which the leader took in long ago):
    s2 is out of order; the restart offers the chain again from M, which a follower always fast-forwards."""
    sc = leader_with_major()
    sc.seg("r", None, major=True)
    sc.lists["dr"][:] = ["r"]
    sc.placements["dr"].root_segment_id = "r"
    sc.ack("dr", ["r"], "primary")
    part = sc.snapshot()
    offers, stuck = offers_to(part, part.replicas[0], END)
    assert ids(offers) == [("s2", OOO), ("M", FF), ("s1", FF), ("s2", FF), ("s3", FF)]
    assert not stuck
    without_restart, stuck = offers_to(part, part.replicas[0], END, restart=False)
    assert (ids(without_restart), stuck) == ([("s2", OOO)], False)


def test_out_of_order_again_after_the_restart_is_stuck_until_a_new_major() -> None:
    """The leader's visible chain starts at a minor (its major collected): nothing the replica can take."""
    sc = Scenario.placed("primary", "dr")
    sc.seg("s1", "gone")
    sc.seg("s2", "s1")
    sc.seg("r", None, major=True)
    sc.holds("primary", "s1", "s2")
    sc.holds("dr", "r")
    sc.ack("primary", ["s1"], "dr")
    sc.ack("dr", ["r"], "primary")
    part = sc.snapshot()
    offers, stuck = offers_to(part, part.replicas[0], END)
    assert (ids(offers), stuck) == ([("s2", OOO), ("s1", OOO)], True)


def returned_old_leader() -> Scenario:
    """dr led once and wrote x on a; primary leads now: a <- b, then N (a major folding a and b) <- c."""
    sc = Scenario.placed("primary", "dr")
    sc.seg("a", None, major=True)
    sc.seg("x", "a")
    sc.seg("b", "a")
    sc.seg("N", "b", included=["a", "b"], major=True)
    sc.seg("c", "N")
    sc.holds("primary", "a", "b", "N", "c")
    sc.holds("dr", "a", "x")
    sc.ack("primary", ["a"], "dr")
    return sc


def test_a_fast_forward_that_would_drop_an_unmerged_fork_is_held_back_until_the_merge() -> None:
    """N would take x (not merged at the leader yet) off dr's chain: nothing is offered this round. Once the
    leader has merged x (acked it as dr's push), dr fast-forwards N and c."""
    sc = returned_old_leader()
    part = sc.snapshot()
    assert ids(offers_to(part, part.replicas[0], END)[0]) == []
    sc.ack("dr", ["x"], "primary")
    part = sc.snapshot()
    assert ids(offers_to(part, part.replicas[0], END)[0]) == [("N", FF), ("c", FF)]


def test_a_minor_past_the_common_segment_waits_for_the_merge_then_rewinds_there() -> None:
    """Without the major: b, based on a (the common segment), is UNMERGED while x is not merged, and a
    fast-forward (dr rewinds to a, the merge output brings x's rows) once it is."""
    sc = Scenario.placed("primary", "dr")
    sc.seg("a", None, major=True)
    sc.seg("x", "a")
    sc.seg("b", "a")
    sc.holds("primary", "a", "b")
    sc.holds("dr", "a", "x")
    sc.ack("primary", ["a"], "dr")
    part = sc.snapshot()
    assert ids(offers_to(part, part.replicas[0], END)[0]) == [("b", Outcome.UNMERGED)]
    sc.ack("dr", ["x"], "primary")
    part = sc.snapshot()
    assert ids(offers_to(part, part.replicas[0], END)[0]) == [("b", FF)]


def cascade() -> Scenario:
    """primary leads a <- b <- c; dr holds a, b and its own f (never at primary); edge is fed by dr."""
    sc = Scenario.placed("primary", "dr")
    sc.place("edge", feeder="dr")
    sc.seg("a", None, major=True)
    sc.seg("b", "a")
    sc.seg("c", "b")
    sc.seg("f", "b")
    sc.holds("primary", "a", "b", "c")
    sc.holds("dr", "a", "b", "f")
    sc.ack("primary", ["a", "b"], "dr")
    return sc


def test_a_feeder_offers_only_what_the_leader_holds_never_a_fork_of_its_own() -> None:
    part = cascade().snapshot()
    edge = part.replicas[1]
    assert part.sender_of(edge).placement_id == part.replicas[0].placement_id
    assert ids(offers_to(part, edge, END)[0]) == [("a", FF), ("b", FF)]


def test_a_replica_whose_feeder_fell_back_is_offered_the_leaders_chain() -> None:
    sc = cascade()
    sc.placements["edge"].feeder_fallback_us = 1
    part = sc.snapshot()
    assert ids(offers_to(part, part.replicas[1], END)[0]) == [("a", FF), ("b", FF), ("c", FF)]


# -- forks_of, pushes_from --------------------------------------------------------------------------------------


def test_forks_of_splits_a_followers_own_segments_into_merged_and_not_yet_merged() -> None:
    sc = returned_old_leader()
    sc.seg("y", "x")
    sc.holds("dr", "y")
    sc.ack("dr", ["x"], "primary")  # merged at the leader: it acked x as dr's push
    part = sc.snapshot()
    assert forks_of(part, part.replicas[0]) == (frozenset({"x"}), frozenset({"y"}))


def test_pushes_are_the_followers_segments_the_leader_lacks_oldest_first_and_due() -> None:
    sc = returned_old_leader()
    sc.seg("y", "x")
    sc.seg("z", "y", committed_us=END)
    sc.holds("dr", "y", "z")
    part = sc.snapshot()
    dr = part.replicas[0]
    assert [s.segment_id for s in pushes_from(part, dr, END)] == ["x", "y"]  # not a (primary holds it), not z
    assert [s.segment_id for s in pushes_from(part, dr, FOREVER_US)] == ["x", "y", "z"]
    sc.ack("dr", ["x"], "primary")
    assert [s.segment_id for s in pushes_from(sc.snapshot(), dr, END)] == ["y"]  # merged: not pushed again
    assert [s.segment_id for s in pushes_from(sc.snapshot(set_aside=["y"]), dr, END)] == []  # rolled back


def test_a_segment_folded_into_a_followers_major_goes_as_that_major_unless_the_leader_references_it() -> None:
    sc = Scenario.placed("primary", "dr")
    sc.seg("a", None, major=True)
    sc.seg("x1", "a")
    sc.seg("x2", "x1")
    sc.seg("X", "x2", included=["a", "x1", "x2"], major=True)
    sc.holds("primary", "a")
    sc.holds("dr", "a", "x1", "x2", "X")
    part = sc.snapshot()
    assert [s.segment_id for s in pushes_from(part, part.replicas[0], END)] == ["X"]
    sc.seg("L", "a", included=["a", "x1"], major=True)  # the leader's own major already holds x1
    sc.holds("primary", "L")
    part = sc.snapshot()
    assert [s.segment_id for s in pushes_from(part, part.replicas[0], END)] == ["x1", "X"]


# -- leader_decision --------------------------------------------------------------------------------------------


def test_the_leader_merges_a_fork_and_acks_what_it_references() -> None:
    sc = returned_old_leader()
    part = sc.snapshot()
    dr = part.replicas[0]
    x, a = part.segment(dr.placement_id, "x"), part.segment(dr.placement_id, "a")
    assert leader_decision(part, dr, x, frozenset(), 8) == Outcome.MERGE
    assert leader_decision(part, dr, a, frozenset(), 8) == EXISTS
    assert leader_decision(part, dr, x, frozenset({"p", "q"}), 2) == Outcome.OVERLOADED
    assert leader_decision(part, dr, x, frozenset({"x"}), 8) == Outcome.INFLIGHT


def test_an_empty_loading_leader_merges_what_it_would_fast_forward() -> None:
    sc = Scenario.placed("primary", "dr", state=PartitionState.LOADING)
    sc.seg("x", None, major=True)
    sc.holds("dr", "x")
    part = sc.snapshot()
    dr = part.replicas[0]
    assert leader_decision(part, dr, part.segment(dr.placement_id, "x"), frozenset(), 8) == Outcome.MERGE


# -- whole_cuts -------------------------------------------------------------------------------------------------


def cut_seg(sid: str, base: str | None, included: tuple[str, ...] = (), major: bool = False) -> m.Segment:
    return m.Segment(segment_id=sid, base_segment_id=base, included_segment_ids=list(included), is_major=major)


# the replica: a, then x (its own segment, or one an earlier leader gave it) at the root
REPLICA = Chain.of([SegmentRef("a", None), SegmentRef("x", "a")], "x")


def test_a_catch_up_that_takes_a_segment_off_and_back_may_end_only_before_the_major_or_after_the_merge() -> None:
    offers = [(cut_seg("M", "a", ("a",), True), FF), (cut_seg("s", "M"), FF), (cut_seg("O", "s", ("x",)), FF)]
    assert whole_cuts(REPLICA, offers) == [True, False, False, True]


def test_a_segment_no_later_offer_brings_back_does_not_hold_the_batch_open() -> None:
    """x is gone for good (the leader's chain never takes it back): every cut is as whole as the end."""
    offers = [(cut_seg("M", "a", ("a",), True), FF), (cut_seg("s", "M"), FF)]
    assert whole_cuts(REPLICA, offers) == [True, True, True]


def test_a_growing_chain_may_end_anywhere_and_answers_that_change_nothing_count_as_cuts() -> None:
    offers = [(cut_seg("y", "x"), FF), (cut_seg("z", "y"), EXISTS), (cut_seg("w", "y"), FF)]
    assert whole_cuts(REPLICA, offers) == [True, True, True, True]


def test_a_major_that_folds_what_it_takes_off_the_chain_keeps_it_whole() -> None:
    offers = [(cut_seg("M", "a", ("a", "x"), True), FF), (cut_seg("s", "M"), FF)]
    assert whole_cuts(REPLICA, offers) == [True, True, True]


def test_an_empty_replica_is_whole_after_every_offer() -> None:
    offers = [(cut_seg("a", None), FF), (cut_seg("M", None, ("a",), True), FF)]
    assert whole_cuts(Chain.of([], None), offers) == [True, True, True]


@st.composite
def catch_ups(draw: st.DrawFn) -> tuple[Chain, list[tuple[m.Segment, Outcome]]]:
    """A replica's chain and a batch of offers to it: fast-forwards onto the root (the chain grows), onto an
    older segment or none (a major or a rewind: references go), folding any known ids; and answers that
    change nothing (SEGMENT_EXISTS)."""
    n = draw(st.integers(1, 5))
    held = [SegmentRef(f"h{i}", f"h{i - 1}" if i else None) for i in range(n)]
    known = [r.segment_id for r in held]
    root = known[-1]
    offers: list[tuple[m.Segment, Outcome]] = []
    for i in range(draw(st.integers(0, 8))):
        sid = f"o{i}"
        if draw(st.booleans()):
            offers.append((cut_seg(sid, draw(st.sampled_from(known))), EXISTS))
            continue
        base = root if draw(st.booleans()) else draw(st.sampled_from([None, *known]))
        folded = tuple(draw(st.lists(st.sampled_from(known), max_size=3, unique=True)))
        offers.append((cut_seg(sid, base, folded, major=bool(folded)), FF))
        known.append(sid)
        root = sid
    return Chain.of(held, held[-1].segment_id), offers


@given(catch_ups())
def test_whole_cuts_equal_the_references_each_prefix_keeps_recomputed_from_scratch(
    case: tuple[Chain, list[tuple[m.Segment, Outcome]]],
) -> None:
    """``cuts[i]``: what the chain references now and no longer after the first i offers is also gone after
    all of them; checked against the chain rebuilt after every prefix (whole_cuts walks it only where a
    fast-forward leaves the root)."""
    chain, offers = case
    held = referenced_ids(chain)
    lacking = [held - referenced_ids(chain)]
    for seg, outcome in offers:
        if outcome == FF:
            chain = apply_fast_forward(chain, to_ref(seg))
        lacking.append(held - referenced_ids(chain))
    cuts = whole_cuts(Chain.of(case[0].segments, case[0].root), offers)
    assert cuts == [gone <= lacking[-1] for gone in lacking]
    assert cuts[0] and cuts[-1]


# -- over a real catalog ----------------------------------------------------------------------------------------


def test_a_replica_is_offered_the_leaders_segments_in_write_order_and_nothing_once_it_holds_them(env: Env) -> None:
    written = [write_batch(env.catalog, TABLE, batch(range(k, k + 8), f"w{k}")).segments for k in (0, 8, 16)]
    with env.catalog.read() as s:
        snap = snapshot(s, TABLE)
        by_partition = {p.partition.partition_id: p for p in snap.partitions}
        for part in snap.partitions:
            assert {r.site_id for r in part.replicas} == {snap.site_id("dr"), snap.site_id("edge")}
        end = max(row.committed_us for row in s.scalars(select(m.Segment))) + 1
    for pid, part in by_partition.items():
        in_order = [seg.segment_id for segs in written for seg in segs if seg.partition_id == pid]
        assert len(in_order) == 3
        for replica in part.replicas:
            offers, stuck = offers_to(part, replica, end)
            assert ids(offers) == [(sid, FF) for sid in in_order]
            assert not stuck and not pushes_from(part, replica, end)
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).status == "ok"
    with env.catalog.read() as s:
        for part in snapshot(s, TABLE).partitions:
            assert all(offers_to(part, r, FOREVER_US)[0] == [] for r in part.replicas)
