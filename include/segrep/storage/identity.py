"""Site identity markers (DESIGN 13): a small JSON file at every site root that says which site of which
catalog the root is.

A root that vanished (an unmounted volume, a lost bucket prefix) must never be taken for an empty site: a
round would otherwise recreate it, copy files into it and claim it caught up, and the real site's files would
be missing when it came back. So only ``segrep apply``, ``bootstrap`` and ``site adopt`` write a marker (and
create a root); everything else checks it, and a root without it, or with one naming another site or another
catalog, is DOWN/UNIDENTIFIED: nothing is written there, nothing acked, and safe time does not move.

The marker is written atomically (a temporary name, fsync, rename locally; one PUT on an object store) and
read back before it counts. A check that passed is remembered for ``CACHE_S`` seconds per process (a round
checks each site once, not once per file); local writes also refuse to create the root itself
(``atomic.ensure_dirs_below``), so a root that vanishes within that time is still never recreated.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

import pyarrow.fs as pafs

from segrep.core.errors import SegrepError
from segrep.storage.atomic import fsync_dir, write_json_atomic
from segrep.storage.store_errors import PathBlockedError

MARKER_NAME = "_segrep_site.json"
MARKER_FORMAT = 1
CACHE_S = 10.0


class IdentityProblem(StrEnum):
    """Why a root is not the site the catalog expects."""

    NO_ROOT = "root missing"
    NO_MARKER = "no identity marker"
    UNREADABLE = "identity marker unreadable"
    OTHER_SITE = "marker names another site"
    OTHER_CATALOG = "marker names another catalog"
    UNCLAIMED = "never claimed"


@dataclass(frozen=True)
class SiteIdentity:
    """What a site's marker says (and what the catalog expects it to say)."""

    site: str
    site_id: int
    site_uuid: str
    catalog_uuid: str

    def to_doc(self, written_us: int) -> dict[str, Any]:
        return {"format": MARKER_FORMAT, **asdict(self), "written_us": written_us}

    @classmethod
    def from_doc(cls, doc: Any) -> SiteIdentity:
        """The identity in a marker's JSON; ValueError if it is not a marker of this format."""
        if not isinstance(doc, dict) or doc.get("format") != MARKER_FORMAT:
            raise ValueError("not a segrep site marker of format 1")
        fields = {"site": str, "site_id": int, "site_uuid": str, "catalog_uuid": str}
        if any(not isinstance(doc.get(k), t) or isinstance(doc.get(k), bool) for k, t in fields.items()):
            raise ValueError("a field of the marker is missing or of the wrong type")
        return cls(doc["site"], doc["site_id"], doc["site_uuid"], doc["catalog_uuid"])

    def describe(self) -> str:
        return f"site {self.site} (id {self.site_id}, uuid {self.site_uuid}) of catalog {self.catalog_uuid}"


@dataclass(frozen=True)
class IdentityCheck:
    """The outcome of looking at a root: ``found`` is the marker's identity, if one could be read."""

    problem: IdentityProblem | None
    detail: str
    found: SiteIdentity | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def marker_path(root: str) -> str:
    return f"{root.rstrip('/')}/{MARKER_NAME}"


def look(fs: pafs.FileSystem, root: str, local: bool) -> tuple[bool, SiteIdentity | None, str]:
    """(root exists, the marker's identity or None, what was wrong reading it). An object store's root is a
    prefix: it "exists" when its marker does. Store errors (unreachable) propagate, and so does a local root
    that is not a directory (NotADirectoryError): a broken store, like a read-only or full one."""
    if local and not os.path.isdir(root):
        if os.path.lexists(root):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), root)
        return False, None, ""
    path = marker_path(root)
    try:
        with fs.open_input_stream(path) as f:
            raw = f.read(64 * 1024)
    except FileNotFoundError:
        return not local or os.path.isdir(root), None, ""
    except OSError as exc:
        if local and getattr(exc, "errno", None) in (errno.ENOENT, errno.ENOTDIR):
            return os.path.isdir(root), None, ""
        if not local and "not found" in str(exc).lower():  # pyarrow's S3 file system says so in words
            return True, None, ""
        raise
    try:
        return True, SiteIdentity.from_doc(json.loads(raw)), ""
    except ValueError as exc:
        return True, None, str(exc)


def check(fs: pafs.FileSystem, root: str, local: bool, expected: SiteIdentity | None, name: str) -> IdentityCheck:
    """Compare the marker at ``root`` with ``expected`` (None: the catalog has not claimed the site yet).
    PathBlockedError (an OSError: a broken store, not a question of identity) for a root that is a file."""
    try:
        exists, found, unreadable = look(fs, root, local)
    except NotADirectoryError:
        raise PathBlockedError(f"site {name}: its root {root} is a plain file, not a directory") from None
    if not exists:
        return IdentityCheck(IdentityProblem.NO_ROOT, f"site {name}: its root {root} does not exist")
    if unreadable:
        return IdentityCheck(IdentityProblem.UNREADABLE, f"site {name}: the marker {marker_path(root)}: {unreadable}")
    if expected is None:
        what = f"holds the marker of {found.describe()}" if found is not None else "has no identity marker"
        return IdentityCheck(
            IdentityProblem.UNCLAIMED,
            f"site {name} has not been claimed by this catalog (its root {what}): run `segrep apply`, or "
            f"`segrep site adopt {name}` if this root really is the site",
            found,
        )
    if found is None:
        return IdentityCheck(
            IdentityProblem.NO_MARKER,
            f"site {name}: its root {root} has no identity marker {MARKER_NAME} (an unmounted volume or a lost "
            f"prefix?); nothing is written there until it returns, or `segrep site adopt {name}` claims the root",
        )
    if (found.site, found.site_id, found.site_uuid) != (expected.site, expected.site_id, expected.site_uuid):
        return IdentityCheck(
            IdentityProblem.OTHER_SITE,
            f"site {name}: its root {root} holds the marker of {found.describe()}, not of {expected.describe()}",
            found,
        )
    if found.catalog_uuid != expected.catalog_uuid:
        return IdentityCheck(
            IdentityProblem.OTHER_CATALOG,
            f"site {name}: its root {root} belongs to catalog {found.catalog_uuid}, not to this catalog "
            f"({expected.catalog_uuid}); `segrep catalog rebuild --site {name}` or `segrep site adopt {name}` "
            "claims it for this one",
            found,
        )
    return IdentityCheck(None, f"site {name}: {found.describe()}", found)


def write(fs: pafs.FileSystem, root: str, local: bool, identity: SiteIdentity, now_us: int) -> None:
    """Write the marker at ``root`` (creating a local root) atomically, and read it back."""
    path = marker_path(root)
    if local:
        write_json_atomic(path, identity.to_doc(now_us))
        fsync_dir(root)
    else:
        with fs.open_output_stream(path) as out:
            out.write(json.dumps(identity.to_doc(now_us), sort_keys=True).encode())
    _, back, _ = look(fs, root, local)
    if back != identity:
        raise SegrepError(f"the identity marker written at {path} reads back differently")
    forget(root)


# -- the per-process cache of checks that passed -------------------------------------------------------------
_passed: dict[tuple[str, SiteIdentity], float] = {}
_lock = threading.Lock()


def recently_passed(root: str, expected: SiteIdentity) -> bool:
    with _lock:
        at = _passed.get((root, expected))
    return at is not None and time.monotonic() - at < CACHE_S


def remember(root: str, expected: SiteIdentity) -> None:
    with _lock:
        _passed[(root, expected)] = time.monotonic()


def forget(root: str | None = None) -> None:
    """Drop remembered checks (of one root, or all): a marker written or a site known to have changed."""
    with _lock:
        for key in [k for k in _passed if root is None or k[0] == root]:
            del _passed[key]
