"""Reading files at a bounded rate, so a scrub (every file hashed) leaves disk and network to the rounds.

The rate comes from ``--max-bytes-per-second``, else ``SEGREP_SCRUB_BYTES_PER_S``, else the default below;
0 means unpaced.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable

from segrep.core.errors import SegrepError
from segrep.core.settings import MAX_SCRUB_BYTES_PER_S
from segrep.storage.atomic import FileFacts
from segrep.storage.site import Site

SCRUB_RATE_ENV = "SEGREP_SCRUB_BYTES_PER_S"
DEFAULT_SCRUB_BYTES_PER_S = 64 * 1024 * 1024
_CHUNK = 1024 * 1024


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
    """Sleeps as needed so that bytes consumed since the start never run ahead of ``rate`` per second."""

    def __init__(
        self,
        rate: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.rate = rate
        self._clock = clock
        self._sleep = sleep
        self._start = clock()
        self.consumed = 0
        self.slept_s = 0.0

    def consume(self, n: int) -> None:
        self.consumed += n
        if self.rate <= 0:
            return
        ahead = self.consumed / self.rate - (self._clock() - self._start)
        if ahead > 0:
            self._sleep(ahead)
            self.slept_s += ahead


def paced_facts(site: Site, relpath: str, pacer: Pacer) -> FileFacts:
    """Size and sha256 of a stored file, read at the pacer's rate. FileNotFoundError if it is missing."""
    digest = hashlib.sha256()
    size = 0
    with site.fs.open_input_stream(site.path(relpath)) as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
            pacer.consume(len(chunk))
    return FileFacts(size, digest.hexdigest())
