"""The receive and send procedures of EventQL 3.5 as pure decision functions.

The rounds engine gathers a :class:`ReceiverView` from the catalog inside the receiver's transaction, asks
:func:`receive_decision` what to do with an offer, and applies :func:`sender_reaction` to the outcome. No I/O
here, so every branch is testable on its own and as a property.
"""

from __future__ import annotations

from dataclasses import dataclass

from segrep.core.chain import Chain, SegmentRef, is_referenced, newer_than
from segrep.core.states import Outcome, PartitionState, Reaction

MAX_REPL_INCOMING_SEGMENTS = 8


@dataclass(frozen=True)
class Offer:
    segment: SegmentRef
    sender_placement_id: int
    sender_epoch: int


@dataclass(frozen=True)
class ReceiverView:
    """What the receiving placement knows when an offer arrives."""

    placement_id: int
    chain: Chain
    is_leader: bool
    partition_state: PartitionState
    leader_placement_id: int | None
    epoch: int
    in_flight: frozenset[str] = frozenset()
    max_incoming: int = MAX_REPL_INCOMING_SEGMENTS
    # a cascaded replica also takes offers from its feeder (another follower at the same epoch: DESIGN 12)
    feeder_placement_id: int | None = None
    # a follower that led once: its own segments the leader has merged (acked as pushed to it), and those it
    # has not merged yet (still to be pushed). Past a common segment, the first may go off its chain.
    taken_in: frozenset[str] = frozenset()
    unmerged: frozenset[str] = frozenset()


def receive_decision(view: ReceiverView, offer: Offer) -> Outcome:
    """Decide an incoming offer (EventQL 3.5, "upon receiving a segment")."""
    seg = offer.segment
    if len(view.in_flight) >= view.max_incoming:
        return Outcome.OVERLOADED
    if seg.segment_id in view.in_flight:
        return Outcome.INFLIGHT
    if view.is_leader:
        if view.partition_state == PartitionState.LOADING and view.chain.root is None:
            return Outcome.FAST_FORWARD
        if is_referenced(view.chain, seg.segment_id):
            return Outcome.SEGMENT_EXISTS
        return Outcome.MERGE
    senders = (view.leader_placement_id, view.feeder_placement_id)
    if offer.sender_placement_id not in senders or offer.sender_epoch != view.epoch:
        return Outcome.INVALID
    if seg.base_segment_id == view.chain.root:
        return Outcome.FAST_FORWARD
    if is_referenced(view.chain, seg.segment_id):
        return Outcome.SEGMENT_EXISTS
    if seg.is_major:
        return Outcome.FAST_FORWARD
    return _past_common(view, seg)


def _past_common(view: ReceiverView, seg: SegmentRef) -> Outcome:
    """A follower offered a segment based on a segment of its chain that is not its root (DESIGN 11: the old
    leader's catch-up is incremental from the common segment). If all it holds past that base is merged at
    the leader, it rewinds there: the merge output brings those rows back. If some is not merged yet, it
    waits for the merge. Otherwise, or with no common segment, OUT_OF_ORDER (restart, then a major)."""
    fork = newer_than(view.chain, seg.base_segment_id)
    if fork:
        if all(sid in view.taken_in for sid in fork):
            return Outcome.FAST_FORWARD
        if all(sid in view.taken_in or sid in view.unmerged for sid in fork):
            return Outcome.UNMERGED
    return Outcome.OUT_OF_ORDER


def sender_reaction(outcome: Outcome) -> Reaction:
    """The sender's reaction to an outcome (EventQL 3.5, replicate_partition_to)."""
    if outcome.accepted or outcome == Outcome.SEGMENT_EXISTS:
        return Reaction.ACK
    if outcome == Outcome.OUT_OF_ORDER:
        return Reaction.RESTART
    return Reaction.STOP


def apply_fast_forward(chain: Chain, seg: SegmentRef) -> Chain:
    """The receiver's chain after a fast-forward: the segment appended and made the root."""
    return Chain.of((*chain.segments, seg), seg.segment_id)
