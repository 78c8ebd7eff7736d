"""Tests of segrep.core.protocol: every branch of the receive procedure (EventQL 3.5), the sender's reactions,
the two ABA scenarios of EventQL 3.6, and properties over generated chains."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from segrep.core.chain import (
    Chain,
    LocalAction,
    SegmentRef,
    follower_action,
    is_referenced,
    is_strongly_referenced,
    offer_order,
    visible_segments,
)
from segrep.core.protocol import (
    MAX_REPL_INCOMING_SEGMENTS,
    Offer,
    ReceiverView,
    apply_fast_forward,
    receive_decision,
    sender_reaction,
)
from segrep.core.states import Outcome, PartitionState, Reaction
from tests.support.chains import Built, built_chains, ids, seg

LEADER_PID = 7
FOLLOWER_PID = 9
EPOCH = 4


def follower_view(chain: Chain, in_flight: frozenset[str] = frozenset(), **kw: object) -> ReceiverView:
    """A LIVE follower whose current leader placement is LEADER_PID at EPOCH."""
    args: dict[str, object] = {
        "placement_id": FOLLOWER_PID,
        "chain": chain,
        "is_leader": False,
        "partition_state": PartitionState.LIVE,
        "leader_placement_id": LEADER_PID,
        "epoch": EPOCH,
        "in_flight": in_flight,
    }
    args.update(kw)
    return ReceiverView(**args)  # type: ignore[arg-type]


def leader_view(chain: Chain, state: PartitionState = PartitionState.LIVE, **kw: object) -> ReceiverView:
    args: dict[str, object] = {
        "placement_id": LEADER_PID,
        "chain": chain,
        "is_leader": True,
        "partition_state": state,
        "leader_placement_id": LEADER_PID,
        "epoch": EPOCH,
    }
    args.update(kw)
    return ReceiverView(**args)  # type: ignore[arg-type]


def from_leader(segment: SegmentRef, pid: int = LEADER_PID, epoch: int = EPOCH) -> Offer:
    return Offer(segment, pid, epoch)


def base_chain() -> Chain:
    """M1 <- a <- b, root b."""
    return Chain.of([seg("M1", None, major=True), seg("a", "M1"), seg("b", "a")], "b")


# --------------------------------------------------------------------------------------------------------------
# Follower receiver
# --------------------------------------------------------------------------------------------------------------


def test_empty_follower_fast_forwards_the_first_major() -> None:
    """Root NULL and base NULL are equal: the first segment is a fast-forward."""
    assert receive_decision(follower_view(Chain.of([], None)), from_leader(seg("M1", None, major=True))) == (
        Outcome.FAST_FORWARD
    )


def test_follower_fast_forwards_segment_based_on_root() -> None:
    assert receive_decision(follower_view(base_chain()), from_leader(seg("c", "b"))) == Outcome.FAST_FORWARD


@pytest.mark.parametrize("sid", ["M1", "a", "b"])
def test_follower_says_exists_for_segment_on_walk(sid: str) -> None:
    chain = base_chain()
    assert receive_decision(follower_view(chain), from_leader(chain.get(sid))) == Outcome.SEGMENT_EXISTS  # type: ignore[arg-type]


def test_follower_says_exists_for_included_segment() -> None:
    """A minor folded into the follower's major is referenced even though its file was never received."""
    chain = Chain.of([seg("M2", "x", included=["w", "x"], major=True)], "M2")
    assert receive_decision(follower_view(chain), from_leader(seg("x", "w"))) == Outcome.SEGMENT_EXISTS


def test_follower_fast_forwards_a_major_not_based_on_root() -> None:
    """A major carries all the data up to its base, so the follower can jump to it (EventQL 3.5)."""
    offer = from_leader(seg("M2", "zz", included=["zz"], major=True))
    assert receive_decision(follower_view(base_chain()), offer) == Outcome.FAST_FORWARD


def test_follower_rejects_minor_not_based_on_root_as_out_of_order() -> None:
    assert receive_decision(follower_view(base_chain()), from_leader(seg("d", "c"))) == Outcome.OUT_OF_ORDER
    assert receive_decision(follower_view(base_chain()), from_leader(seg("x", "a"))) == Outcome.OUT_OF_ORDER


@pytest.mark.parametrize(
    ("pid", "epoch", "leader_pid"),
    [
        (LEADER_PID + 1, EPOCH, LEADER_PID),  # another placement (old leader, or the re-assigned site)
        (LEADER_PID, EPOCH - 1, LEADER_PID),  # same placement, stale epoch
        (LEADER_PID, EPOCH + 1, LEADER_PID),  # receiver has not learned the new epoch yet: retry later
        (LEADER_PID, EPOCH, None),  # receiver knows no leader
    ],
)
def test_follower_rejects_offers_not_from_current_leader(pid: int, epoch: int, leader_pid: int | None) -> None:
    """INVALID comes before every accept: even a perfect fast-forward from a stale leader is refused."""
    view = follower_view(base_chain(), leader_placement_id=leader_pid)
    for offered in (seg("c", "b"), seg("b", "a"), seg("M9", "q", major=True), seg("d", "c")):
        assert receive_decision(view, from_leader(offered, pid, epoch)) == Outcome.INVALID


# --------------------------------------------------------------------------------------------------------------
# Leader receiver
# --------------------------------------------------------------------------------------------------------------


def test_loading_leader_with_null_root_fast_forwards() -> None:
    view = leader_view(Chain.of([], None), PartitionState.LOADING)
    assert receive_decision(view, from_leader(seg("M1", None, major=True), pid=99, epoch=0)) == Outcome.FAST_FORWARD
    assert receive_decision(view, from_leader(seg("c", "b"), pid=99, epoch=0)) == Outcome.FAST_FORWARD


def test_live_leader_with_null_root_merges() -> None:
    """The LOADING shortcut is only for LOADING: a LIVE leader that lost everything merges."""
    view = leader_view(Chain.of([], None), PartitionState.LIVE)
    assert receive_decision(view, from_leader(seg("M1", None, major=True), pid=99)) == Outcome.MERGE


@pytest.mark.parametrize("state", [PartitionState.LOADING, PartitionState.LIVE])
def test_leader_says_exists_when_referenced_and_merges_otherwise(state: PartitionState) -> None:
    chain = Chain.of([*base_chain().segments, seg("M2", "b", included=["a", "b"], major=True)], "M2")
    view = leader_view(chain, state)
    for sid in ("M1", "a", "b", "M2"):
        assert receive_decision(view, from_leader(chain.get(sid), pid=99, epoch=1)) == Outcome.SEGMENT_EXISTS  # type: ignore[arg-type]
    assert receive_decision(view, from_leader(seg("x", "a"), pid=99, epoch=1)) == Outcome.MERGE
    assert receive_decision(view, from_leader(seg("y", "M2"), pid=99, epoch=1)) == Outcome.MERGE


def test_leader_does_not_fence_senders() -> None:
    """Any replica may push to the leader (EventQL 3.5 follower procedure): no INVALID on the leader side."""
    view = leader_view(base_chain())
    for pid, epoch in ((LEADER_PID, EPOCH), (123, 0), (123, EPOCH + 5)):
        assert receive_decision(view, from_leader(seg("x", "a"), pid, epoch)) == Outcome.MERGE


# --------------------------------------------------------------------------------------------------------------
# Back-pressure
# --------------------------------------------------------------------------------------------------------------


def others(n: int) -> frozenset[str]:
    return frozenset(f"other{i}" for i in range(n))


@pytest.mark.parametrize("make_view", [follower_view, leader_view])
def test_overloaded_at_limit(make_view: Callable[..., ReceiverView]) -> None:
    """At MAX in flight the receiver declines; one fewer still leaves room (at most MAX receipts at once)."""
    offer = from_leader(seg("c", "b"))
    full = make_view(base_chain(), in_flight=others(MAX_REPL_INCOMING_SEGMENTS))
    assert receive_decision(full, offer) == Outcome.OVERLOADED
    room = make_view(base_chain(), in_flight=others(MAX_REPL_INCOMING_SEGMENTS - 1))
    assert receive_decision(room, offer) != Outcome.OVERLOADED
    assert receive_decision(make_view(base_chain(), in_flight=others(2), max_incoming=2), offer) == (Outcome.OVERLOADED)


def test_overloaded_is_checked_before_inflight() -> None:
    """Seed order: OVERLOADED first, even when this very segment is among those in flight."""
    in_flight = others(MAX_REPL_INCOMING_SEGMENTS - 1) | {"c"}
    assert receive_decision(follower_view(base_chain(), in_flight), from_leader(seg("c", "b"))) == (Outcome.OVERLOADED)


@pytest.mark.parametrize("make_view", [follower_view, leader_view])
def test_inflight_when_same_segment_is_being_received(make_view: Callable[..., ReceiverView]) -> None:
    view = make_view(base_chain(), in_flight=frozenset({"c", "other"}))
    assert receive_decision(view, from_leader(seg("c", "b"))) == Outcome.INFLIGHT
    assert receive_decision(view, from_leader(seg("d", "b"))) != Outcome.INFLIGHT


def test_back_pressure_comes_before_fencing() -> None:
    """OVERLOADED and INFLIGHT are answered before the leader check, as in the seed."""
    stale = from_leader(seg("c", "b"), pid=LEADER_PID + 1)
    assert receive_decision(follower_view(base_chain(), others(MAX_REPL_INCOMING_SEGMENTS)), stale) == (
        Outcome.OVERLOADED
    )
    assert receive_decision(follower_view(base_chain(), frozenset({"c"})), stale) == Outcome.INFLIGHT


def test_an_old_leader_continues_from_the_common_segment_once_its_fork_is_merged() -> None:
    """DESIGN 11: the old leader's chain is M1 <- a <- b <- x1 <- x2 (x1, x2 written while it led, lost by the
    failover); the new leader wrote c on b. While x1 or x2 is not merged it waits (UNMERGED: no restart, no
    major); once the leader has merged both (acked them) it rewinds to b and takes c: incremental, no major.
    A base that is not on its chain, or a fork segment the leader neither merged nor is to be pushed, stays
    OUT_OF_ORDER."""
    chain = Chain.of([*base_chain().segments, seg("x1", "b"), seg("x2", "x1")], "x2")
    offer = Offer(seg("c", "b"), LEADER_PID, EPOCH)
    assert receive_decision(follower_view(chain), offer) == Outcome.OUT_OF_ORDER  # nothing known of x1, x2
    waiting = follower_view(chain, taken_in=frozenset({"x1"}), unmerged=frozenset({"x2"}))
    assert receive_decision(waiting, offer) == Outcome.UNMERGED
    merged = follower_view(chain, taken_in=frozenset({"x1", "x2"}))
    assert receive_decision(merged, offer) == Outcome.FAST_FORWARD
    after = apply_fast_forward(chain, offer.segment)
    assert ids(visible_segments(after)) == ["M1", "a", "b", "c"]  # x1, x2 off the chain: their rows come merged
    assert receive_decision(merged, Offer(seg("d", "zz"), LEADER_PID, EPOCH)) == Outcome.OUT_OF_ORDER
    partly = follower_view(chain, taken_in=frozenset({"x2"}))  # x1: neither merged nor to be pushed
    assert receive_decision(partly, offer) == Outcome.OUT_OF_ORDER
    assert sender_reaction(Outcome.UNMERGED) == Reaction.STOP


# --------------------------------------------------------------------------------------------------------------
# Sender
# --------------------------------------------------------------------------------------------------------------

EXPECTED_REACTION = {
    Outcome.FAST_FORWARD: Reaction.ACK,
    Outcome.MERGE: Reaction.ACK,
    Outcome.SEGMENT_EXISTS: Reaction.ACK,
    Outcome.OVERLOADED: Reaction.STOP,
    Outcome.INVALID: Reaction.STOP,
    Outcome.INFLIGHT: Reaction.STOP,
    Outcome.OUT_OF_ORDER: Reaction.RESTART,
    Outcome.UNMERGED: Reaction.STOP,
}


@pytest.mark.parametrize("outcome", list(Outcome))
def test_sender_reaction_for_every_outcome(outcome: Outcome) -> None:
    assert sender_reaction(outcome) is EXPECTED_REACTION[outcome]
    assert outcome.accepted == (outcome in (Outcome.FAST_FORWARD, Outcome.MERGE))


def test_every_outcome_has_an_expected_reaction() -> None:
    """A new Outcome must be given a reaction here on purpose."""
    assert set(EXPECTED_REACTION) == set(Outcome)


def test_apply_fast_forward_appends_and_moves_root() -> None:
    chain = base_chain()
    after = apply_fast_forward(chain, seg("c", "b"))
    assert after.root == "c"
    assert ids(after.segments) == ["M1", "a", "b", "c"]
    assert ids(visible_segments(after)) == ["M1", "a", "b", "c"]
    assert chain.root == "b" and "c" not in chain  # pure: the input is unchanged


# --------------------------------------------------------------------------------------------------------------
# A tiny sender loop for the scenarios
# --------------------------------------------------------------------------------------------------------------


def replicate_once(leader: Chain, follower: Chain, acked: set[str]) -> tuple[Chain, list[tuple[str, Outcome]]]:
    """One pass of replicate_partition_to for one replica, restarting at most once on OUT_OF_ORDER."""
    log: list[tuple[str, Outcome]] = []
    for _attempt in range(2):
        restart = False
        for s in offer_order(leader, acked):
            outcome = receive_decision(follower_view(follower), from_leader(s))
            log.append((s.segment_id, outcome))
            if outcome == Outcome.FAST_FORWARD:
                follower = apply_fast_forward(follower, s)
            reaction = sender_reaction(outcome)
            if reaction is Reaction.ACK:
                acked.add(s.segment_id)
            elif reaction is Reaction.RESTART:
                acked.clear()
                restart = True
                break
            else:
                return follower, log
        if not restart:
            break
    return follower, log


def test_steady_replication_is_all_fast_forward_and_repeat_is_a_no_op() -> None:
    """Steady case (EventQL 3.3): every offer fast-forwards; a second pass offers nothing (invariant 6)."""
    leader = base_chain()
    acked: set[str] = set()
    follower, log = replicate_once(leader, Chain.of([], None), acked)
    assert log == [("M1", Outcome.FAST_FORWARD), ("a", Outcome.FAST_FORWARD), ("b", Outcome.FAST_FORWARD)]
    assert visible_segments(follower) == visible_segments(leader)
    again, log2 = replicate_once(leader, follower, acked)
    assert log2 == [] and again == follower
    # A sender that lost its acks (crash before commit) re-offers: the follower answers EXISTS, nothing changes.
    again, log3 = replicate_once(leader, follower, set())
    assert [o for _, o in log3] == [Outcome.SEGMENT_EXISTS] * 3 and again == follower


def test_aba_1_minor_based_on_unseen_minor_restarts_from_newest_major() -> None:
    """EventQL 3.6, first case. The follower took major M1, minor A, then major M2. The sender believes B
    (based on M2) was acked, so it offers C based on B, a minor the follower never saw: OUT_OF_ORDER. The
    sender drops its acks, restarts from the newest major and the replica converges."""
    leader = Chain.of(
        [
            seg("M1", None, major=True),
            seg("A", "M1"),
            seg("M2", "A", included=["A"], major=True),
            seg("B", "M2"),
            seg("C", "B"),
        ],
        "C",
    )
    follower = Chain.of([seg("M1", None, major=True), seg("A", "M1")], "A")
    follower = apply_fast_forward(follower, leader.get("M2"))  # type: ignore[arg-type]
    assert receive_decision(follower_view(follower), from_leader(leader.get("C"))) == Outcome.OUT_OF_ORDER  # type: ignore[arg-type]
    assert sender_reaction(Outcome.OUT_OF_ORDER) is Reaction.RESTART

    acked = {"M1", "A", "M2", "B"}
    follower, log = replicate_once(leader, follower, acked)
    assert log == [
        ("C", Outcome.OUT_OF_ORDER),
        ("M2", Outcome.SEGMENT_EXISTS),
        ("B", Outcome.FAST_FORWARD),
        ("C", Outcome.FAST_FORWARD),
    ]
    assert acked == {"M2", "B", "C"}
    assert visible_segments(follower) == visible_segments(leader)
    assert replicate_once(leader, follower, acked)[1] == []


def test_aba_1_literal_major_after_minor() -> None:
    """The seed's wording: after M1, A, M2 a minor based on the previous minor A is out of order, because the
    follower's root moved to M2 (a major based on something else)."""
    follower = Chain.of([seg("M1", None, major=True), seg("A", "M1"), seg("M2", "Z", major=True)], "M2")
    assert receive_decision(follower_view(follower), from_leader(seg("B", "A"))) == Outcome.OUT_OF_ORDER


def test_aba_2_reassigned_placement_gets_new_id_so_follower_pushes() -> None:
    """EventQL 3.6, second case. Site R led the partition as placement 10; follower F's segment x (written
    while F led) was pushed to R and acked by placement 10. R is unassigned, later re-assigned as leader with a
    NEW placement id 11 and an empty partition, and sends F its new major N1. F must push x to R again; with
    acks keyed by site name F would think R holds x and delete it, losing x's rows."""
    old_r, new_r, new_epoch = 10, 11, EPOCH + 2
    rows = {"M1": {1, 2}, "a": {3}, "x": {4}, "N1": {5}}
    acked_by_pid = {"M1": {old_r}, "a": {old_r}, "x": {old_r}}
    acked_by_site = {"M1": {"R"}, "a": {"R"}, "x": {"R"}}
    f_chain = Chain.of([seg("M1", None, major=True), seg("a", "M1"), seg("x", "a")], "x")

    view = follower_view(f_chain, leader_placement_id=new_r, epoch=new_epoch)
    n1 = seg("N1", None, major=True)
    # The old placement (or old epoch) is fenced; the new one fast-forwards its major onto F.
    assert receive_decision(view, from_leader(n1, pid=old_r, epoch=EPOCH)) == Outcome.INVALID
    assert receive_decision(view, from_leader(n1, pid=new_r, epoch=EPOCH)) == Outcome.INVALID
    assert receive_decision(view, from_leader(n1, pid=new_r, epoch=new_epoch)) == Outcome.FAST_FORWARD
    f_chain = apply_fast_forward(f_chain, n1)
    leader_chain = Chain.of([n1], "N1")

    for sid in ("M1", "a", "x"):
        assert not is_strongly_referenced(f_chain, sid)
        by_pid = follower_action(f_chain, sid, leader_acked=new_r in acked_by_pid[sid])
        assert by_pid is LocalAction.PUSH
        by_site = follower_action(f_chain, sid, leader_acked="R" in acked_by_site[sid])
        assert by_site is LocalAction.DELETE  # the ABA bug placement ids prevent

    # Keyed by site name, F deletes x and the rows it alone held are gone everywhere.
    leader_rows = set().union(*(rows[s.segment_id] for s in visible_segments(leader_chain)))
    kept_by_site = [s.segment_id for s in f_chain.segments if s.segment_id not in ("M1", "a", "x")]
    surviving = leader_rows | set().union(*(rows[s] for s in kept_by_site))
    assert not rows["x"] <= surviving
    # Keyed by placement id, F pushes x; the leader (not referencing x) merges it: nothing lost.
    assert receive_decision(leader_view(leader_chain), from_leader(seg("x", "a"), FOLLOWER_PID, 0)) == (Outcome.MERGE)


# --------------------------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------------------------


@st.composite
def offered_segments(draw: st.DrawFn, built: Built) -> SegmentRef:
    """One of the receiver's own segments, or a new one based on its root, another held id, NULL or an
    unknown id; major or minor."""
    chain = built.chain
    held = ids(chain.segments)
    if held and draw(st.booleans()):
        return draw(st.sampled_from(chain.segments))
    base = draw(st.sampled_from([chain.root, None, "unknown", *held]))
    major = draw(st.booleans())
    included = tuple(draw(st.lists(st.sampled_from([*held, "unknown"]), max_size=3))) if major else ()
    return SegmentRef("new", base, included, major)


@st.composite
def follower_cases(draw: st.DrawFn) -> tuple[Chain, SegmentRef]:
    built = draw(built_chains())
    return built.chain, draw(offered_segments(built))


@given(follower_cases())
def test_follower_decision_table(case: tuple[Chain, SegmentRef]) -> None:
    """From a valid leader with room to receive, the follower answers as DESIGN section 6 lists."""
    chain, offered = case
    outcome = receive_decision(follower_view(chain), from_leader(offered))
    if offered.base_segment_id == chain.root:
        assert outcome == Outcome.FAST_FORWARD
    elif is_referenced(chain, offered.segment_id):
        assert outcome == Outcome.SEGMENT_EXISTS
    elif offered.is_major:
        assert outcome == Outcome.FAST_FORWARD
    else:
        assert outcome == Outcome.OUT_OF_ORDER
    assert outcome != Outcome.MERGE


@given(follower_cases())
def test_follower_fast_forward_then_repeat_is_segment_exists(case: tuple[Chain, SegmentRef]) -> None:
    """Invariant 6: a re-offer of what was just fast-forwarded changes nothing; the segment is the root and
    strongly referenced; the visible rows grow by exactly that segment (or restart at it if major)."""
    chain, offered = case
    if receive_decision(follower_view(chain), from_leader(offered)) != Outcome.FAST_FORWARD:
        return
    after = apply_fast_forward(chain, offered)
    assert after.root == offered.segment_id
    assert is_strongly_referenced(after, offered.segment_id)
    assert receive_decision(follower_view(after), from_leader(offered)) == Outcome.SEGMENT_EXISTS
    expected = [offered] if offered.is_major else [*visible_segments(chain), offered]
    assert visible_segments(after)[-len(expected) :] == expected


@given(follower_cases())
def test_referenced_segment_is_never_taken_twice(case: tuple[Chain, SegmentRef]) -> None:
    """A segment the follower already references is never fast-forwarded again (no duplicate entries)."""
    chain, offered = case
    if is_referenced(chain, offered.segment_id) and offered.base_segment_id != chain.root:
        assert receive_decision(follower_view(chain), from_leader(offered)) == Outcome.SEGMENT_EXISTS


@given(follower_cases(), st.booleans(), st.sampled_from(list(PartitionState)))
def test_leader_decision_table(case: tuple[Chain, SegmentRef], empty: bool, state: PartitionState) -> None:
    """The leader never fences nor reorders: it fast-forwards only while LOADING and empty."""
    chain, offered = case
    if empty:
        chain = Chain.of([], None)
    outcome = receive_decision(leader_view(chain, state), from_leader(offered, pid=1234, epoch=0))
    if state == PartitionState.LOADING and chain.root is None:
        assert outcome == Outcome.FAST_FORWARD
    elif is_referenced(chain, offered.segment_id):
        assert outcome == Outcome.SEGMENT_EXISTS
    else:
        assert outcome == Outcome.MERGE


@given(
    follower_cases(),
    st.booleans(),
    st.integers(0, 2 * MAX_REPL_INCOMING_SEGMENTS),
    st.booleans(),
    st.integers(1, 2 * MAX_REPL_INCOMING_SEGMENTS),
)
def test_back_pressure_property(
    case: tuple[Chain, SegmentRef], is_leader: bool, n_others: int, same: bool, limit: int
) -> None:
    """OVERLOADED iff at the limit; else INFLIGHT iff this segment is in flight; neither changes anything."""
    chain, offered = case
    in_flight = others(n_others) | ({offered.segment_id} if same else set())
    make = leader_view if is_leader else follower_view
    outcome = receive_decision(make(chain, in_flight=in_flight, max_incoming=limit), from_leader(offered))
    if len(in_flight) >= limit:
        assert outcome == Outcome.OVERLOADED
    elif same:
        assert outcome == Outcome.INFLIGHT
    else:
        assert outcome not in (Outcome.OVERLOADED, Outcome.INFLIGHT)
    if outcome in (Outcome.OVERLOADED, Outcome.INFLIGHT):
        assert sender_reaction(outcome) is Reaction.STOP
