"""Publishing a table's open tables with the safe times rounds would give its leaders.

``publish.publisher.publish_table`` cannot compute a leader's safe time itself (rounds bound a leader by the
forks its followers hold unmerged: ``safetime.leader_vouches``, a replication concept); every caller at this
layer or above publishes through :func:`publish`, which passes ``safetime.leader_safe_time``.
"""

from __future__ import annotations

from collections.abc import Sequence

from segrep.catalog import Catalog
from segrep.config.definitions import Definitions
from segrep.publish.publisher import Publication, publish_table
from segrep.replication.safetime import leader_safe_time


def publish(catalog: Catalog, defs: Definitions, table: str, sites: Sequence[str] | None = None) -> Publication:
    """:func:`publish_table` with the leaders' safe times as rounds count them."""
    return publish_table(catalog, defs, table, sites, leader_safe_time=leader_safe_time)
