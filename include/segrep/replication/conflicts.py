"""Active-active conflicts over a recent window, from the kept round reports (``segrep status``).

Each merge counts its concurrent overwrites per site pair (``spark.conflicts``) into its round's report; this
sums them per table and pair over the rounds that finished in the window, keeping a few sample keys.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import select

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.core import hlc
from segrep.spark.conflicts import SAMPLE_KEYS

WINDOW_S = 24 * 3600


@dataclass
class RecentConflicts:
    table: str
    site: str  # whose rows were overwritten
    by: str  # whose concurrent write won
    rows: int
    rounds: int  # rounds in the window that counted some
    sample: list[list[Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def recent_conflicts(catalog: Catalog, table: str | None = None, window_s: int = WINDOW_S) -> list[RecentConflicts]:
    """Conflicts per (table, site, by) in the rounds that finished in the last ``window_s`` seconds."""
    since = hlc.now_us() - window_s * 1_000_000
    query = (
        select(m.Table.name, m.Round.report)
        .join(m.Table, m.Table.table_id == m.Round.table_id)
        .where(m.Round.finished_us >= since)
    )
    if table is not None:
        query = query.where(m.Table.name == table)
    out: dict[tuple[str, str, str], RecentConflicts] = {}
    with catalog.read() as s:
        for name, report in s.execute(query):
            for c in ((report or {}).get("merges") or {}).get("conflicts", []):
                key = (name, c["site"], c["by"])
                acc = out.setdefault(key, RecentConflicts(name, c["site"], c["by"], 0, 0))
                acc.rows += int(c["rows"])
                acc.rounds += 1
                acc.sample = (acc.sample + list(c.get("sample", [])))[:SAMPLE_KEYS]
    return [out[k] for k in sorted(out)]
