"""How far each split has come: its state and, per child, the segments it holds and still lacks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import select

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.splits import lacking_counts, replicas_behind, split_view
from segrep.core.states import SplitState


@dataclass(frozen=True)
class ChildProgress:
    partition_id: int
    begin_key: Any  # the child's range, as the catalog keeps keys (JSON values; None is unbounded)
    end_key: Any
    state: str
    site: str  # where its leader placement is
    acked: int  # the sources' segments it holds
    lacking: int  # the sources' segments it still lacks

    @property
    def key_range(self) -> str:
        """``[lo, hi)``, an unbounded end as -inf or +inf."""
        lo, hi = self.begin_key, self.end_key
        return f"[{'-inf' if lo is None else lo}, {'+inf' if hi is None else hi})"


@dataclass(frozen=True)
class SplitProgress:
    split_id: int
    table: str
    parent_partition_id: int
    parent_state: str
    split_keys: list[Any]
    is_async: bool
    state: SplitState
    sources: list[str]  # sites of the parent placements that push in the current phase
    children: list[ChildProgress]
    started_us: int
    finished_us: int | None
    replicas_behind: dict[str, int]  # "<child>@<site>" -> parent-derived segments that replica still lacks

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def lines(self) -> list[str]:
        """The split's state and sources, one line per child (acked, lacking), and what retiring the parent
        waits for: what ``segrep split``, ``segrep status`` and the split DAG print."""
        mode = "async" if self.is_async else "sync"
        lines = [
            f"split {self.split_id} of {self.table} partition {self.parent_partition_id} at {self.split_keys} "
            f"({mode}): {self.state}, parent {self.parent_state}, pushing from {', '.join(self.sources) or '-'}"
        ]
        for c in self.children:
            lines.append(
                f"  child {c.partition_id} {c.key_range} {c.state} at {c.site}: {c.acked} segment(s) acked, "
                f"{c.lacking} lacking"
            )
        if self.replicas_behind:
            waits = ", ".join(f"{where} lacks {n}" for where, n in sorted(self.replicas_behind.items()))
            lines.append(f"  the parent is retired once rounds carry the children to their replicas ({waits})")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def progress_text(rows: Sequence[SplitProgress]) -> str:
    """Several splits' progress, one after the other."""
    return "\n".join(line for r in rows for line in r.lines())


def split_progress(catalog: Catalog, table: str | None = None, *, include_done: bool = False) -> list[SplitProgress]:
    """Each split's state and, per child, how many of the sources' segments it holds and how many it lacks."""
    out = []
    with catalog.read() as s:
        query = select(m.Split).order_by(m.Split.split_id)
        if table is not None:
            query = query.where(m.Split.table_id == q.table_info(s, table).table_id)
        for split in s.scalars(query):
            if split.state == SplitState.DONE and not include_done:
                continue
            view = split_view(s, split.split_id)
            lacking = lacking_counts(view, None) if split.state != SplitState.DONE else {}
            behind = replicas_behind(s, view) if split.state == SplitState.UNLOAD else {}
            children = []
            for child in view.children:
                target = view.child_leaders[child.partition_id]
                children.append(
                    ChildProgress(
                        partition_id=child.partition_id,
                        begin_key=child.begin_key,
                        end_key=child.end_key,
                        state=child.state,
                        site=view.sites[target.site_id].name,
                        acked=len(view.acked.get(target.placement_id, ())),
                        lacking=lacking.get(child.partition_id, 0),
                    )
                )
            out.append(
                SplitProgress(
                    split_id=split.split_id,
                    table=view.info.name,
                    parent_partition_id=split.parent_partition_id,
                    parent_state=view.parent.state,
                    split_keys=list(split.split_keys),
                    is_async=split.is_async,
                    state=SplitState(split.state),
                    sources=sorted(view.sites[pl.site_id].name for pl in view.sources),
                    children=children,
                    started_us=split.created_us,
                    finished_us=split.finished_us,
                    replicas_behind=behind,
                )
            )
    return out
