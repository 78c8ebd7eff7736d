"""Tests of segrep.core.chain: the seed's own scenarios (EventQL 3, 3.1, 3.5) and properties over generated chains.

The brute-force reference functions below are written from DESIGN section 6 without going through
``Chain.walk``, so a bug in the walk itself shows up as a disagreement.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from segrep.core.chain import (
    MAX_SEGMENT_HISTORY,
    Chain,
    LocalAction,
    SegmentRef,
    check_links,
    covering_majors,
    follower_action,
    is_reference_weak,
    is_referenced,
    is_strongly_referenced,
    leader_action,
    newest_major,
    offer_order,
    visible_segments,
)
from tests.support.chains import Built, built_chains, ids, seg


def without(chain: Chain, drop: Iterable[str]) -> Chain:
    """The chain after GC removed some segments (the root stays as it was)."""
    gone = set(drop)
    return Chain.of((s for s in chain.segments if s.segment_id not in gone), chain.root)


# --------------------------------------------------------------------------------------------------------------
# Seed scenarios as examples
# --------------------------------------------------------------------------------------------------------------


def steady_chain() -> Chain:
    """M1 <- a <- b <- c: one leader, no fork, no compaction yet (EventQL 3.3 steady case)."""
    return Chain.of([seg("M1", None, major=True), seg("a", "M1"), seg("b", "a"), seg("c", "b")], "c")


def compacted_chain() -> Chain:
    """steady_chain compacted (EventQL 3.1): M2 based on the newest folded minor c, including a, b, c; then d."""
    base = steady_chain()
    m2 = seg("M2", "c", included=("a", "b", "c"), major=True)
    return Chain.of([*base.segments, m2, seg("d", "M2")], "d")


def test_steady_chain_walk_and_visible() -> None:
    """In the steady case every segment is on the walk, strongly referenced and visible."""
    chain = steady_chain()
    assert ids(chain.walk()) == ["c", "b", "a", "M1"]
    assert ids(visible_segments(chain)) == ["M1", "a", "b", "c"]
    assert newest_major(chain) == chain.get("M1")
    for sid in ("M1", "a", "b", "c"):
        assert is_referenced(chain, sid)
        assert not is_reference_weak(chain, sid)
        assert is_strongly_referenced(chain, sid)
        assert leader_action(chain, sid, acked_by_all_replicas=[]) is LocalAction.KEEP


def test_steady_offer_order_resumes_after_acked_prefix() -> None:
    """Offers go oldest first from the newest major and skip what the replica already acked (EventQL 3.4)."""
    chain = steady_chain()
    assert ids(offer_order(chain, [])) == ["M1", "a", "b", "c"]
    assert ids(offer_order(chain, ["M1", "a"])) == ["b", "c"]
    assert offer_order(chain, ["M1", "a", "b", "c"]) == []


def test_new_segment_based_on_root_extends_the_chain() -> None:
    """A new segment takes the root as base and becomes the root: the previous root stays referenced."""
    chain = steady_chain()
    grown = Chain.of([*chain.segments, seg("d", "c")], "d")
    assert ids(visible_segments(grown)) == ["M1", "a", "b", "c", "d"]
    assert all(is_strongly_referenced(grown, s) for s in ("M1", "a", "b", "c", "d"))


def test_fork_segment_is_not_referenced_and_leader_merges_it() -> None:
    """Two segments based on the same base: the one the root does not lead to is a fork (EventQL 3.3)."""
    chain = Chain.of(
        [seg("M1", None, major=True), seg("a", "M1"), seg("b", "a"), seg("x", "a")],
        "b",
    )
    assert not is_referenced(chain, "x")
    assert is_reference_weak(chain, "x")  # the seed reports unreferenced as weak; callers test is_referenced first
    assert not is_strongly_referenced(chain, "x")
    assert leader_action(chain, "x", acked_by_all_replicas=["M1", "a", "b", "x"]) is LocalAction.MERGE
    assert leader_action(chain, "b", acked_by_all_replicas=[]) is LocalAction.KEEP
    assert "x" not in ids(visible_segments(chain))
    assert "x" not in ids(offer_order(chain, []))


def test_compaction_makes_folded_minors_weak() -> None:
    """After compaction the folded minors and the old major live on in M2 (EventQL 3.1, 3.5)."""
    chain = compacted_chain()
    assert newest_major(chain) == chain.get("M2")
    assert ids(visible_segments(chain)) == ["M2", "d"]
    for sid in ("a", "b", "c", "M1"):
        assert is_referenced(chain, sid), sid
        assert is_reference_weak(chain, sid), sid
        assert covering_majors(chain, sid) == [chain.get("M2")], sid
    for sid in ("M2", "d"):
        assert is_strongly_referenced(chain, sid), sid


def test_leader_deletes_folded_minors_only_once_every_replica_acked_the_major() -> None:
    """Invariant 7: weak segments stay until the covering major is acked by every LIVE/JOINING replica."""
    chain = compacted_chain()
    for sid in ("a", "b", "c", "M1"):
        assert leader_action(chain, sid, acked_by_all_replicas=[]) is LocalAction.KEEP
        # Acks of the folded minors themselves are not enough: a replica may still need M2.
        assert leader_action(chain, sid, ["M1", "a", "b", "c", "d"]) is LocalAction.KEEP
        assert leader_action(chain, sid, ["M2"]) is LocalAction.DELETE
    for sid in ("M2", "d"):
        assert leader_action(chain, sid, ["M1", "a", "b", "c", "M2", "d"]) is LocalAction.KEEP


def test_chain_after_gc_of_folded_segments() -> None:
    """Once the folded files are gone the walk stops at M2, whose base is no longer held."""
    chain = without(compacted_chain(), ["M1", "a", "b", "c"])
    assert ids(chain.walk()) == ["d", "M2"]
    assert ids(visible_segments(chain)) == ["M2", "d"]
    assert ids(offer_order(chain, [])) == ["M2", "d"]


def test_included_list_is_capped_but_older_minors_stay_weak_through_the_walk() -> None:
    """Only MAX_SEGMENT_HISTORY ids fit in included; older folded minors are still weak (behind M2)."""
    n = MAX_SEGMENT_HISTORY + 6
    minors = [seg(f"m{i}", "M1" if i == 0 else f"m{i - 1}") for i in range(n)]
    folded = tuple(f"m{i}" for i in range(n))[-MAX_SEGMENT_HISTORY:]
    m2 = seg("M2", f"m{n - 1}", included=folded, major=True)
    chain = Chain.of([seg("M1", None, major=True), *minors, m2], "M2")
    assert check_links(chain.segments) == []
    for i in range(n):
        assert is_referenced(chain, f"m{i}")
        assert is_reference_weak(chain, f"m{i}")
        assert covering_majors(chain, f"m{i}") == [m2]
        assert leader_action(chain, f"m{i}", ["M2"]) is LocalAction.DELETE


def test_segments_included_only_stay_weakly_referenced_after_their_files_moved() -> None:
    """A segment listed in an included list is referenced even when the walk no longer reaches it."""
    chain = without(compacted_chain(), ["b"])  # walk: d, M2, c; c's base b is gone, a is only included
    assert ids(chain.walk()) == ["d", "M2", "c"]
    assert is_referenced(chain, "a") and is_reference_weak(chain, "a")
    assert covering_majors(chain, "a") == [chain.get("M2")]
    assert not is_referenced(chain, "M1")  # neither on the walk nor included: a fork now
    assert leader_action(chain, "M1", ["M2"]) is LocalAction.MERGE


def test_follower_action() -> None:
    """Follower: push what the leader lacks; keep strong segments; delete acked ones no longer needed."""
    chain = compacted_chain()
    assert follower_action(chain, "d", leader_acked=False) is LocalAction.PUSH
    assert follower_action(chain, "a", leader_acked=False) is LocalAction.PUSH
    assert follower_action(chain, "d", leader_acked=True) is LocalAction.KEEP
    assert follower_action(chain, "M2", leader_acked=True) is LocalAction.KEEP
    assert follower_action(chain, "a", leader_acked=True) is LocalAction.DELETE
    assert follower_action(chain, "M1", leader_acked=True) is LocalAction.DELETE
    # off the chain since this replica took the leader's major:
    off = Chain.of([*chain.segments, seg("y", "c")], "d")
    assert follower_action(off, "y", leader_acked=True) is LocalAction.DELETE
    assert follower_action(off, "y", leader_acked=False) is LocalAction.PUSH


def test_walk_of_empty_missing_root_and_cycle() -> None:
    """The walk is total: empty chain, root not held, and a malformed cycle all terminate."""
    assert Chain.of([], None).walk() == []
    assert visible_segments(Chain.of([], None)) == []
    assert newest_major(Chain.of([], None)) is None
    assert Chain.of([seg("M1", None, major=True)], "gone").walk() == []
    cyc = Chain.of([seg("a", "b"), seg("b", "a")], "a")
    assert ids(cyc.walk()) == ["a", "b"]
    assert ids(visible_segments(cyc)) == ["b", "a"]


def test_visible_without_major_is_the_whole_walk() -> None:
    """When a major's history was collected the whole walk is visible (design note in visible_segments)."""
    chain = Chain.of([seg("a", "gone"), seg("b", "a")], "b")
    assert ids(visible_segments(chain)) == ["a", "b"]
    assert newest_major(chain) is None
    assert not is_reference_weak(chain, "a")


def test_check_links_reports_each_problem() -> None:
    assert check_links(steady_chain().segments) == []
    problems = check_links(
        [
            seg("a", None),
            seg("a", None, major=True),
            seg("s", "s"),
            seg("big", "a", included=[f"x{i}" for i in range(MAX_SEGMENT_HISTORY + 1)], major=True),
        ]
    )
    assert any("appears twice" in p for p in problems)
    assert any("based on itself" in p for p in problems)
    assert any("more than" in p for p in problems)
    assert any("no base but is not major" in p for p in problems)


def test_gc_does_not_turn_weak_segments_into_forks() -> None:
    """SUSPECTED BUG (see report): deleting what leader_action says DELETE must not create false forks.

    Chain M1 <- a <- M2(incl a) <- b <- M3(incl b), root M3. A replica that joined after M3 acked only M3,
    so acked_by_all = {M3}. M2 and b are DELETE (covered by M3), but a and M1 are KEEP because their
    "covering" major is the nearer M2, which is not acked by all. Once M2 is gone, a and M1 are no longer
    referenced and the next pass MERGEs them as if they were forks, although their rows are in M3.
    """
    chain = Chain.of(
        [
            seg("M1", None, major=True),
            seg("a", "M1"),
            seg("M2", "a", included=["a"], major=True),
            seg("b", "M2"),
            seg("M3", "b", included=["b"], major=True),
        ],
        "M3",
    )
    acked_all = ["M3"]
    decisions = {s.segment_id: leader_action(chain, s.segment_id, acked_all) for s in chain.segments}
    after = without(chain, [sid for sid, d in decisions.items() if d is LocalAction.DELETE])
    merged_next_pass = [
        s.segment_id for s in after.segments if leader_action(after, s.segment_id, acked_all) is LocalAction.MERGE
    ]
    assert merged_next_pass == [], f"first pass {decisions}; false forks merged next pass: {merged_next_pass}"


# --------------------------------------------------------------------------------------------------------------
# Generated chains (tests.support.chains.built_chains)
# --------------------------------------------------------------------------------------------------------------


def acked_by_all(chain: Chain) -> st.SearchStrategy[set[str]]:
    """Sets of segment ids every replica acked: arbitrary, or the realistic shape left by a replica that
    joined at some major on the walk and acked from there towards the root (acked_by_all is an intersection,
    so it is no larger than that replica's acks)."""
    walk_oldest_first = list(reversed(ids(chain.walk())))
    starts = [i for i, sid in enumerate(walk_oldest_first) if chain.get(sid).is_major]  # type: ignore[union-attr]
    arbitrary = st.sets(st.sampled_from([*ids(chain.segments), "foreign"]))
    if not starts:
        return arbitrary
    joined = st.tuples(st.sampled_from(starts[::-1]), st.integers(1, len(walk_oldest_first))).map(
        lambda t: set(walk_oldest_first[t[0] : t[0] + t[1]])
    )
    return st.one_of(arbitrary, joined)


def brute_walk(segments: Iterable[SegmentRef], root: str | None) -> list[str]:
    """DESIGN 6: from the root through base_segment_id, while the placement holds the segment."""
    held = {s.segment_id: s for s in segments}
    out: list[str] = []
    cur = root
    while cur is not None and cur in held and cur not in out:
        out.append(cur)
        cur = held[cur].base_segment_id
    return out


def brute_referenced(segments: Iterable[SegmentRef], root: str | None) -> set[str]:
    """DESIGN 6: on the walk, or in the included list of a segment on the walk."""
    held = {s.segment_id: s for s in segments}
    walk = brute_walk(held.values(), root)
    return set(walk) | {i for sid in walk for i in held[sid].included_segment_ids}


def brute_strong(segments: Iterable[SegmentRef], root: str | None) -> set[str]:
    """DESIGN 6: strongly referenced = on the walk at or newer than the newest major (all of it if none)."""
    held = {s.segment_id: s for s in segments}
    walk = brute_walk(held.values(), root)
    majors = [i for i, sid in enumerate(walk) if held[sid].is_major]
    return set(walk if not majors else walk[: majors[0] + 1])


def containing_majors(built: Built, segment_id: str) -> set[str]:
    """Majors on the walk whose rows contain the segment's rows: the data-level meaning of 'covers'."""
    chain = built.chain
    return {
        sid
        for sid in brute_walk(chain.segments, chain.root)
        if chain.get(sid).is_major and built.rows[segment_id] <= built.rows[sid]  # type: ignore[union-attr]
    }


def resolved_rows(built: Built, chain: Chain) -> frozenset[int]:
    return frozenset().union(*(built.rows[s.segment_id] for s in visible_segments(chain)))


@given(built_chains())
def test_generated_chains_are_well_linked(built: Built) -> None:
    """Sanity of the generator itself: what it builds passes check_links."""
    assert check_links(built.chain.segments) == []


@given(built_chains())
def test_is_referenced_matches_design_definition(built: Built) -> None:
    chain = built.chain
    expected = brute_referenced(chain.segments, chain.root)
    for sid in [*ids(chain.segments), *built.dropped, "never-existed"]:
        assert is_referenced(chain, sid) == (sid in expected), sid


@given(built_chains())
def test_is_reference_weak_matches_design_definition(built: Built) -> None:
    chain = built.chain
    referenced = brute_referenced(chain.segments, chain.root)
    strong = brute_strong(chain.segments, chain.root)
    for sid in [*ids(chain.segments), *built.dropped]:
        if sid in referenced:
            assert is_reference_weak(chain, sid) == (sid not in strong), sid
            assert is_strongly_referenced(chain, sid) == (sid in strong), sid
        else:
            assert is_reference_weak(chain, sid), sid  # seed semantics: unreferenced reads as weak
            assert not is_strongly_referenced(chain, sid), sid


@given(built_chains())
def test_segments_newer_than_newest_major_are_never_weak(built: Built) -> None:
    chain = built.chain
    for s in chain.walk():
        assert not is_reference_weak(chain, s.segment_id)
        if s.is_major:
            break


@given(built_chains())
def test_visible_segments_shape(built: Built) -> None:
    """Oldest first, linked by base, ending at the root, at most one major and only as the first."""
    chain = built.chain
    visible = visible_segments(chain)
    if chain.root in chain:
        assert visible[-1].segment_id == chain.root
    else:
        assert visible == []
    for older, newer in pairwise(visible):
        assert newer.base_segment_id == older.segment_id
    majors = [i for i, s in enumerate(visible) if s.is_major]
    assert majors in ([], [0])
    walk_oldest_first = list(reversed(ids(chain.walk())))
    assert ids(visible) == walk_oldest_first[len(walk_oldest_first) - len(visible) :]
    if majors:
        assert visible[0] == newest_major(chain)


@given(built_chains(), st.data())
def test_offer_order_respects_predecessor_acks(built: Built, data: st.DataObject) -> None:
    """Invariant 5 at the pure level, for any set of acks the sender may hold."""
    chain = built.chain
    acked = data.draw(st.sets(st.sampled_from([*ids(chain.segments), "foreign"])))
    order = offer_order(chain, acked)
    visible = visible_segments(chain)
    assert [s for s in visible if s.segment_id not in acked] == order
    for i, s in enumerate(order):
        assert s.segment_id not in acked
        earlier = {o.segment_id for o in order[:i]}
        if s.base_segment_id in acked or s.base_segment_id in earlier:
            continue
        assert s == visible[0], s  # the start of the visible walk
        assert s.is_major or chain.get(s.base_segment_id) is None


@given(built_chains(), st.data())
def test_leader_action_never_deletes_needed_data(built: Built, data: st.DataObject) -> None:
    """Invariants 7 and 2: DELETE only for weak segments whose rows are in a major every replica acked."""
    chain = built.chain
    acked_all = data.draw(acked_by_all(chain))
    referenced = brute_referenced(chain.segments, chain.root)
    strong = brute_strong(chain.segments, chain.root)
    for s in chain.segments:
        action = leader_action(chain, s.segment_id, acked_all)
        if s.segment_id not in referenced:
            assert action is LocalAction.MERGE
        elif s.segment_id in strong:
            assert action is LocalAction.KEEP
        if action is LocalAction.DELETE:
            cover = covering_majors(chain, s.segment_id)
            assert any(c.segment_id in acked_all for c in cover)
            assert containing_majors(built, s.segment_id) & acked_all, s


@given(built_chains())
def test_weak_segments_go_once_every_major_is_acked(built: Built) -> None:
    """Liveness: with every major on the walk acked by all, every weakly referenced segment is DELETE."""
    chain = built.chain
    acked_all = {s.segment_id for s in chain.walk() if s.is_major}
    for s in chain.segments:
        if is_referenced(chain, s.segment_id) and is_reference_weak(chain, s.segment_id):
            assert leader_action(chain, s.segment_id, acked_all) is LocalAction.DELETE


@given(built_chains(), st.data())
def test_leader_gc_keeps_visible_rows(built: Built, data: st.DataObject) -> None:
    """Invariant 2 at the pure level: applying every DELETE leaves the visible segments and rows unchanged."""
    chain = built.chain
    acked_all = data.draw(acked_by_all(chain))
    doomed = [
        s.segment_id for s in chain.segments if leader_action(chain, s.segment_id, acked_all) is LocalAction.DELETE
    ]
    after = without(chain, doomed)
    assert visible_segments(after) == visible_segments(chain)
    assert resolved_rows(built, after) == resolved_rows(built, chain)


@given(built_chains(), st.data())
def test_leader_gc_creates_no_false_forks(built: Built, data: st.DataObject) -> None:
    """SUSPECTED BUG (see test_gc_does_not_turn_weak_segments_into_forks): a segment referenced before a
    GC pass must still be referenced after it, or the next pass merges already-present rows as a fork."""
    chain = built.chain
    acked_all = data.draw(acked_by_all(chain))
    doomed = {
        s.segment_id for s in chain.segments if leader_action(chain, s.segment_id, acked_all) is LocalAction.DELETE
    }
    after = without(chain, doomed)
    for s in after.segments:
        if is_referenced(chain, s.segment_id):
            assert is_referenced(after, s.segment_id), (s.segment_id, sorted(doomed))


@pytest.mark.parametrize("acked", [[], ["M1"], ["M1", "a"], ["M1", "a", "b", "c"]])
def test_offer_order_after_compaction_starts_at_new_major(acked: list[str]) -> None:
    """Whatever was acked before compaction, the replica is offered M2 then d (EventQL 3.5)."""
    assert ids(offer_order(compacted_chain(), acked)) == ["M2", "d"]
