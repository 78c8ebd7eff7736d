"""An object-store site's ``max_requests_per_second`` for the whole deployment (DESIGN section 17): the processes
talking to the site now share it, as the store counts the sum of every client's requests, not each process's.

Each process that paces requests to a site (``storage.throttle``) holds a request slot for it in the catalog:
a ``link_slots`` row on the pseudo-link from the site to itself (no copy goes from a site to itself, so no link
has it), of class ``requests``, renewed every beat and lapsing one TTL after its process stopped renewing, like
a link slot. The shares are the link slots' own (``catalog.link_slots``): one class, so the cap over the live
holders, a newcomer taking only what the others leave until they renew, so the shares stored never add up to
more than the cap. They are kept in thousandths of a request per second (a rate below one a second is valid).

``RequestSharing`` does it for one process: ``storage.throttle.share_requests`` tells it of each paced site;
the site's bucket is held until its first share, one background thread renews every slot each beat and sets
the bucket to the share (held while it is 0). A site the catalog does not know (a catalog being rebuilt, a
store opened under a name that is no site's) is paced at its whole rate, in this process only. If the
catalog cannot be reached, the last share is kept until the slot could have lapsed, then the site's
requests are held until a beat gets through (someone else may have its share). A process holds its slots
from its first request to the site until ``close`` (the end of its command or task); if it dies, they lapse
within one TTL.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType

from sqlalchemy.exc import SQLAlchemyError

from segrep.catalog import link_slots as lk
from segrep.catalog import queries as q
from segrep.catalog.engine import Catalog
from segrep.catalog.link_lease import BEAT_S, link_ttl_us
from segrep.core import hlc
from segrep.core.errors import SegrepError
from segrep.core.links import CopyPriority
from segrep.storage import throttle
from segrep.storage.throttle import SiteLimits

MILLI = 1000  # shares are stored in thousandths of a request per second


def request_limits(limits: SiteLimits) -> lk.Limits:
    """The site's cap as a pseudo-link's limits (thousandths of a request per second, at least 1)."""
    assert limits.bucket is not None  # only paced sites are shared
    return lk.Limits(cap_bytes_per_s=max(1, round(limits.bucket.cap * MILLI)))


@dataclass
class _Held:
    limits: SiteLimits
    holder: str
    link: lk.Link | None = None  # None: not acquired yet
    valid_until: float = 0.0  # monotonic time by which the slot lapses unless a beat renews it


class RequestSharing:
    """This process's request slots, one per paced site, renewed by one background thread."""

    def __init__(self, catalog: Catalog, *, beat_s: float = BEAT_S, ttl_us: int | None = None) -> None:
        self.catalog = catalog
        self._beat_s = beat_s
        self._ttl_us = link_ttl_us() if ttl_us is None else ttl_us
        self._held: dict[int, _Held] = {}  # by id() of the site's limits
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def join(self, limits: SiteLimits) -> None:
        """Share ``limits``' site's rate from now on: its requests wait for this process's first share."""
        if limits.bucket is None:
            return
        with self._lock:
            if id(limits) in self._held or self._stop.is_set():
                return
            limits.bucket.set_rate(0)
            self._held[id(limits)] = _Held(limits, uuid.uuid4().hex)
            if self._thread is None:
                self._thread = threading.Thread(target=self._beats, name="segrep-request-slots", daemon=True)
                self._thread.start()
        self._wake.set()  # the first share now, not at the next beat

    def beat(self) -> None:
        """Renew (or take) every site's slot once and set each bucket to its share."""
        with self._lock:
            held = list(self._held.values())
        for h in held:
            started = time.monotonic()
            try:
                share = self._renew(h)
            except SQLAlchemyError:  # the catalog is away: hold once the slot may have lapsed
                if h.link is None or started >= h.valid_until - self._beat_s:
                    assert h.limits.bucket is not None
                    h.limits.bucket.set_rate(0)
                continue
            except SegrepError:  # a site the catalog does not know (or no site's name): its whole rate, here only
                with self._lock:
                    self._held.pop(id(h.limits), None)
                assert h.limits.bucket is not None
                h.limits.bucket.set_rate(h.limits.bucket.cap)
                continue
            h.valid_until = started + self._ttl_us / 1_000_000
            assert h.limits.bucket is not None
            h.limits.bucket.set_rate(share / MILLI)

    def _renew(self, h: _Held) -> int:
        limits = request_limits(h.limits)
        with self.catalog.write() as s:
            now = hlc.now_us()
            if h.link is None:
                site_id = q.site_by_name(s, h.limits.site).site_id
                h.link = lk.Link(site_id, site_id)
                grant = lk.acquire(s, h.link, h.holder, CopyPriority.REQUESTS, limits, now, self._ttl_us)
            else:
                grant = lk.renew(s, h.link, h.holder, limits, now, self._ttl_us)
                if grant.lost:
                    grant = lk.acquire(s, h.link, h.holder, CopyPriority.REQUESTS, limits, now, self._ttl_us)
        return grant.share or 0

    def _beats(self) -> None:
        while not self._stop.is_set():
            self.beat()
            self._wake.wait(self._beat_s)
            self._wake.clear()

    def close(self) -> None:
        """Stop renewing and give every slot up; the buckets go back to their sites' whole rates (nothing
        may stay held in a process that no longer shares)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            held, self._held = list(self._held.values()), {}
        for h in held:
            assert h.limits.bucket is not None
            h.limits.bucket.set_rate(h.limits.bucket.cap)
        try:
            with self.catalog.write() as s:
                for h in held:
                    lk.release(s, h.holder)
        except SQLAlchemyError:  # they lapse on their own within one TTL
            pass

    def __enter__(self) -> RequestSharing:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


@contextmanager
def shared_site_requests(catalog: Catalog) -> Iterator[RequestSharing]:
    """Within the block, every paced site's request rate is shared with the deployment through ``catalog``
    (this process's slots given up at the end; sites opened after it pace alone)."""
    sharing = RequestSharing(catalog)
    throttle.share_requests(sharing.join)
    try:
        yield sharing
    finally:
        throttle.share_requests(None)
        sharing.close()
