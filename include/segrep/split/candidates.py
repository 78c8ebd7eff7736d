"""The partitions of a table a split can take now, with their key ranges: what the split form asks for.

Why from the catalog and not the definitions: after the first split the definitions' split points name
retired partitions (the demo splits one). The split DAG's first task answers a missing or wrong id with this
list, and the operator page shows it on the split DAG's page, so the form (built at parse time, when no DAG
file may read the catalog) needs no default.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import select

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog import queries as q


@dataclass(frozen=True)
class SplitCandidate:
    partition_id: int
    begin_key: Any  # as stored (JSON); None: unbounded
    end_key: Any
    state: str
    leader_site: str | None

    @property
    def key_range(self) -> str:
        """``[150000, 300000)``, ``[-inf, 150000)``: the range as the form's split keys must fall inside it."""
        low = "-inf" if self.begin_key is None else json.dumps(self.begin_key)
        high = "+inf" if self.end_key is None else json.dumps(self.end_key)
        return f"[{low}, {high})"

    def line(self) -> str:
        return f"{self.partition_id} {self.key_range} {self.state}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "key_range": self.key_range}


def split_candidates(catalog: Catalog, table: str) -> list[SplitCandidate]:
    """Every partition serving ``table`` now, in key order (NotFoundError naming an unknown table)."""
    with catalog.read() as s:
        info = q.table_info(s, table)
        parts = q.serving_partitions(s, info)
        leaders = dict(
            s.execute(
                select(m.Partition.partition_id, m.Site.name)
                .join(m.Placement, m.Placement.placement_id == m.Partition.leader_placement_id)
                .join(m.Site, m.Site.site_id == m.Placement.site_id)
                .where(m.Partition.table_id == info.table_id)
            ).all()
        )
        return [
            SplitCandidate(p.partition_id, p.begin_key, p.end_key, str(p.state), leaders.get(p.partition_id))
            for p in parts
        ]
