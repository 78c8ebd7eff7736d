"""The receive and send procedures of EventQL 3.5 as pure decision functions.

The rounds engine gathers a :class:`ReceiverView` from the catalog inside the receiver's transaction, asks
:func:`receive_decision` what to do with an offer, and applies :func:`sender_reaction` to the outcome. No I/O
here, so every branch is testable on its own and as a property.
"""

from __future__ import annotations

from dataclasses import dataclass

from segrep.core.chain import Chain, SegmentRef, is_referenced
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
