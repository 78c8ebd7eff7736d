"""Every state and outcome enum of the package, in one place: partitions, placements, splits, offers.

The catalog stores these as strings (``StrEnum``), so a row reads back equal to its enum member.
"""

from __future__ import annotations

from enum import StrEnum


class PartitionState(StrEnum):
    LOADING = "LOADING"
    LIVE = "LIVE"
    SPLITTING = "SPLITTING"
    UNLOAD = "UNLOAD"
    UNLOAD_FINAL = "UNLOAD_FINAL"


class PlacementState(StrEnum):
    JOINING = "JOINING"
    LIVE = "LIVE"
    REMOVED = "REMOVED"


class Outcome(StrEnum):
    """The receiver's answer to an offer: two ways to accept, six reasons to decline."""

    FAST_FORWARD = "FAST_FORWARD"
    MERGE = "MERGE"
    SEGMENT_EXISTS = "SEGMENT_EXISTS"
    OVERLOADED = "OVERLOADED"
    INVALID = "INVALID"
    INFLIGHT = "INFLIGHT"
    OUT_OF_ORDER = "OUT_OF_ORDER"
    # A follower back from leading: past the offered segment's base its chain holds forks the leader has not
    # merged yet. Offered again once they are merged: then it rewinds to that common segment (no major).
    UNMERGED = "UNMERGED"

    @property
    def accepted(self) -> bool:
        return self in (Outcome.FAST_FORWARD, Outcome.MERGE)


class Reaction(StrEnum):
    """What the sender does after an outcome."""

    ACK = "ack"  # record the target placement in the segment's acked list, go on with the next segment
    STOP = "stop"  # stop offering to this target for now; retry next round (with backoff)
    RESTART = "restart"  # drop the target's acks for this partition and restart from the newest major


class SplitState(StrEnum):
    """A split row's state; the partitions carry the protocol's states (SPLITTING, UNLOAD, UNLOAD_FINAL)."""

    SPLITTING = "SPLITTING"  # children being filled from the parent leader
    UNLOAD = "UNLOAD"  # finalized: writes go to the children; parent placements push what they lack
    DONE = "DONE"  # UNLOAD_FINAL: the parent is retired


class SplitPhase(StrEnum):
    """The pass a split runs: which parent placements push (a pass, not a state of the split row)."""

    COPY = "copy"  # while SPLITTING: the parent leader offers its chain to every child leader
    UNLOAD = "unload"  # after SPLIT_FINALIZE: every parent placement pushes what the children lack
