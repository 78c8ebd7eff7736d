"""The schema versions a read of a table works with: the ONE place the read paths ask (DESIGN 16).

Every reader, merge, compaction, rollback and digest projects each segment file to ``target_version`` by
field id (``core.projection``); a file without schema metadata is read as ``initial_version``.
"""

from __future__ import annotations

from segrep.catalog.queries import TableInfo
from segrep.core.projection import ReadVersions
from segrep.core.schema_versions import SchemaVersion


def target_version(info: TableInfo) -> SchemaVersion:
    """The version the table's rows are read at: its current one (``tables.schema_version``)."""
    return info.versions.target


def initial_version(info: TableInfo) -> SchemaVersion:
    """The table's version 1: what a segment file written before versions existed holds."""
    return info.versions.first


def read_versions(info: TableInfo) -> ReadVersions:
    return info.versions
