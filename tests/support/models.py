"""An independent model of what a leader should hold, replayed next to the engine's writes."""

from __future__ import annotations

from collections.abc import Iterable

from segrep.data.writer import write_batch
from tests.support.env import Env
from tests.support.tables import TABLE, TENANTS, batch


class Model:
    """What the leader should hold: key -> payload, replayed independently of the engine."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, int], str] = {}

    def upsert(self, env: Env, keys: Iterable[int], tag: str) -> int:
        """Write; return the oldest row version of the new segments."""
        keys = list(keys)
        result = write_batch(env.catalog, TABLE, batch(keys, tag))
        for k in keys:
            self.rows[(TENANTS[k % len(TENANTS)], k)] = f"{tag}{k}"
        return min(seg.version for seg in result.segments)

    def delete(self, env: Env, keys: Iterable[int]) -> None:
        keys = list(keys)
        write_batch(env.catalog, TABLE, batch(keys, "").select(["tenant", "seq"]), delete=True)
        for k in keys:
            self.rows.pop((TENANTS[k % len(TENANTS)], k), None)

    def snapshot(self) -> list[tuple[str, int, str]]:
        return sorted((t, s, p) for (t, s), p in self.rows.items())
