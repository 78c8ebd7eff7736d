"""Is a site's store usable? ``segrep apply`` asks before it changes anything.

A real apply writes a small probe object under each site's root (a temporary name), reads it back and deletes
it: a root that is a plain file, a directory nobody may write, a read-only mount or a store that refuses the
credentials is found before the catalog points at it, not by the first round. A dry run only looks (the
root's file info and, for a local root, whether it may be written), so it writes nothing at all.

Every site's probe runs in its own worker thread, all at once, under one deadline: a store that does not
answer (a hung network mount, an object store whose credentials lookup never returns) is named instead of
holding apply for minutes. A local root that does not exist yet is created for the probe and removed after
it, so apply leaves every store as it found it; the first segment written there creates the root for good.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import pyarrow.fs as pafs

from segrep.config.definitions import SiteDef
from segrep.core.errors import SegrepError
from segrep.core.settings import seconds_from_env
from segrep.storage.site import Site
from segrep.storage.stores import STORE_ERRORS as STORE_ERRORS  # a round's target failure; here: unusable

DEFAULT_TIMEOUT_S = 20.0
TIMEOUT_ENV = "SEGREP_PROBE_TIMEOUT_S"
_MAX_TIMEOUT_S = 3600.0
PROBE_PREFIX = ".segrep-probe-"


class SiteUnusableError(SegrepError):
    """A site's store cannot be reached, or (outside a dry run) cannot be written."""


def open_site(name: str, uri: str) -> Site:
    """Open a site's store for a probe. The seam through which tests give a store that never answers."""
    return Site(name, uri)


def probe_timeout_s() -> float:
    """The probe's deadline in seconds: ``$SEGREP_PROBE_TIMEOUT_S`` (a store on a slow link may need
    longer), else 20."""
    return seconds_from_env(TIMEOUT_ENV, DEFAULT_TIMEOUT_S, _MAX_TIMEOUT_S)


def check_sites(sites: Iterable[SiteDef], *, write: bool, timeout_s: float | None = None) -> None:
    """Probe every site at once (``write``: a probe object written, read back and deleted; else look only).

    Raises SiteUnusableError naming each unusable site, its URI and the reason, in one line."""
    timeout = probe_timeout_s() if timeout_s is None else timeout_s
    probes = [_Probe(sdef.name, sdef.uri, write) for sdef in sorted(sites, key=lambda sdef: sdef.name)]
    for probe in probes:
        probe.thread.start()
    deadline = time.monotonic() + timeout
    for probe in probes:
        probe.thread.join(max(deadline - time.monotonic(), 0.0))
    # Only now, with every probe done, go the directories made for them (sites may share a parent).
    _remove_dirs([d for probe in probes if not probe.thread.is_alive() for d in probe.created])
    problems = []
    for probe in probes:
        if probe.thread.is_alive():  # left to finish on its own (a daemon thread): it only probes
            problems.append(
                f"site {probe.name} ({probe.uri}) did not answer within {timeout:g} s; check that its store is "
                f"reachable (or give it longer with {TIMEOUT_ENV})"
            )
        elif probe.problem is not None:
            problems.append(f"site {probe.name} ({probe.uri}) is not usable: {probe.problem}")
    if problems:
        raise SiteUnusableError("; ".join(problems))


def describe(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message (store errors can be long)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


class _Probe:
    """One site's probe, run in a worker thread; ``problem`` is what is wrong, None when the store is usable."""

    def __init__(self, name: str, uri: str, write: bool) -> None:
        self.name, self.uri, self.write = name, uri, write
        self.problem: str | None = None
        self.created: list[Path] = []  # directories made for the probe; check_sites removes them
        self.thread = threading.Thread(target=self._run, name=f"segrep-probe-{name}", daemon=True)

    def _run(self) -> None:
        stage = "cannot open its store"
        try:
            site = open_site(self.name, self.uri)
            stage = "cannot look at its root"
            self.problem = _look(site)
            if self.problem is None and self.write:
                stage = "cannot write under its root"
                _write_read_delete(site, self.created)
        except SegrepError as exc:
            self.problem = str(exc)
        except Exception as exc:  # a worker thread must hand every failure back, whatever the store raised
            self.problem = f"{stage}: {describe(exc)}"


def _look(site: Site) -> str | None:
    """Read-only checks: the root is not a plain file; a local root (or the directory it would be created
    in) is a directory this process may write."""
    info = site.fs.get_file_info(site.root)
    if info.type == pafs.FileType.File:
        return f"its root {site.root} is a plain file, not a directory"
    if not site.local:
        return None  # an object store's root is a prefix: absent until something is written under it
    existing = Path(site.root)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"its root {site.root} would be under {existing}, which is not a directory"
    if not os.access(existing, os.W_OK):
        return f"{existing} is not writable by this process"
    return None


def _write_read_delete(site: Site, created: list[Path]) -> None:
    """Write a probe object under the root, read it back and delete it. A missing local root is made first
    (the directories made are added to ``created``)."""
    if site.local:
        _make_local_root(site, created)
    path = site.path(f"{PROBE_PREFIX}{secrets.token_hex(8)}")
    payload = f"segrep probe of site {site.name}\n".encode()
    with site.fs.open_output_stream(path) as out:
        out.write(payload)
    try:
        with site.fs.open_input_stream(path) as inp:
            back = inp.read()
    finally:
        site.fs.delete_file(path)
    if back != payload:
        raise OSError(f"the probe object {path} read back differs from what was written")


def _make_local_root(site: Site, created: list[Path]) -> None:
    """Create a missing local root, adding each directory this call made to ``created``."""
    missing = []
    d = Path(site.root)
    while not d.exists() and d != d.parent:
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            continue  # made meanwhile by another site's probe (or someone else): not ours to remove
        created.append(d)


def _remove_dirs(dirs: list[Path]) -> None:
    """Remove the directories made for probes, deepest first; one still holding something stays."""
    for d in sorted(set(dirs), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            d.rmdir()
