"""Holding a link slot while a process copies, and pacing its copies at the slot's share (DESIGN section 17).

A ``LinkLease`` takes a slot on a (source, target) link (``catalog.link_slots``), waits while the link's
concurrency is full, and renews the slot about every second from a background thread. Each beat supplies the
limits in force now (the ``limits`` callable: a time window may have changed the cap), gets the holder's share
back and sets it on the lease's ``Pacer``, which every copy of the holder consumes per chunk: a cap change
or a new holder takes effect within two beats. On exit the slot is released; if the process dies its slot
lapses within one TTL (``$SEGREP_LINK_SLOT_TTL_S``, 10 s) and its share goes back to the others.

A beat that cannot reach the catalog is tried again at the next one; if none succeeds before the slot could
have lapsed, the pacer holds every copy (the share may already be someone else's) until a beat gets through.

``LinkPacing`` is what a copier is given: one lease per link it crosses, taken on the first copy over that
link, and only when a link there has a cap or copy limit in force (a link unlimited for now costs nothing: the
next file asks again); with none (the default, ``unlimited``) nothing is taken and copies run as before. Work
handed to other processes (a Spark copy's tasks, a merge's readers) gets its share through a rate file the
lease's beats keep current (``shares``): those tasks re-read it every second.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from types import TracebackType

from sqlalchemy.exc import SQLAlchemyError

from segrep.catalog import link_slots as lk
from segrep.catalog import queries as q
from segrep.catalog.engine import Catalog
from segrep.core import hlc
from segrep.core.links import CopyPriority
from segrep.core.settings import seconds_from_env
from segrep.storage.live_rates import new_rates_path, write_rates
from segrep.storage.pacing import LINK_BURST_S, Pacer
from segrep.storage.transport import Copier, CopyItem, CopyOutcome

LINK_TTL_ENV = "SEGREP_LINK_SLOT_TTL_S"
DEFAULT_LINK_TTL_S = 10.0
BEAT_S = 1.0

# The limits of a link now, by (source site, target site) name, or None when no link is defined between them
# (no slot is taken); where the definitions' links plug in (``catalog.link_limits``)
LinkLimits = Callable[[str, str], lk.Limits | None]


def unlimited(source: str, target: str) -> lk.Limits | None:
    """No link anywhere: no slot is taken, copies run unpaced."""
    return None


def _per_task(pacer: Pacer, tasks: int) -> int | None:
    """A holder's share split over the tasks it hands on: None unpaced, 0 held, else at least 1 byte/s."""
    if not pacer.paced:
        return None
    return max(1, pacer.rate // tasks) if pacer.rate else 0


def link_ttl_us() -> int:
    """How long a slot outlives its holder's last beat."""
    return int(seconds_from_env(LINK_TTL_ENV, DEFAULT_LINK_TTL_S, 3600.0) * 1_000_000)


class LinkLease:
    """A slot on ``source -> target`` for copies of class ``what``, renewed while the block runs; ``pacer`` is
    what the copies consume. Entering blocks while the holder waits for a slot."""

    def __init__(
        self,
        catalog: Catalog,
        source: str,
        target: str,
        what: CopyPriority,
        limits: Callable[[], lk.Limits],
        *,
        beat_s: float = BEAT_S,
        ttl_us: int | None = None,
    ) -> None:
        self.catalog, self.source, self.target, self.what = catalog, source, target, what
        self.holder = uuid.uuid4().hex
        self.pacer = Pacer(0, burst_s=LINK_BURST_S)
        self.pacer.hold()
        self.grant = lk.Grant(share=0, waiting=True)
        self._limits = limits
        self._beat_s = beat_s
        self._ttl_us = link_ttl_us() if ttl_us is None else ttl_us
        self._stop = threading.Event()
        self._admitted = threading.Event()
        self._thread = threading.Thread(target=self._beats, name=f"segrep-link-{source}-{target}", daemon=True)
        self._link = lk.Link(0, 0)
        self._valid_until = 0.0  # monotonic time by which the slot lapses unless a beat renews it
        self._listeners: list[Callable[[], object]] = []

    def on_change(self, listener: Callable[[], object]) -> None:
        """Call ``listener`` after every beat (in the beat thread), once the pacer has the beat's share: how
        a share handed to another process (``LinkPacing.shares``) is kept current."""
        self._listeners.append(listener)

    def __enter__(self) -> LinkLease:
        with self.catalog.write() as s:
            self._link = lk.Link(q.site_by_name(s, self.source).site_id, q.site_by_name(s, self.target).site_id)
            started = time.monotonic()
            grant = lk.acquire(s, self._link, self.holder, self.what, self._limits(), hlc.now_us(), self._ttl_us)
        self._apply(grant, started)
        self._thread.start()
        try:
            while not self._admitted.wait(self._beat_s):  # waiting for a slot: the beats admit us
                pass
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.pacer.set_rate(None)  # nothing may stay held on a lease that is gone
        try:
            with self.catalog.write() as s:
                lk.release(s, self.holder)
        except SQLAlchemyError:  # the slot lapses on its own within one TTL
            pass

    def beat(self) -> lk.Grant:
        """Renew once with the limits in force now (a lost slot is taken again) and apply the share."""
        started = time.monotonic()
        limits = self._limits()
        with self.catalog.write() as s:
            now = hlc.now_us()
            grant = lk.renew(s, self._link, self.holder, limits, now, self._ttl_us, self.pacer.consumed)
            if grant.lost:
                grant = lk.acquire(s, self._link, self.holder, self.what, limits, now, self._ttl_us)
        self._apply(grant, started)
        return grant

    def _apply(self, grant: lk.Grant, started: float) -> None:
        self.grant = grant
        self._valid_until = started + self._ttl_us / 1_000_000
        if grant.waiting or grant.share == 0:
            self.pacer.hold()
        else:
            self.pacer.set_rate(grant.share)
        if not grant.waiting:
            self._admitted.set()
        for listener in self._listeners:
            listener()

    def _beats(self) -> None:
        while not self._stop.wait(self._beat_s):
            try:
                self.beat()
            except SQLAlchemyError:  # the catalog is away: hold once the slot may have lapsed
                if time.monotonic() >= self._valid_until - self._beat_s:
                    self.pacer.hold()


class LinkPacing:
    """The pacers of one copier's links: ``pacer(source, target)`` takes the link's lease on first use when the
    link has a cap or copy limit in force (None otherwise: unpaced, asked again for the next file), and every
    lease is released on exit."""

    def __init__(self, catalog: Catalog, what: CopyPriority, limits: LinkLimits = unlimited) -> None:
        self.catalog, self.what, self.limits = catalog, what, limits
        self._leases: dict[tuple[str, str], LinkLease] = {}
        self._lock = threading.Lock()

    def pacer(self, source: str, target: str) -> Pacer | None:
        """The pacer of copies from ``source`` to ``target``; may block while the link is full."""
        with self._lock:
            lease = self._leases.get((source, target))
            if lease is None:
                if not self.limited(source, target):
                    return None
                lease = LinkLease(self.catalog, source, target, self.what, partial(self._now, source, target))
                lease.__enter__()
                self._leases[(source, target)] = lease
        return lease.pacer

    def paced_batches(self, copier: Copier, rates_dir: Path | None = None) -> Copier:
        """``copier`` (a Spark distributed copy, whose tasks this process cannot pace) with a slot of its own per
        defined link for each batch, held here while the batch runs: each item carries its share over the
        batch's items of its link (``CopyItem.bytes_per_s``; at most that many tasks are in flight) and the
        batch's rate file (``rate_file``, in ``rates_dir``, default ``storage.live_rates.rates_dir()``), kept
        current at every beat; ``copy_one`` paces the task at the share it reads there every second, so a cap
        lowered while the batch runs slows the copies already running."""

        def copy(items: list[CopyItem]) -> list[CopyOutcome]:
            path = new_rates_path(rates_dir)
            with self.shares(Counter((i.source, i.target) for i in items), path) as rates:
                followed = [
                    replace(i, bytes_per_s=rates[(i.source, i.target)], rate_file=str(path))
                    if (i.source, i.target) in rates
                    else i
                    for i in items
                ]
                return copier(followed)

        return copy

    @contextmanager
    def shares(self, counts: Counter[tuple[str, str]], rates_file: Path) -> Iterator[dict[tuple[str, str], int | None]]:
        """For work others pace (a Spark application's tasks, a merge's readers), a slot of its own per defined
        link in ``counts`` (source, target) -> how many tasks cross it, held while the block runs; yields each
        link's share per task now (None: unpaced; a link absent: not defined, not followed). ``rates_file``
        holds the same rates from the block's start, rewritten after each beat that changes one (the tasks
        follow it: ``storage.live_rates``), and is removed at the end."""
        with ExitStack() as stack:
            stack.callback(partial(Path.unlink, rates_file, missing_ok=True))
            leases: dict[tuple[str, str], tuple[LinkLease, int]] = {}
            for (source, target), n in counts.items():
                if self.limits(source, target) is None:
                    continue
                lease = LinkLease(self.catalog, source, target, self.what, partial(self._now, source, target))
                stack.enter_context(lease).pacer.wait_rate()
                leases[(source, target)] = (lease, n)
            if not leases:
                yield {}
                return
            written: list[dict[tuple[str, str], int | None]] = []
            lock = threading.Lock()

            def publish() -> dict[tuple[str, str], int | None]:
                with lock:
                    rates = {link: _per_task(lease.pacer, n) for link, (lease, n) in leases.items()}
                    if not written or written[-1] != rates:
                        try:
                            write_rates(rates_file, rates)
                            written.append(rates)
                        except OSError:  # the tasks keep the last rates written; the next beat tries again
                            pass
                    return rates

            first = publish()
            for lease, _ in leases.values():
                lease.on_change(publish)
            yield first

    def limited(self, source: str, target: str) -> bool:
        """Whether copies over the link take a slot now: it is defined and has a cap or a copy limit in force.
        An unlimited link costs its copies nothing (no catalog writes); asked again at each file, so a window
        that caps it reaches the copier's next file, and a slot once taken keeps its holder paced as the
        limits change (``_now``)."""
        limits = self.limits(source, target)
        return limits is not None and limits != lk.Limits()

    def _now(self, source: str, target: str) -> lk.Limits:
        """The limits in force now on a defined link (a window may make it unlimited for a while: a slot
        already held is kept, so the next window's cap reaches its copies within two beats)."""
        return self.limits(source, target) or lk.Limits()

    def __enter__(self) -> LinkPacing:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        with self._lock:
            leases, self._leases = list(self._leases.values()), {}
        for lease in leases:
            lease.__exit__(kind, exc, tb)
