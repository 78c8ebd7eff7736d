"""An object store's request limits, per site (DESIGN 17): throttling retried, requests paced, retries counted.

A store that is asked too much answers 503 SlowDown or 429 (or an SDK's ``Throttling``...). Such an answer is
not a failure: the request is sent again after an exponential back-off with full jitter (a random wait from 0
to ``base * 2**(retry - 1)``, at most ``MAX_BACKOFF_S``), up to the site's ``throttle_retries``; only when
they run out is it an error (``store_errors.StoreThrottledError``, naming the site). Every such retry is
counted per site in this process (``counts``), and a round reports the counts of its target's fast-forward.

``max_requests_per_second`` paces the requests sent to the site's store: one token bucket per site in a
process, shared by every thread (burst: one second's worth, at least one request). The cap is the
deployment's: where a catalog is open (the CLI, Airflow tasks), ``catalog.request_slots`` gives each process
talking to the site its share of it (``share_requests``); elsewhere (a Spark executor) a process paces at the
whole rate.
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
    Safe to share between threads: each taker reserves its slot under the lock and waits outside it.

    ``cap`` is the site's configured rate; ``set_rate`` changes the rate in force (this process's share of the
    cap for the deployment, ``catalog.request_slots``; 0 holds every taker until a rate is set again), and the
    burst follows it (one second's worth, at least one request) unless one was given."""

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.cap = rate
        self.rate = rate
        self._given_burst = burst
        self.burst = burst if burst is not None else max(1.0, math.floor(rate))
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Condition()
        self._tokens = self.burst
        self._at = clock()

    def __reduce__(self) -> tuple[type[RequestBucket], tuple[float, float | None]]:
        """Pickled (a file system sent to another process) as a fresh bucket of the site's rate and burst."""
        return (RequestBucket, (self.cap, self._given_burst))

    def set_rate(self, rate: float) -> None:
        """Requests at ``rate`` a second from now on; 0 holds them until a rate is set again."""
        with self._lock:
            self._refill(self._clock())
            self.rate = rate
            if self._given_burst is None and rate > 0:
                self.burst = max(1.0, math.floor(rate))
                self._tokens = min(self._tokens, self.burst)
            self._lock.notify_all()

    def take(self) -> float:
        """Wait for one request's token; return how long this waited."""
        with self._lock:
            while self.rate == 0:  # held: this process has no share of the site's requests yet
                self._lock.wait()
            self._refill(self._clock())
            self._tokens -= 1
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)
        return wait

    def _refill(self, now: float) -> None:
        if self.rate > 0:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now


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

# Told of each site's limits that pace requests, so the deployment's processes share the site's rate
# (``catalog.request_slots`` installs one); None: each process paces at the whole rate
RequestSharer = Callable[[SiteLimits], None]
_sharer: list[RequestSharer] = []


def share_requests(sharer: RequestSharer | None) -> None:
    """Install ``sharer`` (None: remove it): called now for every site's paced limits already made in this
    process, and later for each new one."""
    with _lock:
        _sharer[:] = [] if sharer is None else [sharer]
        paced = [limits for limits in _limits.values() if limits.bucket is not None]
    if sharer is not None:
        for limits in paced:
            sharer(limits)


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
            sharer = _sharer[0] if _sharer and limits.bucket is not None else None
        else:
            sharer = None
    if sharer is not None:
        sharer(limits)
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
