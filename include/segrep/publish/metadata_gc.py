"""Deleting the Iceberg files no retained snapshot references.

Every publication expires all but the newest snapshots (``publisher.KEEP_SNAPSHOTS``); pyiceberg deletes the
old metadata JSON files itself (``write.metadata.delete-after-commit.enabled``). What the expired snapshots
alone referenced (manifest lists, manifests, position delete files, winners indexes, filled copies of segment
files: ``filled_copies``) and what a publication
killed before its commit left behind are deleted here, once older than ``ORPHAN_GRACE_S``: a file that young
may belong to a publication still under way in another process. Segment files are never touched: they are
outside the ``_iceberg`` directory and belong to segrep's own GC.
"""

from __future__ import annotations

import json
import time

import pyarrow.fs as pafs
from pyiceberg.manifest import ManifestContent
from pyiceberg.table import Table as IcebergTable

from segrep.publish.filled_copies import FILLED_DIR
from segrep.publish.iceberg_files import ORPHAN_GRACE_S
from segrep.publish.site_catalog import ICEBERG_DIR, site_location
from segrep.storage.site import Site

_COLLECTED_DIRS = ("metadata", "deletes", "segrep", FILLED_DIR)
_KEPT_KEYS = ("segrep.index", "segrep.state")  # summary entries naming files of the snapshot
_DELTAS_KEY = "segrep.index-deltas"  # a JSON list of the index's delta files (winners_index)


def referenced(tbl: IcebergTable, *, data: bool = False) -> set[str]:
    """Every file under the table's location that a retained snapshot needs (URIs as the metadata names them);
    with ``data``, the data files listed there too (filled copies: reading every data manifest is only worth
    it when some copy could go)."""
    io = tbl.io
    location = tbl.location().rstrip("/") + "/"
    out: set[str] = set()
    seen: set[str] = set()
    for snap in tbl.metadata.snapshots:
        out.add(snap.manifest_list)
        for key in _KEPT_KEYS:
            if snap.summary is not None and snap.summary.get(key):
                out.add(str(snap.summary.get(key)))
        if snap.summary is not None and snap.summary.get(_DELTAS_KEY):
            out.update(json.loads(str(snap.summary.get(_DELTAS_KEY))))
        for mf in snap.manifests(io):
            out.add(mf.manifest_path)
            wanted = mf.content == ManifestContent.DELETES or data
            if not wanted or mf.manifest_path in seen:
                continue
            seen.add(mf.manifest_path)
            paths = (e.data_file.file_path for e in mf.fetch_manifest_entry(io, discard_deleted=True))
            out.update(p for p in paths if mf.content == ManifestContent.DELETES or p.startswith(location))
    return out


def collect_unreferenced(tbl: IcebergTable, site: Site, table: str, *, now: float | None = None) -> int:
    """Delete the files of ``table``'s Iceberg directory at ``site`` that no retained snapshot references and
    that are older than the grace; return how many."""
    base = site_location(site).base
    root = site.root.rstrip("/") + "/"
    cutoff_ns = int(((time.time() if now is None else now) - ORPHAN_GRACE_S) * 1e9)
    selector = pafs.FileSelector(site.path(f"{table}/{ICEBERG_DIR}"), recursive=True, allow_not_found=True)
    candidates: list[tuple[str, str]] = []  # (path, relative path) of files past the grace
    for info in site.fs.get_file_info(selector):
        if info.type != pafs.FileType.File or not info.path.startswith(root):
            continue
        rel = info.path[len(root) :]
        parts = rel.split("/")
        if len(parts) != 4 or parts[2] not in _COLLECTED_DIRS or parts[3].endswith(".metadata.json"):
            continue
        if info.mtime_ns is not None and info.mtime_ns <= cutoff_ns:
            candidates.append((info.path, rel))
    if not candidates:
        return 0
    keep = referenced(tbl, data=any(rel.split("/")[2] == FILLED_DIR for _path, rel in candidates))
    deleted = 0
    for path, rel in candidates:
        if f"{base}/{rel}" not in keep:
            site.fs.delete_file(path)
            deleted += 1
    return deleted
