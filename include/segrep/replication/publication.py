"""Publishing a table's open tables with the safe times rounds would give its leaders.

``publish.publisher.publish_table`` cannot compute a leader's safe time itself (rounds bound a leader by the
forks its followers hold unmerged: ``safetime.leader_vouches``, a replication concept); every caller at this
layer or above publishes through :func:`publish`, which passes ``safetime.leader_safe_time``; the public
``segrep.write_batch`` is :func:`write_batch` here, a write followed by the written sites' publication.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pyarrow as pa

from segrep.catalog import Catalog
from segrep.config.definitions import Definitions
from segrep.data.writer import WriteResult
from segrep.data.writer import write_batch as write_only
from segrep.publish.outcome import Publication, PublishStatus
from segrep.publish.policy import enabled
from segrep.replication.safetime import leader_safe_time

log = logging.getLogger(__name__)


def publish(catalog: Catalog, defs: Definitions, table: str, sites: Sequence[str] | None = None) -> Publication:
    """:func:`publish_table` with the leaders' safe times as rounds count them. A table that does not publish
    is answered here (an empty result, as ``publish_table`` gives it)."""
    if not enabled(defs, table):
        return Publication(table)
    # Imported by the first publication of the process: the publisher brings pyiceberg (0.35 s), which a round
    # or a write of a table that does not publish never uses.
    from segrep.publish.publisher import publish_table

    return publish_table(catalog, defs, table, sites, leader_safe_time=leader_safe_time)


def write_batch(
    catalog: Catalog,
    table: str,
    batch: pa.Table,
    *,
    delete: bool = False,
    site: str | None = None,
    defs: Definitions | None = None,
) -> WriteResult:
    """The public ``segrep.write_batch``: :func:`segrep.data.writer.write_batch`, then (given the definitions,
    for a table whose policy says ``publish: iceberg``) the publication of the sites that took the write, so
    an engine reading a leader's Iceberg table sees it at once. A publication that fails is logged and leaves
    the write committed; the next round publishes again."""
    result = write_only(catalog, table, batch, delete=delete, site=site, defs=defs)
    for x in publish_written(catalog, defs, result).sites:
        if x.status is PublishStatus.FAILED:
            log.warning("write to %s committed; %s", table, x.line())
    return result


def publish_written(catalog: Catalog, defs: Definitions | None, result: WriteResult) -> Publication:
    """The publication of the sites a committed write wrote segments at (nothing without the definitions)."""
    written = sorted({seg.site for seg in result.segments})
    if defs is None or not written:
        return Publication(result.table)
    return publish(catalog, defs, result.table, written)
