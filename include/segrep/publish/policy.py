"""Whether a table publishes its sites' copies as Iceberg tables (``policy: {publish: iceberg}``).

Apart from ``publish.publisher`` so that a caller can ask before importing it: the publisher brings pyiceberg
(0.35 s of a process), which a ``segrep write`` or ``segrep round`` of a table that does not publish has no use
for.
"""

from __future__ import annotations

from segrep.config.definitions import Definitions

PUBLISH_ICEBERG = "iceberg"


def enabled(defs: Definitions, table: str) -> bool:
    return defs.policy(table).publish == PUBLISH_ICEBERG
