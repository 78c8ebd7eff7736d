"""A write that then publishes the leaders' copies: the public ``segrep.write_batch``.

``data.writer.write_batch`` commits; this also publishes, when the definitions are given and the table's
policy says ``publish: iceberg``, the copies of the sites that took the write (each partition's leader, or the
site written at), so an engine reading a leader's Iceberg table sees the write at once. A publication that
fails is logged and leaves the write committed; the next round publishes again.
"""

from __future__ import annotations

import logging

import pyarrow as pa

from segrep.catalog import Catalog
from segrep.config.definitions import Definitions
from segrep.data.writer import WriteResult
from segrep.data.writer import write_batch as write_only
from segrep.publish.publisher import Publication, PublishStatus, publish_table

log = logging.getLogger(__name__)


def publish_written(catalog: Catalog, defs: Definitions | None, result: WriteResult) -> Publication:
    """Publish the sites ``result`` wrote segments at (nothing without definitions or segments)."""
    if defs is None or not result.segments:
        return Publication(result.table)
    pub = publish_table(catalog, defs, result.table, sorted({seg.site for seg in result.segments}))
    for x in pub.sites:
        if x.status is PublishStatus.FAILED:
            log.warning("write to %s committed; %s", result.table, x.line())
    return pub


def write_batch(
    catalog: Catalog,
    table: str,
    batch: pa.Table,
    *,
    delete: bool = False,
    site: str | None = None,
    defs: Definitions | None = None,
) -> WriteResult:
    """:func:`segrep.data.writer.write_batch`, then the written sites' Iceberg publication (with ``defs``)."""
    result = write_only(catalog, table, batch, delete=delete, site=site, defs=defs)
    publish_written(catalog, defs, result)
    return result
