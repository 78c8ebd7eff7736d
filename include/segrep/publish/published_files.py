"""The segment files a site's current published snapshot lists, which GC must leave in place.

A publication that failed, or has not run yet, leaves the previous snapshot current (DESIGN 18): engines keep
reading it, so the files it lists must outlive the catalog rows GC deletes. ``maintenance.gc`` asks this before
it removes a file of a published table; when the snapshot cannot be read (the Iceberg catalog or the site does
not answer) it cannot know, and keeps every file of that table at that site.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.manifest import ManifestContent

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog.site_identity import open_site
from segrep.config.iceberg_catalog import IcebergCatalogDef
from segrep.publish.site_catalog import identifier, site_catalog, site_location


@dataclass(frozen=True)
class PublishedFiles:
    """The files (relative paths under the site's root) the current snapshot lists; ``unknown`` says why
    they could not be read (then every file of the table at the site is to be kept)."""

    relpaths: frozenset[str] = frozenset()
    unknown: str | None = None

    def keeps(self, relpath: str) -> bool:
        return self.unknown is not None or relpath in self.relpaths


def published_files(catalog: Catalog, site: m.Site, table: str, choice: IcebergCatalogDef | None) -> PublishedFiles:
    """What ``site``'s current snapshot of ``table`` lists (nothing if the table was never registered)."""
    try:
        ice = site_catalog(catalog, site.name, site.uri, choice)
        try:
            tbl = ice.load_table(identifier(site.name, table))
        except NoSuchTableError:
            return PublishedFiles()
        snap = tbl.current_snapshot()
        if snap is None:
            return PublishedFiles()
        prefix = site_location(open_site(catalog, site)).base + "/"
        out = set()
        for mf in snap.manifests(tbl.io):
            if mf.content != ManifestContent.DATA:
                continue
            for entry in mf.fetch_manifest_entry(tbl.io, discard_deleted=True):
                path = entry.data_file.file_path
                out.add(path[len(prefix) :] if path.startswith(prefix) else path)
        return PublishedFiles(frozenset(out))
    except Exception as exc:  # the catalog service, the site or a metadata file: unknown, so everything stays
        return PublishedFiles(unknown=f"{type(exc).__name__}: {exc}")
