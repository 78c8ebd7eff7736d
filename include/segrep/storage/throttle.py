"""An object store's request limits, per site (DESIGN 17): throttling retried, requests paced, retries counted.

A store that is asked too much answers 503 SlowDown or 429 (or an SDK's ``Throttling``...). Such an answer is
not a failure: the request is sent again after an exponential back-off with full jitter (a random wait from 0
to ``base * 2**(retry - 1)``, at most ``MAX_BACKOFF_S``), up to the site's ``throttle_retries``; only when
they run out is it an error (``store_errors.StoreThrottledError``, naming the site). Every such retry is
counted per site in this process (``counts``), and a round reports the counts of its target's fast-forward.

``max_requests_per_second`` paces the requests this process sends the site's store: one token bucket per
site, shared by every thread (burst: one second's worth, at least one request).
The boto3 side hooks into botocore's own retry loop (``s3_hooks``); the pyarrow side is a file system
wrapper (``throttled_fs``); both use the ``SiteLimits`` of their site from here.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from segrep.config.stores import StoreOptions

DEFAULT_THROTTLE_RETRIES = 10
DEFAULT_THROTTLE_BASE_MS = 100.0
MAX_BACKOFF_S = 20.0  # as botocore's standard mode: one wait is never longer


@dataclass(frozen=True)
class ThrottlePolicy:
    """How often and after how long a throttled request is sent again."""

    retries: int = DEFAULT_THROTTLE_RETRIES
    base_s: float = DEFAULT_THROTTLE_BASE_MS / 1000

    def delay(self, retry: int, draw: Callable[[float, float], float] = random.uniform) -> float:
        """The wait before retry number ``retry`` (1 for the first): full jitter over the exponential step."""
        return draw(0.0, min(MAX_BACKOFF_S, self.base_s * 2 ** min(retry - 1, 30)))


class RequestBucket:
    """A token bucket: ``take`` returns once a request may go, at ``rate`` a second after a burst of ``burst``.
    Safe to share between threads: each taker reserves its slot under the lock and waits outside it."""

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, math.floor(rate))
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = self.burst
        self._at = clock()

    def __reduce__(self) -> tuple[type[RequestBucket], tuple[float, float]]:
        """Pickled (a file system sent to another process) as a fresh bucket of the same rate and burst."""
        return (RequestBucket, (self.rate, self.burst))

    def take(self) -> float:
        """Wait for one request's token; return how long this waited."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            self._tokens -= 1
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)
        return wait


@dataclass(frozen=True)
class SiteLimits:
    """One site's throttling policy and request pacing, as its store options give them."""

    site: str
    policy: ThrottlePolicy
    bucket: RequestBucket | None

    def pace(self) -> None:
        """Before each request to the store: wait for the site's request rate, if it has one."""
        if self.bucket is not None:
            self.bucket.take()

    def retry_after(self, retry: int) -> float | None:
        """The wait before retry ``retry`` of a throttled request, counted; None if the retries ran out."""
        if retry > self.policy.retries:
            return None
        record(self.site)
        return self.policy.delay(retry)


_lock = threading.Lock()
_limits: dict[tuple[str, StoreOptions], SiteLimits] = {}
_counts: dict[str, int] = {}


def limits_for(site: str, opts: StoreOptions) -> SiteLimits:
    """The site's limits, one per (site, options) in the process: its boto3 and pyarrow clients and every
    thread share the same bucket."""
    key = (site, opts)
    with _lock:
        limits = _limits.get(key)
        if limits is None:
            policy = ThrottlePolicy(
                DEFAULT_THROTTLE_RETRIES if opts.throttle_retries is None else opts.throttle_retries,
                (opts.throttle_base_ms or DEFAULT_THROTTLE_BASE_MS) / 1000,
            )
            rate = opts.max_requests_per_second
            limits = SiteLimits(site, policy, None if rate is None else RequestBucket(rate))
            _limits[key] = limits
        return limits


def record(site: str, n: int = 1) -> None:
    """Count ``n`` throttled requests retried at ``site``."""
    with _lock:
        _counts[site] = _counts.get(site, 0) + n


def counts() -> dict[str, int]:
    """Throttled retries per site since the process started."""
    with _lock:
        return dict(_counts)


def since(before: dict[str, int]) -> dict[str, int]:
    """The retries per site counted after ``before`` (an earlier ``counts()``), sites with none left out."""
    now = counts()
    return {site: n - before.get(site, 0) for site, n in sorted(now.items()) if n > before.get(site, 0)}
