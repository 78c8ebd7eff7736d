"""Chains built by operations, as a leader (and a leader change onto a fork) would: short constructors for
scenarios and a hypothesis strategy for generated chains."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hypothesis import strategies as st

from segrep.core.chain import MAX_SEGMENT_HISTORY, Chain, SegmentRef, visible_segments


def seg(segment_id: str, base: str | None, included: Iterable[str] = (), major: bool = False) -> SegmentRef:
    """Short constructor so scenarios read like the seed's prose."""
    return SegmentRef(segment_id, base, tuple(included), major)


def ids(segments: Iterable[SegmentRef]) -> list[str]:
    return [s.segment_id for s in segments]


@dataclass(frozen=True)
class Built:
    """A generated chain with each segment's rows: a major holds every row visible when it was written."""

    chain: Chain
    rows: dict[str, frozenset[int]]
    dropped: tuple[str, ...]


OPS = ("append", "compact", "append", "compact", "append", "fork", "drop", "append", "compact", "append_many")


@st.composite
def built_chains(draw: st.DrawFn, max_ops: int = 40) -> Built:
    """Build a chain by operations, as a leader (and a leader change onto a fork) would.

    append: a minor based on the root (a major based on NULL when empty); compact: fold the last k minors
    into a major based on the newest folded minor (the root), including their ids capped at
    MAX_SEGMENT_HISTORY; fork: a minor based on a non-root segment, sometimes made the root (a leader change
    onto the other branch); drop: GC of a non-root segment; append_many: enough minors to hit the cap.
    """
    segments: list[SegmentRef] = []
    rows: dict[str, frozenset[int]] = {}
    dropped: list[str] = []
    root: str | None = None
    counter = 0

    def new_id() -> str:
        nonlocal counter
        counter += 1
        return f"s{counter}"

    def chain() -> Chain:
        return Chain.of(segments, root)

    def add(base: str | None, included: tuple[str, ...] = (), major: bool = False) -> str:
        sid = new_id()
        segments.append(SegmentRef(sid, base, included, major))
        if major and base is not None:
            rows[sid] = frozenset().union(*(rows[s.segment_id] for s in visible_segments(chain())))
        else:
            rows[sid] = frozenset({counter})
        return sid

    for op in draw(st.lists(st.sampled_from(OPS), min_size=1, max_size=max_ops)):
        if op == "append":
            root = add(root, major=root is None)
        elif op == "append_many":
            if draw(st.integers(0, 9)) == 0:  # rare: keeps most examples small
                for _ in range(MAX_SEGMENT_HISTORY + 3):
                    root = add(root, major=root is None)
        elif op == "compact":
            root_seg = chain().get(root)
            minors = [s for s in visible_segments(chain()) if not s.is_major]
            if root_seg is None or root_seg.is_major or not minors:
                continue
            k = draw(st.integers(1, len(minors)))
            folded = tuple(s.segment_id for s in minors[-k:])
            root = add(root, included=folded[-MAX_SEGMENT_HISTORY:], major=True)
        elif op == "fork":
            others = [s.segment_id for s in segments if s.segment_id != root]
            if not others:
                continue
            fork = add(draw(st.sampled_from(others)))
            if draw(st.booleans()):
                root = fork
        elif op == "drop":
            others = [s for s in segments if s.segment_id != root]
            if not others:
                continue
            victim = draw(st.sampled_from(others))
            segments.remove(victim)
            dropped.append(victim.segment_id)
    return Built(chain(), rows, tuple(dropped))
