"""Pure functions over one placement's segment list (EventQL section 3).

A placement keeps a list of segments (oldest first) and a root segment id. The *walk* starts at the root and
follows ``base_segment_id`` back until it reaches NULL or a segment this placement no longer holds. Everything
here is pure: no I/O, no catalog, so the protocol can be tested as properties.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

MAX_SEGMENT_HISTORY = 64


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """The chain-relevant part of a segment's catalog entry."""

    segment_id: str
    base_segment_id: str | None
    included_segment_ids: tuple[str, ...] = ()
    is_major: bool = False


@dataclass(frozen=True)
class Chain:
    """A placement's segments, oldest first, and its root segment id (None while empty)."""

    segments: tuple[SegmentRef, ...]
    root: str | None
    _by_id: dict[str, SegmentRef] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {s.segment_id: s for s in self.segments})

    @classmethod
    def of(cls, segments: Iterable[SegmentRef], root: str | None) -> Chain:
        return cls(tuple(segments), root)

    def get(self, segment_id: str | None) -> SegmentRef | None:
        return None if segment_id is None else self._by_id.get(segment_id)

    def __contains__(self, segment_id: object) -> bool:
        return segment_id in self._by_id

    def without(self, removed: Iterable[str]) -> Chain:
        """This chain rewound past ``removed``: those segments gone, the root at the newest segment of the
        walk that is not removed (a returned old leader's chain once its lost segments are set aside)."""
        gone = set(removed) & set(self._by_id)
        if not gone:
            return self
        root = next((ref.segment_id for ref in self.walk() if ref.segment_id not in gone), None)
        return Chain.of((ref for ref in self.segments if ref.segment_id not in gone), root)

    def walk(self) -> list[SegmentRef]:
        """Segments from the root back through ``base_segment_id`` (newest first)."""
        out: list[SegmentRef] = []
        seen: set[str] = set()
        seg = self.get(self.root)
        while seg is not None and seg.segment_id not in seen:
            out.append(seg)
            seen.add(seg.segment_id)
            seg = self.get(seg.base_segment_id)
        return out


def newer_than(chain: Chain, base: str | None) -> list[str] | None:
    """The ids on the chain's walk newer than ``base`` (newest first), or None if ``base`` is not on the walk:
    what a chain holds past a segment it shares with another chain (a fork since their common segment)."""
    if base is None:
        return None
    out: list[str] = []
    for seg in chain.walk():
        if seg.segment_id == base:
            return out
        out.append(seg.segment_id)
    return None


def is_referenced(chain: Chain, segment_id: str) -> bool:
    """True if the segment is on the walk or folded into (included by) a segment on the walk."""
    return any(s.segment_id == segment_id or segment_id in s.included_segment_ids for s in chain.walk())


def referenced_ids(chain: Chain) -> set[str]:
    """Every segment id the chain references: ``is_referenced`` for all of them at once."""
    return {sid for ref in chain.walk() for sid in (ref.segment_id, *ref.included_segment_ids)}


def is_reference_weak(chain: Chain, segment_id: str) -> bool:
    """True unless the segment is on the walk at or before (newer than or equal to) the newest major.

    A weakly referenced segment's rows live on in a major segment, so its own file may go once nobody needs
    it. An unreferenced segment is reported weak too, as in the seed; callers check is_referenced first.
    """
    for seg in chain.walk():
        if segment_id in seg.included_segment_ids:
            return True
        if seg.segment_id == segment_id:
            return False
        if seg.is_major:
            return True
    return True


def is_strongly_referenced(chain: Chain, segment_id: str) -> bool:
    return is_referenced(chain, segment_id) and not is_reference_weak(chain, segment_id)


def newest_major(chain: Chain) -> SegmentRef | None:
    """The first major segment on the walk from the root."""
    return next((s for s in chain.walk() if s.is_major), None)


def visible_segments(chain: Chain) -> list[SegmentRef]:
    """The segments whose rows make up the placement: newest major up to the root, oldest first.

    Segments behind the newest major are already folded into it; forks (not on the walk) are not visible
    until merged. If no major is on the walk (its history was collected), the whole walk is visible.
    """
    out: list[SegmentRef] = []
    for seg in chain.walk():
        out.append(seg)
        if seg.is_major:
            break
    out.reverse()
    return out


def covering_majors(chain: Chain, segment_id: str) -> list[SegmentRef]:
    """The major segments on the walk whose data includes a weakly referenced segment: every major newer
    than it on the walk, and the one listing it as included (newest first). Each holds all its rows."""
    majors: list[SegmentRef] = []
    for seg in chain.walk():
        if segment_id in seg.included_segment_ids:
            return [*majors, seg] if seg.is_major else majors
        if seg.segment_id == segment_id:
            return majors
        if seg.is_major:
            majors.append(seg)
    return []


def offer_order(chain: Chain, acked: Iterable[str]) -> list[SegmentRef]:
    """Segments to offer a replica, in order: the walk from the newest major to the root, minus acked ones.

    The sender offers them one at a time and stops at the first that is not acknowledged, so no segment is
    offered before its predecessor was acked (replication order, EventQL 3.4).
    """
    acked_set = set(acked)
    return [s for s in visible_segments(chain) if s.segment_id not in acked_set]


class LocalAction(StrEnum):
    """What a placement does with one of its own segments during a replication pass."""

    KEEP = "keep"
    DELETE = "delete"
    MERGE = "merge"  # leader: a fork, merge its rows into the partition, then delete it
    PUSH = "push"  # follower: written while it was leader, push it to the current leader


def leader_action(chain: Chain, segment_id: str, acked_by_all_replicas: Iterable[str]) -> LocalAction:
    """The leader's decision for one of its own segments (EventQL 3.5 replicate_partition).

    ``acked_by_all_replicas`` holds the ids of segments every LIVE or JOINING replica has acknowledged; a
    weakly referenced segment goes only once a major that covers it is among them. Any newer major on the
    walk covers it, so deletability is monotone along the walk: when a segment may go, so may every older
    one, and a GC pass never cuts the walk in front of a segment it keeps (which would turn it into a
    false fork).
    """
    if not is_referenced(chain, segment_id):
        return LocalAction.MERGE
    if not is_reference_weak(chain, segment_id):
        return LocalAction.KEEP
    acked = set(acked_by_all_replicas)
    if any(major.segment_id in acked for major in covering_majors(chain, segment_id)):
        return LocalAction.DELETE
    return LocalAction.KEEP


def follower_action(chain: Chain, segment_id: str, leader_acked: bool) -> LocalAction:
    """A follower's decision for one of its own segments.

    ``leader_acked`` says whether the *current* leader placement (by placement id, never site name: EventQL
    3.6) is in the segment's acked list. A segment the leader lacks was written while this placement led
    and is pushed; one the leader holds is kept while strongly referenced here and deleted otherwise.
    """
    if not leader_acked:
        return LocalAction.PUSH
    if is_strongly_referenced(chain, segment_id):
        return LocalAction.KEEP
    return LocalAction.DELETE


def check_links(segments: Sequence[SegmentRef]) -> list[str]:
    """Problems that make a segment list malformed (for catalog rebuilds and tests): ids not unique, a
    segment based on itself, too long an included list, a first segment that is not major."""
    problems: list[str] = []
    seen: set[str] = set()
    for seg in segments:
        if seg.segment_id in seen:
            problems.append(f"segment {seg.segment_id} appears twice")
        seen.add(seg.segment_id)
        if seg.base_segment_id == seg.segment_id:
            problems.append(f"segment {seg.segment_id} is based on itself")
        if len(seg.included_segment_ids) > MAX_SEGMENT_HISTORY:
            problems.append(f"segment {seg.segment_id} includes more than {MAX_SEGMENT_HISTORY} segments")
        if seg.base_segment_id is None and not seg.is_major:
            problems.append(f"segment {seg.segment_id} has no base but is not major")
    return problems
