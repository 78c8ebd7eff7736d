"""Which site of which catalog each root is (DESIGN 13), on the catalog's side.

``open_site`` is how the package opens a site from its catalog row: the Site checks the marker at its root
before its first read or write (``storage.identity``). ``claim`` writes a marker and records its uuid; only
``segrep apply`` (a new site), ``bootstrap`` (a site never claimed) and ``segrep site adopt`` call it.
``record_found`` takes the uuid a rebuild finds in a surviving root's marker.
"""

from __future__ import annotations

import uuid
import weakref
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import Engine, Pool, select
from sqlalchemy.orm import Session

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.config.stores import StoreOptions
from segrep.core import hlc
from segrep.core.errors import RefusedError, SegrepError
from segrep.storage import identity
from segrep.storage.identity import SiteIdentity
from segrep.storage.site import Expected, Site

_CATALOG_UUID = select(m.CatalogIdentity.catalog_uuid)
# A catalog's uuid never changes: read once per connection pool (an engine and its read-only twin share one)
_uuids: weakref.WeakKeyDictionary[Pool, str] = weakref.WeakKeyDictionary()


def catalog_uuid(source: Session | Catalog) -> str:
    """This catalog's uuid (made by migration 0009)."""
    bind = source.engine if isinstance(source, Catalog) else source.get_bind()
    assert isinstance(bind, Engine)  # sessions here are bound to an engine (OptionEngine is one)
    key = bind.pool
    if key not in _uuids:
        if isinstance(source, Catalog):
            with source.read() as s:
                found = s.scalars(_CATALOG_UUID).first()
        else:
            found = source.scalars(_CATALOG_UUID).first()
        if found is None:
            raise SegrepError("the catalog has no identity row (catalog_identity): run `segrep init` to upgrade it")
        _uuids[key] = found
    return _uuids[key]


def expected_identity(source: Session | Catalog, row: m.Site) -> SiteIdentity | None:
    """What the marker at ``row``'s root must say; None while the site has not been claimed."""
    if row.site_uuid is None:
        return None
    return SiteIdentity(row.name, row.site_id, row.site_uuid, catalog_uuid(source))


def open_site(source: Session | Catalog, row: m.Site, options: StoreOptions | None = None) -> Site:
    """The site's store, checking its identity marker before its first read or write (``source``: the
    session or catalog ``row`` was read from)."""
    return Site(row.name, row.uri, options, expect=Expected(expected_identity(source, row)))


class ClaimResult(StrEnum):
    CREATED = "created"  # a new root, or an empty one: its marker written
    KEPT = "kept"  # the marker already said so
    ADOPTED = "adopted"  # an existing root taken over on purpose (site adopt), its marker (re)written


@dataclass(frozen=True)
class Claim:
    site: str
    result: ClaimResult
    previous: SiteIdentity | None  # the marker found before, if any
    site_uuid: str

    def __str__(self) -> str:
        if self.result is ClaimResult.KEPT:
            return f"site {self.site}: identity marker in place"
        before = f" (its marker named {self.previous.describe()})" if self.previous is not None else ""
        return f"site {self.site}: identity marker {self.result}{before}"


def claim(s: Session, row: m.Site, *, adopt: bool = False, dry_run: bool = False) -> Claim:
    """Write ``row``'s identity marker and record its uuid (in the caller's transaction, after the write:
    a failed write records nothing). ``dry_run``: every check, the same answer, nothing written.

    Without ``adopt`` (apply, bootstrap) only a root that is missing or holds no marker is claimed, and only
    while the catalog has not claimed the site yet: a claimed site whose marker is gone is never re-created
    (the volume may simply be unmounted). ``adopt`` takes over a root whatever its marker says, except the
    marker of another site of this catalog, which is refused."""
    site = Site(row.name, row.uri)  # no expectation: this is the check itself
    this_catalog = catalog_uuid(s)
    exists, found, unreadable = identity.look(site.fs, site.root, site.local)
    ours = found is not None and (found.site, found.site_id, found.catalog_uuid) == (
        row.name,
        row.site_id,
        this_catalog,
    )
    if found is not None and ours and row.site_uuid in (None, found.site_uuid):
        row.site_uuid = found.site_uuid  # an earlier claim whose transaction did not commit, or in place
        return Claim(row.name, ClaimResult.KEPT, found, found.site_uuid)
    if found is not None and found.catalog_uuid == this_catalog and found.site != row.name:
        raise RefusedError(
            f"site {row.name}: its root {site.root} holds the marker of {found.describe()}, another site of this "
            "catalog; two sites cannot share a root"
        )
    if not adopt:
        expected = expected_identity(s, row)
        if expected is not None:
            problem = identity.check(site.fs, site.root, site.local, expected, row.name)
            raise RefusedError(
                f"DOWN/UNIDENTIFIED: {problem.detail} (nothing is created in its place; `segrep site adopt "
                f"{row.name}` claims the root on purpose)"
            )
        if found is not None or unreadable:
            what = f"the marker of {found.describe()}" if found is not None else f"an unreadable marker ({unreadable})"
            raise RefusedError(
                f"site {row.name}: its root {site.root} holds {what}: it belongs to another catalog (or a lost "
                f"one); `segrep catalog rebuild --site {row.name}` or `segrep site adopt {row.name}` claims it"
            )
    site_uuid = row.site_uuid or (found.site_uuid if found is not None and found.site == row.name else None)
    site_uuid = site_uuid or uuid.uuid4().hex
    mine = SiteIdentity(row.name, row.site_id, site_uuid, this_catalog)
    if not dry_run:
        identity.write(site.fs, site.root, site.local, mine, hlc.now_us())
    row.site_uuid = site_uuid
    result = ClaimResult.ADOPTED if adopt and (exists or found is not None) else ClaimResult.CREATED
    return Claim(row.name, result, found, site_uuid)


def check_site(s: Session, row: m.Site) -> identity.IdentityCheck:
    """Look at ``row``'s marker now (no cache): for status lines and for a round's targets."""
    return open_site(s, row).identity_check()


def record_found(s: Session, row: m.Site, *, dry_run: bool = False) -> Claim:
    """A catalog rebuild from ``row``'s surviving root: take the site uuid its marker carries (the marker must
    name this very site, by name and id) and restamp the marker with this catalog's uuid. A root without a
    marker is not taken for the site: it may be an empty mount point (RefusedError, naming ``site adopt``)."""
    site = Site(row.name, row.uri)
    exists, found, unreadable = identity.look(site.fs, site.root, site.local)
    if found is None:
        why = (
            "does not exist"
            if not exists
            else (f"has an unreadable marker ({unreadable})" if unreadable else "has no identity marker")
        )
        raise RefusedError(
            f"site {row.name}: its root {site.root} {why}, so nothing says it is this site; if it is, "
            f"`segrep site adopt {row.name}` claims it first"
        )
    if (found.site, found.site_id) != (row.name, row.site_id):
        raise RefusedError(f"site {row.name}: its root {site.root} holds the marker of {found.describe()}")
    mine = SiteIdentity(row.name, row.site_id, found.site_uuid, catalog_uuid(s))
    if found != mine and not dry_run:
        identity.write(site.fs, site.root, site.local, mine, hlc.now_us())
    row.site_uuid = found.site_uuid
    return Claim(row.name, ClaimResult.KEPT if found == mine else ClaimResult.ADOPTED, found, found.site_uuid)
