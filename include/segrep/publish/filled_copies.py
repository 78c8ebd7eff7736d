"""Segment files published as copies with the defaulted columns they lack filled in (DESIGN 16 and 18).

A column added with a default reads as that default in rows written before it existed. segrep and pyiceberg
apply the published schema's ``initial-default``, but Iceberg format v2 has no column defaults: an engine that
follows v2 strictly (ClickHouse) reads such a column as null in those files, a wrong row. So a segment file
lacking a column to which the current schema gives a default is published as a copy of itself at the current
schema version (``core.projection``: the same rows in the same order, so every position a delete names stays
valid; the current field ids): ``<table>/_iceberg/filled/<name>-<digest of its path>-v<version>.parquet`` at
the same site. The segment file itself is untouched. A copy is made once per file and version, read from the
segment with every check a user's read makes, written atomically, and reused by later snapshots; once no
retained snapshot lists it (compaction rewrote the segment), ``metadata_gc`` deletes it.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.core.projection import stamp
from segrep.core.schema_versions import SchemaVersion
from segrep.data.reader import expected_segment
from segrep.publish.site_catalog import ICEBERG_DIR
from segrep.storage.site import META_KEY, Site

FILLED_DIR = "filled"


@dataclass(frozen=True)
class FilledCopy:
    relpath: str  # under the site's root
    byte_size: int


def lacks_defaults(file_version: SchemaVersion, current: SchemaVersion) -> bool:
    """True if a file written at ``file_version`` lacks a column that ``current`` gives a default."""
    have = {c.field_id for c in file_version.columns}
    return any(c.default is not None and c.field_id not in have for c in current.columns)


def copy_relpath(table: str, relpath: str, version: int) -> str:
    """Where the copy of the segment file ``relpath`` at schema ``version`` goes: one directory, a name per
    file (a split's children hold files of one segment id in two partition directories) and version."""
    stem = posixpath.splitext(posixpath.basename(relpath))[0]
    digest = hashlib.sha256(relpath.encode()).hexdigest()[:16]
    return f"{table}/{ICEBERG_DIR}/{FILLED_DIR}/{stem}-{digest}-v{version}.parquet"


def filled_copy(site: Site, info: q.TableInfo, seg: m.Segment) -> FilledCopy:
    """The copy of ``seg``'s file at ``site`` at the table's current schema version: the one already there
    if it is complete (its footer names this file and version, with the catalog's row count), else written."""
    current = info.versions.target
    rel = copy_relpath(info.name, seg.relpath, current.version)
    done = _complete(site, rel, seg, current.version)
    if done is not None:
        return done
    rows = site.read_checked(seg.relpath, expected_segment(info, seg), info.primary_key, versions=info.versions)
    entry = {"copy_of": seg.relpath, "segment_id": seg.segment_id, "schema_version": current.version}
    facts = site.write_segment(rel, stamp(rows, current), entry)
    return FilledCopy(rel, facts.byte_size)


def _complete(site: Site, rel: str, seg: m.Segment, version: int) -> FilledCopy | None:
    path = site.path(rel)
    info = site.fs.get_file_info(path)
    if info.type != pafs.FileType.File or info.size is None:
        return None
    try:
        footer = pq.read_metadata(path, filesystem=site.fs)
        entry = json.loads((footer.metadata or {}).get(META_KEY, b"{}"))
    except (pa.ArrowInvalid, OSError, ValueError):  # a damaged copy is written again
        return None
    if entry.get("copy_of") != seg.relpath or entry.get("schema_version") != version:
        return None
    return FilledCopy(rel, int(info.size)) if footer.num_rows == seg.row_count else None
