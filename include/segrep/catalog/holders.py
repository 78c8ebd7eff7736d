"""The union rule (DESIGN section 13): a segment file one site lost may still be held by another.

A segment's bytes are the same at every site, so any site whose file at the segment's path has the catalog's
size and sha256 holds the segment, whether or not its own list names it. Before a rebuild drops a catalog
segment whose file is gone, it asks every other site for it and fetches an intact copy back (verified,
atomic: ``storage.transfer``). A site that cannot be asked (down, refusing) is named, never taken for one
that lacks the file.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from segrep.catalog import models as m
from segrep.catalog.site_identity import expected_identity
from segrep.core.errors import SegrepError
from segrep.storage.atomic import FileFacts
from segrep.storage.site import Expected, Site
from segrep.storage.stores import STORE_ERRORS, first_line
from segrep.storage.transfer import copy_verified

# what makes a site unusable as a source: its store's errors, and ours (a URI its file system cannot open)
_UNUSABLE: tuple[type[Exception], ...] = (*STORE_ERRORS, SegrepError)


@dataclass
class Holders:
    """The other sites, opened at most once each, and which of them could not be asked (with why)."""

    sites: list[m.Site]
    expected: dict[str, Expected]  # each site's identity marker, checked before it is asked (a vanished
    # root is unreachable, never a site that lacks the file)
    opened: dict[str, Site] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)  # site name -> why it could not be asked

    @classmethod
    def besides(cls, s: Session, everywhere: Iterable[m.Site], site_name: str) -> Holders:
        others = sorted((x for x in everywhere if x.name != site_name), key=lambda x: x.name)
        return cls(others, {x.name: Expected(expected_identity(s, x)) for x in others})

    def find(self, relpath: str, want: FileFacts) -> Site | None:
        """The first site (by name) whose file at ``relpath`` has exactly ``want``'s size and sha256."""
        for row in self.sites:
            site = self._open(row)
            if site is None:
                continue
            try:
                facts = site.facts(relpath)
            except FileNotFoundError:
                continue
            except _UNUSABLE as exc:
                self.unreachable.setdefault(row.name, first_line(exc))
                continue
            if facts == want:
                return site
        return None

    def _open(self, row: m.Site) -> Site | None:
        if row.name in self.unreachable:
            return None
        if row.name not in self.opened:
            try:
                self.opened[row.name] = Site(row.name, row.uri, expect=self.expected[row.name])
            except _UNUSABLE as exc:
                self.unreachable[row.name] = first_line(exc)
                return None
        return self.opened[row.name]


def fetch(source: Site, target: Site, seg: m.Segment) -> FileFacts:
    """Copy the segment's file from ``source`` to ``target`` (same path), verified against its catalog row
    before it appears under its name (CorruptSegmentError otherwise, nothing written)."""
    return copy_verified(source, target, seg.relpath, seg.byte_size, seg.sha256, seg.crc64nvme)
