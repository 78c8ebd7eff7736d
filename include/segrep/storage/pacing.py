"""Moving bytes at a bounded rate: a scrub (every file hashed) leaves disk and network to the rounds, and a
link's holders (``catalog.link_slots``) each keep to their share of its cap.

A scrub's rate comes from ``--max-bytes-per-second``, else ``SEGREP_SCRUB_BYTES_PER_S``, else the default
below; 0 means unpaced. A link holder's rate is its share, set again at every beat of its lease; a copy or a
read that the holder hands to another process (a Spark task) follows the share through ``FollowingPacer``.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable

from segrep.core.errors import SegrepError
from segrep.core.settings import MAX_SCRUB_BYTES_PER_S
from segrep.storage.atomic import FileFacts
from segrep.storage.site import Site

SCRUB_RATE_ENV = "SEGREP_SCRUB_BYTES_PER_S"
DEFAULT_SCRUB_BYTES_PER_S = 64 * 1024 * 1024
_CHUNK = 1024 * 1024
_MIN_CHUNK = 64 * 1024
LINK_BURST_S = 0.25  # the most a link's holder sends above its share after idling: a quarter second's worth
FOLLOW_EVERY_S = 1.0  # how often a pacer following a rate set elsewhere asks for it again


def scrub_rate(explicit: int | None = None) -> int:
    """Bytes per second for a scrub: the explicit value, else the environment's, else the default."""
    if explicit is not None:
        return explicit
    text = os.environ.get(SCRUB_RATE_ENV, "").strip()
    if not text:
        return DEFAULT_SCRUB_BYTES_PER_S
    if not text.isdigit() or int(text) > MAX_SCRUB_BYTES_PER_S:
        raise SegrepError(
            f"{SCRUB_RATE_ENV}={text!r} is not a whole number of bytes per second from 0 (unpaced) to "
            f"{MAX_SCRUB_BYTES_PER_S}"
        )
    return int(text)


class Pacer:
    """Sleeps as needed so that the bytes consumed never run ahead of the rate, across every thread that
    shares it (a link's holder paces all its copies with one).

    ``rate``: bytes per second, 0 for unpaced. The rate can change while copies run (``set_rate``: a link
    share recomputed, a cap changed by a time window): bytes already consumed stay paid at the old rate, the
    next ones go at the new. ``hold()`` stops every consumer until a rate is set again (a holder waiting for
    a link slot, or whose share is 0). ``burst_s`` bounds the credit an idle pacer builds up (None: unbounded,
    the scrub's "never ahead of the rate since the start"); a link pacer keeps it small, so a holder that
    idled never sends a long burst above its share."""

    def __init__(
        self,
        rate: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        *,
        burst_s: float | None = None,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._burst_s = burst_s
        self._changed = threading.Condition()
        self._rate: int | None = rate if rate > 0 else None  # None: unpaced; 0: held
        self._due = clock()  # when the bytes consumed so far are paid for
        self.consumed = 0
        self.slept_s = 0.0

    @property
    def rate(self) -> int:
        """Bytes per second now; 0 when unpaced or held."""
        return self._rate or 0

    @property
    def paced(self) -> bool:
        """Whether consumers may be slowed (a rate or a hold is in force)."""
        return self._rate is not None

    def set_rate(self, rate: int | None) -> None:
        """Pace at ``rate`` bytes per second from now on (None or 0: unpaced), waking held consumers."""
        with self._changed:
            self._rate = rate if rate else None
            self._changed.notify_all()

    def hold(self) -> None:
        """Stop every consumer at its next chunk until ``set_rate``."""
        with self._changed:
            self._rate = 0
            self._changed.notify_all()

    def wait_rate(self) -> int | None:
        """The rate once it is not held (None: unpaced): what a batch handed to others to pace is given."""
        with self._changed:
            while self._rate == 0:
                self._changed.wait()
            return self._rate

    def chunk_bytes(self, default: int) -> int:
        """How much to read at a time: ``default`` when unpaced, else a quarter second's worth (so a chunk is
        never a burst of many seconds), at least 64 KiB (and 64 KiB while held: the next rate is unknown)."""
        rate = self._rate
        if rate is None:
            return default
        return max(_MIN_CHUNK, min(default, rate // 4))

    def consume(self, n: int) -> None:
        """Account for ``n`` bytes just moved and sleep until they fit the rate. One consumer at a time holds
        a reservation (the others wait for it to be paid), so a lower rate applies from the next chunk of any
        thread: at most one chunk goes at the old rate."""
        with self._changed:
            self.consumed += n
        while True:
            with self._changed:
                while self._rate == 0:
                    self._changed.wait()
                if self._rate is None:
                    return
                now = self._clock()
                turn = self._due - now
                if turn <= 0 or self._burst_s is None:
                    start = self._due if self._burst_s is None else max(self._due, now - self._burst_s)
                    self._due = start + n / self._rate
                    ahead = self._due - now
                    break
            self._pause(turn)  # another consumer's bytes are still being paid for
        self._pause(ahead)

    def _pause(self, seconds: float) -> None:
        if seconds > 0:
            self._sleep(seconds)
            with self._changed:
                self.slept_s += seconds


class FollowingPacer(Pacer):
    """A pacer whose rate is set elsewhere and re-read here (a Spark task's or a merge reader's share of a link
    whose slot the submitting process holds): ``follow()`` gives the rate in force now (None: unpaced, 0:
    held) and is asked again at the first chunk after ``every_s`` seconds, so a cap lowered while a file is
    copied or read slows its remaining bytes within ``every_s`` plus one chunk. While held it asks again
    every ``every_s``. A ``follow()`` that raises OSError or ValueError (the rate's file unreadable for a
    moment) leaves the last rate in force. One consumer at a time: a task's or a reader's own pacer."""

    def __init__(
        self,
        rate: int,
        follow: Callable[[], int | None],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        *,
        every_s: float = FOLLOW_EVERY_S,
        burst_s: float | None = LINK_BURST_S,
    ) -> None:
        super().__init__(rate, clock, sleep, burst_s=burst_s)
        self._follow = follow
        self._every_s = every_s
        self._asked_at = clock()

    @property
    def paced(self) -> bool:
        """Always: a rate may be set at any chunk, so what it paces must go by chunks (never the kernel's copy,
        which cannot be slowed once started), even while it is unpaced now."""
        return True

    def consume(self, n: int) -> None:
        self._ask(force=False)
        while self._rate == 0:  # held: nobody else will wake us, so ask again after a while
            self._pause(self._every_s)
            self._ask(force=True)
        super().consume(n)

    def _ask(self, *, force: bool) -> None:
        now = self._clock()
        if not force and now - self._asked_at < self._every_s:
            return
        self._asked_at = now
        try:
            rate = self._follow()
        except (OSError, ValueError):
            return
        if rate == 0:
            self.hold()
        else:
            self.set_rate(rate)


def paced_facts(site: Site, relpath: str, pacer: Pacer, link: Pacer | None = None) -> FileFacts:
    """Size and sha256 of a stored file, read at the pacer's rate, and at ``link``'s too when the file crosses
    a capped link to be read (a remote scrub's share of it). FileNotFoundError if it is missing."""
    digest = hashlib.sha256()
    size = 0
    pacers = [pacer] if link is None else [pacer, link]
    with site.fs.open_input_stream(site.path(relpath)) as f:
        while chunk := f.read(min(p.chunk_bytes(_CHUNK) for p in pacers)):
            digest.update(chunk)
            size += len(chunk)
            for p in pacers:
                p.consume(len(chunk))
    return FileFacts(size, digest.hexdigest())
