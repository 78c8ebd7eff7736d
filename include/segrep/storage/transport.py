"""Moving batches of verified copies between sites: the copy transport of a fast-forward (and of anything else
that copies a list of segment files), apart from the protocol that decides what to copy.

A ``CopyItem`` says what to copy (both sites, with their store options, and the catalog's facts of the file); a
``Copier`` turns a batch of them into one ``CopyOutcome`` each, in order: copied, INVALID (what arrived is not
the catalog's file) or a store error (refused or unreachable). Each copy is ``storage.transfer.copy_verified``.
The copiers here run in threads of this process (``CopyPool``, ``local_copier``); the Spark distributed copy
runs ``copy_one`` on executors. Nothing here reads or writes the catalog.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from segrep.config.stores import StoreOptions
from segrep.core.errors import CorruptSegmentError, SegrepError
from segrep.storage.atomic import batched_directory_syncs
from segrep.storage.live_rates import follower
from segrep.storage.pacing import LINK_BURST_S, FollowingPacer, Pacer
from segrep.storage.probe import STORE_ERRORS, describe
from segrep.storage.site import Site
from segrep.storage.store_errors import StoreRefusedError
from segrep.storage.transfer import copy_verified

# What fails a target's copy rather than the round: its store's errors, and ours (a Spark copy that failed)
COPY_ERRORS: tuple[type[Exception], ...] = (*STORE_ERRORS, SegrepError)
COPIES_AT_ONCE = 8  # copies in flight to one target, from all its partitions


@dataclass(frozen=True)
class CopyItem:
    """One verified copy; the store options (no secret) let a Spark executor open both sites as this process
    does, since it has not loaded the definitions."""

    source: str
    source_uri: str
    target: str
    target_uri: str
    relpath: str
    byte_size: int
    sha256: str
    source_options: StoreOptions = field(default_factory=StoreOptions)
    target_options: StoreOptions = field(default_factory=StoreOptions)
    crc64nvme: str | None = None  # the catalog's CRC-64/NVME of the file, if known: copies are checked by it
    bytes_per_s: int | None = None  # this copy's share of its link's cap, where no pacer of this process paces it
    rate_file: str | None = None  # where the share in force now is read again (``storage.live_rates``)

    @classmethod
    def from_doc(cls, raw: dict[str, Any]) -> CopyItem:
        """Back from ``asdict`` (the distributed copy's items file), options checked strictly."""
        where = f"copy item {raw.get('relpath')!r}"
        return cls(
            **{
                **raw,
                "source_options": StoreOptions.from_doc(raw.get("source_options"), f"{where}: source options"),
                "target_options": StoreOptions.from_doc(raw.get("target_options"), f"{where}: target options"),
            }
        )


@dataclass(frozen=True)
class CopyOutcome:
    relpath: str
    ok: bool
    invalid: str | None = None  # the verification failure (INVALID)
    error: str | None = None  # the target or source could not be reached
    refused: bool = False  # the error is the store's refusal (credentials, permissions, missing bucket)


Copier = Callable[[list[CopyItem]], list[CopyOutcome]]


SiteOpener = Callable[[str, str, StoreOptions], Site]
# The pacer of copies from one site to another (by name), or None to copy unpaced: a link's share of its cap
PacerFor = Callable[[str, str], Pacer | None]


def unpaced(source: str, target: str) -> Pacer | None:
    return None


def copy_one(item: CopyItem, open_site: SiteOpener = Site, pacer_for: PacerFor = unpaced) -> CopyOutcome:
    """One item copied and verified, at its link's pace; what went wrong is the outcome, never an exception
    (a Spark executor sends outcomes back)."""
    try:
        source = open_site(item.source, item.source_uri, item.source_options)
        target = open_site(item.target, item.target_uri, item.target_options)
        pacer = pacer_for(item.source, item.target) or task_pacer(item)
        copy_verified(source, target, item.relpath, item.byte_size, item.sha256, item.crc64nvme, pacer)
    except CorruptSegmentError as exc:
        return CopyOutcome(item.relpath, False, invalid=str(exc))
    except COPY_ERRORS as exc:  # a site that cannot be opened, read or written
        return CopyOutcome(item.relpath, False, error=describe(exc), refused=isinstance(exc, StoreRefusedError))
    return CopyOutcome(item.relpath, True)


def task_pacer(
    item: CopyItem, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
) -> Pacer | None:
    """The pacer of a copy that no pacer of this process paces (a Spark task): its share of the submitter's
    slot, followed in the item's rate file while it copies (a cap lowered meanwhile slows the rest of the
    file), else fixed; None without either."""
    if item.rate_file is not None:
        follow = follower(item.rate_file, item.source, item.target)
        return FollowingPacer(item.bytes_per_s or 0, follow, clock, sleep)
    if item.bytes_per_s:
        return Pacer(item.bytes_per_s, clock, sleep, burst_s=LINK_BURST_S)
    return None


class CopyPool:
    """One target's copies, from every partition, in one pool of threads that takes them in the order asked.

    With a pool per batch, every partition's batch finished at about the same time and the partitions then met
    at the catalog together (receiver commit, next offer), taking turns there while no copy ran. First come,
    first served, the earliest batch finishes first, and its partition's catalog work overlaps the others'
    copies. Each file is fsynced as it is copied; the directories of local targets are fsynced once per batch,
    before its outcomes are returned (so before any is committed): a failed directory sync fails every copy
    of the batch. Sites are opened once for the pool. ``pacer_for`` paces each copy at its link's share
    (``catalog.link_lease.LinkPacing``); by default copies are unpaced."""

    def __init__(self, workers: int = COPIES_AT_ONCE, pacer_for: PacerFor = unpaced) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="segrep-copy")
        self._open_site = _opened_once()
        self._pacer_for = pacer_for

    def __call__(self, items: list[CopyItem]) -> list[CopyOutcome]:
        try:
            with batched_directory_syncs():
                # each copy joins the batch's directory syncs through its context
                runs = [(contextvars.copy_context(), item) for item in items]
                futures = [
                    self._pool.submit(ctx.run, copy_one, item, self._open_site, self._pacer_for) for ctx, item in runs
                ]
                return [f.result() for f in futures]
        except OSError as exc:
            return [CopyOutcome(i.relpath, False, error=describe(exc)) for i in items]

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> CopyPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def local_copier(items: list[CopyItem]) -> list[CopyOutcome]:
    """Copy one batch in threads of its own (hashing and file I/O release the GIL): a CopyPool for the batch."""
    with CopyPool(max(1, min(4, len(items)))) as pool:
        return pool(items)


def _opened_once() -> SiteOpener:
    """Opens each site once for a batch (all its copies go between the same two sites), not once per copy."""
    opened: dict[tuple[str, str, StoreOptions], Site] = {}
    lock = threading.Lock()

    def open_site(name: str, uri: str, options: StoreOptions) -> Site:
        with lock:
            if (name, uri, options) not in opened:
                opened[(name, uri, options)] = Site(name, uri, options)
            return opened[(name, uri, options)]

    return open_site
