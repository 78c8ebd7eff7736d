"""The live partitions of a table with their key ranges, for the split form's errors.

Why here and not in the form: a trigger form is built when the DAG file is parsed, and a DAG file must not
read the catalog (parse happens every 30 s in the dag-processor, for every table, with no task to account
for it). The definitions' split points are no better: after the first split they name retired partitions.
So the form asks for a partition id with no default, and the split DAG's first task, which may read the
catalog, answers a missing or wrong id with this list before it changes anything.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from segrep.catalog import Catalog


def live_partitions(catalog: Catalog, table: str) -> list[str]:
    """One line per partition serving the table now: ``5 [150000, 300000) LIVE``, in key order."""
    from segrep.catalog import queries as q

    with catalog.read() as s:
        info = q.table_info(s, table)
        parts = q.serving_partitions(s, info)
        return [f"{p.partition_id} {key_range(p.begin_key, p.end_key)} {p.state}" for p in parts]


def key_range(begin: object, end: object) -> str:
    low = "-inf" if begin is None else json.dumps(begin)
    high = "+inf" if end is None else json.dumps(end)
    return f"[{low}, {high})"
