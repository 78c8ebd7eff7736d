"""Model-based test of replication: one leader and 1-3 followers, driven only by segrep.core.chain and
segrep.core.protocol (no I/O).

Each segment's rows are a set of row ids; a major holds every row visible at the leader when it was written,
so resolving a placement (union of the rows of its visible segments) is comparable across placements.
After every step the machine checks DESIGN section 9: invariant 2 (the leader never loses a row), 5 (offers
only after the predecessor's ack, or a major), 6 (a repeated round changes nothing), 7 (the leader never
deletes a segment a follower still has to be offered) and 3 (after quiescence every follower resolves to
the leader's rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from segrep.core.chain import (
    MAX_SEGMENT_HISTORY,
    Chain,
    LocalAction,
    SegmentRef,
    check_links,
    follower_action,
    leader_action,
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

LEADER_PID = 1
OLD_LEADER_PID = 0  # the placement that led before the current one (fenced by id and epoch)
MAX_RESTARTS = 2  # OUT_OF_ORDER restarts the sender from the newest major; bounded per round
MAX_BACKUPS = 8

# Per-offer faults: the receiver is busy (OVERLOADED), already receiving that segment (INFLIGHT), the offer
# carries a stale epoch or comes from the old leader placement (INVALID), or the sender crashes after the
# receiver committed but before the ack was recorded (the next round re-offers: SEGMENT_EXISTS).
FAULTS = ("ok", "ok", "ok", "overloaded", "inflight", "stale_epoch", "old_leader", "lost_ack")
EXPECTED_DECLINE = {
    "overloaded": Outcome.OVERLOADED,
    "inflight": Outcome.INFLIGHT,
    "stale_epoch": Outcome.INVALID,
    "old_leader": Outcome.INVALID,
}


@dataclass
class Follower:
    placement_id: int
    chain: Chain
    backups: list[Chain] = field(default_factory=list)  # earlier committed states (restore fault)


@dataclass
class Cluster:
    """Everything the pure protocol needs: the leader's chain, its ack records and each follower's chain."""

    leader: Chain
    rows: dict[str, frozenset[int]]
    truth: set[int]
    followers: dict[int, Follower]
    acks: dict[int, set[str]]  # leader's record, keyed by placement id (EventQL 3.6), never site name
    epoch: int = 5

    def copy(self) -> Cluster:
        return Cluster(
            self.leader,
            self.rows,  # immutable per segment id, shared on purpose
            set(self.truth),
            {pid: Follower(f.placement_id, f.chain, list(f.backups)) for pid, f in self.followers.items()},
            {pid: set(a) for pid, a in self.acks.items()},
            self.epoch,
        )

    def resolve(self, chain: Chain) -> frozenset[int]:
        return frozenset().union(*(self.rows[s.segment_id] for s in visible_segments(chain)))

    def snapshot(self) -> tuple[Chain, dict[int, Chain], dict[int, frozenset[str]]]:
        return (
            self.leader,
            {pid: f.chain for pid, f in self.followers.items()},
            {pid: frozenset(a) for pid, a in self.acks.items()},
        )


def replicate_to(cluster: Cluster, pid: int, faults: Sequence[str] = ()) -> list[tuple[str, Outcome]]:
    """replicate_partition_to for one follower (EventQL 3.5), with faults injected offer by offer.

    Checks invariant 5 before every offer and that each injected fault yields the decline it models.
    """
    follower = cluster.followers[pid]
    acked = cluster.acks[pid]
    log: list[tuple[str, Outcome]] = []
    for _ in range(MAX_RESTARTS + 1):
        restart = False
        for s in offer_order(cluster.leader, acked):
            assert s.is_major or s.base_segment_id in acked, (
                f"invariant 5: {s.segment_id} offered to {pid} before its base {s.base_segment_id} was acked"
            )
            fault = faults[len(log)] if len(log) < len(faults) else "ok"
            in_flight: frozenset[str] = frozenset()
            sender_pid, sender_epoch = LEADER_PID, cluster.epoch
            if fault == "overloaded":
                in_flight = frozenset(f"busy{i}" for i in range(MAX_REPL_INCOMING_SEGMENTS))
            elif fault == "inflight":
                in_flight = frozenset({s.segment_id, "busy"})
            elif fault == "stale_epoch":
                sender_epoch -= 1
            elif fault == "old_leader":
                sender_pid = OLD_LEADER_PID
            view = ReceiverView(
                placement_id=pid,
                chain=follower.chain,
                is_leader=False,
                partition_state=PartitionState.LIVE,
                leader_placement_id=LEADER_PID,
                epoch=cluster.epoch,
                in_flight=in_flight,
            )
            outcome = receive_decision(view, Offer(s, sender_pid, sender_epoch))
            log.append((s.segment_id, outcome))
            if fault in EXPECTED_DECLINE:
                assert outcome == EXPECTED_DECLINE[fault], (fault, outcome)
            assert outcome != Outcome.MERGE, "a follower never merges"
            if outcome == Outcome.FAST_FORWARD:
                # Receiver commits (file, row, root) in one transaction before answering.
                follower.backups = [*follower.backups, follower.chain][-MAX_BACKUPS:]
                follower.chain = apply_fast_forward(follower.chain, s)
            reaction = sender_reaction(outcome)
            if reaction is Reaction.ACK:
                if fault == "lost_ack":
                    return log  # sender crashed before recording the ack
                acked.add(s.segment_id)
            elif reaction is Reaction.RESTART:
                acked.clear()
                restart = True
                break
            else:
                return log
        if not restart:
            return log
    return log


def quiesce(cluster: Cluster, max_rounds: int = 4) -> None:
    """Fault-free rounds to every follower until nothing is offered (DESIGN 9.3 'rounds until idle')."""
    for _ in range(max_rounds):
        offered = [replicate_to(cluster, pid) for pid in sorted(cluster.followers)]
        if not any(offered):
            return
    raise AssertionError(f"not idle after {max_rounds} fault-free rounds: {offered}")


class ReplicationModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.c = Cluster(Chain.of([], None), {}, set(), {}, {})
        self.next_seg = 0
        self.next_row = 0
        self.next_pid = LEADER_PID + 1
        self.merges_of_non_forks = 0  # see test_chain.test_gc_does_not_turn_weak_segments_into_forks

    # ---- helpers ------------------------------------------------------------------------------------------

    def new_rows(self, n: int) -> frozenset[int]:
        rows = frozenset(range(self.next_row, self.next_row + n))
        self.next_row += n
        return rows

    def leader_append(self, rows: frozenset[int], *, major: bool = False, included: tuple[str, ...] = ()) -> str:
        """A new leader segment based on the root (the first one is a major based on NULL, EventQL 3)."""
        self.next_seg += 1
        sid = f"s{self.next_seg}"
        root = self.c.leader.root
        s = SegmentRef(sid, root, included, major or root is None)
        self.c.rows[sid] = rows
        self.c.leader = Chain.of([*self.c.leader.segments, s], sid)
        return sid

    def add_follower(self) -> None:
        pid = self.next_pid
        self.next_pid += 1
        self.c.followers[pid] = Follower(pid, Chain.of([], None))
        self.c.acks[pid] = set()

    def pick(self, index: int) -> int:
        pids = sorted(self.c.followers)
        return pids[index % len(pids)]

    # ---- rules --------------------------------------------------------------------------------------------

    @initialize(n=st.integers(1, 3))
    def start(self, n: int) -> None:
        for _ in range(n):
            self.add_follower()

    @rule(n=st.integers(1, 3))
    def write(self, n: int) -> None:
        rows = self.new_rows(n)
        self.c.truth |= rows
        self.leader_append(rows)

    @precondition(lambda self: (r := self.c.leader.get(self.c.leader.root)) is not None and not r.is_major)
    @rule()
    def compact(self) -> None:
        """Fold the minors since the newest major into a major based on the newest folded minor (EventQL 3.1)."""
        visible = visible_segments(self.c.leader)
        folded = tuple(s.segment_id for s in visible if not s.is_major)
        self.leader_append(self.c.resolve(self.c.leader), major=True, included=folded[-MAX_SEGMENT_HISTORY:])

    @rule(which=st.integers(0, 2), faults=st.lists(st.sampled_from(FAULTS), max_size=6))
    def round_to_one(self, which: int, faults: list[str]) -> None:
        replicate_to(self.c, self.pick(which), faults)

    @rule(faults=st.lists(st.sampled_from(FAULTS), max_size=6))
    def round_to_all(self, faults: list[str]) -> None:
        for pid in sorted(self.c.followers):
            replicate_to(self.c, pid, faults)

    @rule()
    def leader_gc(self) -> None:
        """replicate_partition at the leader, oldest first: DELETE weak segments, MERGE forks."""
        acked_all = set.intersection(*self.c.acks.values())
        for s in list(self.c.leader.segments):
            chain = self.c.leader
            action = leader_action(chain, s.segment_id, acked_all)
            if action is LocalAction.DELETE:
                for pid in self.c.followers:
                    pending = {o.segment_id for o in offer_order(chain, self.c.acks[pid])}
                    assert s.segment_id not in pending, f"invariant 7: {s.segment_id} still owed to {pid}"
            elif action is LocalAction.MERGE:
                self.merges_of_non_forks += 1  # the model's leader writes no forks of its own
                missing = self.c.rows[s.segment_id] - self.c.resolve(chain)
                assert not missing, f"invariant 2: rows {sorted(missing)} of {s.segment_id} were not visible"
            else:
                continue
            self.c.leader = Chain.of((x for x in chain.segments if x != s), chain.root)

    @rule(which=st.integers(0, 2))
    def follower_gc(self, which: int) -> None:
        """Follower procedure: every segment came from the leader (acked by it), so no PUSH; delete what is no
        longer strongly referenced."""
        f = self.c.followers[self.pick(which)]
        for s in list(f.chain.segments):
            action = follower_action(f.chain, s.segment_id, leader_acked=True)
            assert action is not LocalAction.PUSH
            if action is LocalAction.DELETE:
                f.chain = Chain.of((x for x in f.chain.segments if x != s), f.chain.root)

    @precondition(lambda self: len(self.c.followers) < 3)
    @rule()
    def join_follower(self) -> None:
        """A new placement (new id, empty): the leader feeds it from the newest major."""
        self.add_follower()

    @rule(which=st.integers(0, 2), back=st.integers(1, MAX_BACKUPS), n=st.integers(1, 2))
    def follower_restored_then_write(self, which: int, back: int, n: int) -> None:
        """A follower loses its latest commits (restored from a backup) while the leader keeps writing. The
        leader's acks are now ahead of the follower: the next offer is OUT_OF_ORDER (EventQL 3.6 ABA case 1)
        and the sender restarts from the newest major."""
        f = self.c.followers[self.pick(which)]
        if f.backups:
            f.chain = f.backups[-min(back, len(f.backups))]
        self.write(n)

    @rule(base_index=st.integers(0, 50), n=st.integers(1, 2))
    def push_from_old_leader(self, base_index: int, n: int) -> None:
        """A segment written by the old leader (a fork of ours) arrives: the leader merges it, and merging
        the same segment again adds nothing (merge is idempotent, DESIGN 6)."""
        segs = self.c.leader.segments
        base = segs[base_index % len(segs)].segment_id if segs else None
        self.next_seg += 1
        fork = SegmentRef(f"old{self.next_seg}", base)
        self.c.rows[fork.segment_id] = self.new_rows(n)
        self.c.truth |= self.c.rows[fork.segment_id]
        for attempt in range(2):
            view = ReceiverView(LEADER_PID, self.c.leader, True, PartitionState.LIVE, LEADER_PID, self.c.epoch)
            outcome = receive_decision(view, Offer(fork, OLD_LEADER_PID, self.c.epoch - 1))
            assert outcome == Outcome.MERGE
            assert sender_reaction(outcome) is Reaction.ACK
            winners = self.c.rows[fork.segment_id] - self.c.resolve(self.c.leader)
            if attempt == 1:
                assert not winners, "a repeated merge must add nothing"
            if winners:
                self.leader_append(frozenset(winners))

    # ---- invariants ---------------------------------------------------------------------------------------

    @invariant()
    def leader_keeps_every_row(self) -> None:
        """Invariant 2: GC and compaction never lose a row visible at the leader."""
        assert self.c.resolve(self.c.leader) == self.c.truth

    @invariant()
    def chains_well_formed(self) -> None:
        """No duplicate ids (a fast-forward never re-adds a held segment), no malformed links."""
        assert check_links(self.c.leader.segments) == []
        for f in self.c.followers.values():
            assert check_links(f.chain.segments) == [], f.placement_id

    @invariant()
    def quiescence_converges_and_repeat_is_a_no_op(self) -> None:
        """Invariants 3 and 6, on a copy so the run itself is not disturbed."""
        probe = self.c.copy()
        quiesce(probe)
        leader_rows = probe.resolve(probe.leader)
        for pid, f in probe.followers.items():
            assert offer_order(probe.leader, probe.acks[pid]) == []
            assert probe.resolve(f.chain) == leader_rows, f"follower {pid} diverged"
            assert {s.segment_id for s in visible_segments(f.chain)} <= set(probe.rows)
        before = probe.snapshot()
        for pid in sorted(probe.followers):
            assert replicate_to(probe, pid) == []
        assert probe.snapshot() == before


TestReplicationModel = ReplicationModel.TestCase
