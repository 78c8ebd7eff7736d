"""Segment files published as copies with the defaulted columns they lack filled in (DESIGN 16 and 18).

A column added with a default reads as that default in rows written before it existed. segrep and pyiceberg
apply the published schema's ``initial-default``, but Iceberg format v2 has no column defaults: an engine that
follows v2 strictly (ClickHouse) reads such a column as null in those files, a wrong row. So a segment file
lacking a column to which the current schema gives a default is published as a copy of itself at the current
schema version (``core.projection``: the same rows in the same order, so every position a delete names stays
valid; the current field ids): ``<table>/_iceberg/filled/<name>-<digest of its path>-<fill>.parquet`` at
the same site, ``<fill>`` a digest of the columns it fills. The segment file itself is untouched. A copy is
made once per file and fill, read from the segment with every check a user's read makes, written atomically,
and reused by later snapshots (a later schema change that adds no defaulted column keeps it); once no
retained snapshot lists it (compaction rewrote the segment), ``metadata_gc`` deletes it.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import time
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.core.projection import stamp
from segrep.core.schema_versions import SchemaVersion
from segrep.data.reader import expected_segment
from segrep.publish.iceberg_files import ORPHAN_GRACE_S
from segrep.publish.site_catalog import ICEBERG_DIR
from segrep.storage.site import META_KEY, Site

FILLED_DIR = "filled"


@dataclass(frozen=True)
class FilledCopy:
    relpath: str  # under the site's root
    byte_size: int


def fill_key(file_version: SchemaVersion, current: SchemaVersion) -> str | None:
    """What a copy of a file written at ``file_version`` fills in, as a short digest of the columns (field id,
    type, default) that ``current`` gives a default and the file lacks; None if there are none. A later schema
    change that adds no such column (a rename, a widening, a nullable column) keeps the copy: engines match
    its columns by field id."""
    have = {c.field_id for c in file_version.columns}
    fills = [
        [c.field_id, c.type, c.default] for c in current.columns if c.default is not None and c.field_id not in have
    ]
    if not fills:
        return None
    return hashlib.sha256(json.dumps(fills, sort_keys=True, default=str).encode()).hexdigest()[:12]


def copy_relpath(table: str, relpath: str, key: str) -> str:
    """Where the copy of the segment file ``relpath`` filling ``key`` goes: one directory, a name per file (a
    split's children hold files of one segment id in two partition directories) and fill."""
    stem = posixpath.splitext(posixpath.basename(relpath))[0]
    digest = hashlib.sha256(relpath.encode()).hexdigest()[:16]
    return f"{table}/{ICEBERG_DIR}/{FILLED_DIR}/{stem}-{digest}-{key}.parquet"


def filled_copy(site: Site, info: q.TableInfo, seg: m.Segment, key: str, *, listed: bool) -> FilledCopy:
    """The copy of ``seg``'s file at ``site`` filling ``key``, projected to the table's current schema version:
    the one already there if it is complete (its footer names this file and fill, with the catalog's row
    count) and either the current snapshot lists it (``listed``) or it is young (an older one nothing lists
    may be an orphan another process's GC is about to delete); else written anew, atomically."""
    rel = copy_relpath(info.name, seg.relpath, key)
    done = _complete(site, rel, seg, key, None if listed else time.time() - ORPHAN_GRACE_S / 2)
    if done is not None:
        return done
    rows = site.read_checked(seg.relpath, expected_segment(info, seg), info.primary_key, versions=info.versions)
    entry = {"copy_of": seg.relpath, "segment_id": seg.segment_id, "fills": key}
    facts = site.write_segment(rel, stamp(rows, info.versions.target), entry)
    return FilledCopy(rel, facts.byte_size)


def _complete(site: Site, rel: str, seg: m.Segment, key: str, newer_than: float | None) -> FilledCopy | None:
    path = site.path(rel)
    info = site.fs.get_file_info(path)
    if info.type != pafs.FileType.File or info.size is None:
        return None
    if newer_than is not None and (info.mtime_ns is None or info.mtime_ns < newer_than * 1e9):
        return None
    try:
        footer = pq.read_metadata(path, filesystem=site.fs)
        entry = json.loads((footer.metadata or {}).get(META_KEY, b"{}"))
    except (pa.ArrowInvalid, OSError, ValueError):  # a damaged copy is written again
        return None
    if entry.get("copy_of") != seg.relpath or entry.get("fills") != key or footer.num_rows != seg.row_count:
        return None
    return FilledCopy(rel, int(info.size))
