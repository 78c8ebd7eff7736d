"""Planning offers: what each target is offered and what it will answer, and what followers push (DESIGN 7).

Over one :class:`~segrep.catalog.snapshot.PartitionSnapshot` these simulate EventQL 3.5 with the pure
functions of :mod:`segrep.core.protocol`: for every (partition, replica) the leader's offers in order with the
receiver's predicted decision, and for every follower the segments the leader lacks (pushed, then merged). The
plan is advice for reports and for deciding whether Spark is needed; every task re-decides inside its own
transaction, so a stale plan can never commit anything wrong.
"""

from __future__ import annotations

from collections.abc import Sequence

from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.snapshot import PartitionSnapshot
from segrep.core.chain import Chain, is_referenced, offer_order, referenced_ids
from segrep.core.hlc import FOREVER_US
from segrep.core.protocol import (
    MAX_REPL_INCOMING_SEGMENTS,
    Offer,
    ReceiverView,
    apply_fast_forward,
    receive_decision,
    sender_reaction,
)
from segrep.core.states import Outcome, PartitionState, Reaction


def offers_to(
    part: PartitionSnapshot,
    replica: m.Placement,
    end_us: int,
    *,
    in_flight: frozenset[str] = frozenset(),
    max_incoming: int = MAX_REPL_INCOMING_SEGMENTS,
    reoffer: bool = False,
    restart: bool = True,
) -> tuple[list[tuple[m.Segment, Outcome]], bool]:
    """Simulate sender -> ``replica`` for one partition (the sender is the leader, or the replica's feeder in
    a cascade: ``PartitionSnapshot.sender_of``): the offers in order with their outcomes, and whether the
    replica is stuck (OUT_OF_ORDER again after the restart from the newest major: only a new major segment at
    the leader, which a follower always fast-forwards, can unstick it). With ``restart`` off the simulation
    ends at the first OUT_OF_ORDER, for the engine to drop the acks itself."""
    sender = part.sender_of(replica)
    sender_chain = part.chain(sender)
    chain = part.chain(replica)
    acked: set[str] = set() if reoffer else part.acked_by(sender, replica)
    epoch, leader_id, sender_id = part.partition.epoch, part.leader.placement_id, sender.placement_id
    state = PartitionState(part.partition.state)
    out: list[tuple[m.Segment, Outcome]] = []
    restarted = False
    pending = _due(part, sender, sender_chain, acked, end_us)
    taken_in, unmerged = forks_of(part, replica)
    i = 0
    while i < len(pending):
        seg = pending[i]
        view = ReceiverView(
            replica.placement_id,
            chain,
            False,
            state,
            leader_id,
            epoch,
            in_flight,
            max_incoming,
            sender_id,
            taken_in,
            unmerged,
        )
        ref = q.to_ref(seg)
        outcome = receive_decision(view, Offer(ref, sender_id, epoch))
        out.append((seg, outcome))
        reaction = sender_reaction(outcome)
        if reaction == Reaction.ACK:
            if outcome == Outcome.FAST_FORWARD:
                moved = apply_fast_forward(chain, ref)
                if _drops_unmerged(part, replica, chain, moved):
                    out.pop()  # not offered yet: the leader merges those rows first (this round's merge)
                    break
                chain = moved
            i += 1
        elif reaction == Reaction.RESTART:
            if not restart:
                break
            if restarted:
                return out, True
            restarted = True
            pending = _due(part, sender, sender_chain, set(), end_us)
            i = 0
        else:
            break
    return out, False


def forks_of(part: PartitionSnapshot, replica: m.Placement) -> tuple[frozenset[str], frozenset[str]]:
    """A follower's own segments the leader has merged (it acked them as their holder's pushes), and those it
    has not merged yet (``pushes_from``): what lets an old leader continue from the common segment."""
    taken_in = frozenset(part.acked_by(replica, part.leader))
    return taken_in, frozenset(seg.segment_id for seg in pushes_from(part, replica, FOREVER_US))


def whole_cuts(chain: Chain, offers: Sequence[tuple[m.Segment, Outcome]]) -> list[bool]:
    """Where a batch of ``offers`` (in order, as :func:`offers_to` gives them to a replica whose chain is
    ``chain``) may end: ``cuts[i]`` is whether the replica's chain after the first ``i`` of them still
    references every segment it references now, except those it no longer references after all of them.

    At any other cut, rows the chain holds come back only with a later offer: a major that takes a segment
    off the replica's chain, then the merge output that names it. A batch committed alone there (the window
    full, then the target lost before the next batch) left the replica without those rows, below a safe time
    that may already cover them. Linear in the offers: the chain is walked again only where a fast-forward
    leaves it (a segment not based on its root)."""
    by_id = {ref.segment_id: ref for ref in chain.segments}
    root = chain.root
    held = referenced_ids(chain)
    lacking: set[str] = set()
    after = [frozenset(lacking)]
    for seg, outcome in offers:
        if outcome == Outcome.FAST_FORWARD:
            ref = q.to_ref(seg)
            by_id[ref.segment_id] = ref
            if ref.base_segment_id == root:  # the chain grows: it only gains references
                lacking -= {ref.segment_id, *ref.included_segment_ids}
            else:
                lacking = held - referenced_ids(Chain.of(by_id.values(), ref.segment_id))
            root = ref.segment_id
        after.append(frozenset(lacking))
    return [cut <= after[-1] for cut in after]


def _drops_unmerged(part: PartitionSnapshot, replica: m.Placement, before: Chain, after: Chain) -> bool:
    """Whether a fast-forward would take off the replica's chain a segment the leader has neither got nor
    merged (``pushes_from``: written while the replica led, or received from an earlier leader). Its rows
    would be gone from the replica until the merge output reaches it, below a safe time that may already
    cover them (found by the rounds state machine: a failover to a site that lacked a replica's segment,
    then a major written there). Held back, the replica keeps serving them; once they are merged, it
    fast-forwards the leader's chain with the merge output."""
    if before.root is None or is_referenced(after, before.root):
        return False  # the chain only grows
    dropped = referenced_ids(before) - referenced_ids(after)
    return any(seg.segment_id in dropped for seg in pushes_from(part, replica, FOREVER_US))


def _due(
    part: PartitionSnapshot, sender: m.Placement, sender_chain: Chain, acked: set[str], end_us: int
) -> list[m.Segment]:
    """The offer order, cut at the first segment committed at or after the interval end (a later segment
    must never be offered before an earlier one, so nothing after the cut is offered either). A feeder offers
    only what the leader holds too (it received it from the leader): never a fork of its own."""
    out = []
    leader = part.leader
    feeder = sender.placement_id != leader.placement_id
    leader_has = {x.segment_id for x in part.segments.get(leader.placement_id, [])} if feeder else set()
    for ref in offer_order(sender_chain, acked):
        seg = part.segment(sender.placement_id, ref.segment_id)
        if seg.committed_us >= end_us:
            break
        held_by_leader = seg.segment_id in leader_has or leader.placement_id in part.acks.get(
            (sender.placement_id, seg.segment_id), ()
        )
        if feeder and not held_by_leader:
            break
        out.append(seg)
    return out


def pushes_from(part: PartitionSnapshot, follower: m.Placement, end_us: int) -> list[m.Segment]:
    """A follower's segments that the current leader placement neither holds nor has acked, oldest first
    (written while the follower led, or received from an older leader): EventQL 3.5 follower procedure."""
    leader_has = {x.segment_id for x in part.segments.get(part.leader.placement_id, [])}
    acked = part.acked_by(follower, part.leader)
    mine = part.segments.get(follower.placement_id, [])
    # A segment a major of the follower's folded, and the leader's chain does not reference, goes as that
    # major: the major holds its rows as they stand (built as of a failover's cut, without the rows the cut
    # set aside: pushed alone, they would come back). One the leader references is still offered, to be
    # answered SEGMENT_EXISTS and acked (so GC can let the follower's copy go).
    folded = {sid for seg in mine if seg.is_major for sid in (seg.included_segment_ids or ())}
    leader_chain = part.chain(part.leader) if folded else None
    return [
        seg
        for seg in mine
        if seg.segment_id not in leader_has
        and seg.segment_id not in acked
        and seg.committed_us < end_us
        and seg.segment_id not in part.set_aside  # a failed-over leader's loss, rolled back on its return
        and not (
            seg.segment_id in folded and leader_chain is not None and not is_referenced(leader_chain, seg.segment_id)
        )
    ]


def leader_decision(
    part: PartitionSnapshot, follower: m.Placement, seg: m.Segment, in_flight: frozenset[str], max_incoming: int
) -> Outcome:
    """The leader's answer to a pushed segment. A leader that holds nothing yet would fast-forward; the engine
    merges instead (into an empty partition every row wins, so the result is the same rows)."""
    view = ReceiverView(
        part.leader.placement_id,
        part.chain(part.leader),
        True,
        PartitionState(part.partition.state),
        part.leader.placement_id,
        part.partition.epoch,
        in_flight,
        max_incoming,
    )
    outcome = receive_decision(view, Offer(q.to_ref(seg), follower.placement_id, part.partition.epoch))
    return Outcome.MERGE if outcome == Outcome.FAST_FORWARD else outcome
