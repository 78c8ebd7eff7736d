"""An object store's limits (DESIGN 17): throttling retried with back-off and counted, requests paced per site.

A throttling proxy (``tests.support.throttle_proxy``) stands in front of moto endpoint a and answers the
first N requests 503 SlowDown or 429, as a busy S3 does: botocore's request loop (writes) and pyarrow's AWS
SDK (reads) meet real throttling answers on the wire. Sites use ``retries: 1`` (pyarrow's SDK then sends a
request once), so every throttled answer reaches segrep's own retries and is counted.
"""

from __future__ import annotations

import pickle
import random
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from segrep.config.definitions import load_definitions
from segrep.config.stores import CredentialsRef, StoreOptions
from segrep.core.errors import ConfigError
from segrep.storage import throttle
from segrep.storage.site import Site
from segrep.storage.store_errors import StoreThrottledError, StoreUnreachableError
from tests.support.s3 import BUCKETS, S3Endpoint
from tests.support.throttle_proxy import ThrottleProxy, throttle_proxy

Endpoints = tuple[S3Endpoint, S3Endpoint]
REL = "events/1/0123456789abcdef0123456789abcdef.parquet"
ROWS = pa.table({"k": list(range(100)), "v": [f"row {i}" for i in range(100)]})


@pytest.fixture
def throttling_proxy_a(s3_endpoints: Endpoints) -> Iterator[ThrottleProxy]:
    """A throttling proxy in front of moto endpoint a, for one test."""
    with throttle_proxy(s3_endpoints[0]) as proxy:
        yield proxy


def _site(proxy: ThrottleProxy, e: S3Endpoint, monkeypatch: pytest.MonkeyPatch, **limits: float) -> Site:
    """A fresh site ``dr`` on endpoint ``e`` through ``proxy``, with ``limits`` in its store options."""
    for var, value in e.env("DR_S3").items():
        monkeypatch.setenv(var, value)
    opts = StoreOptions(
        endpoint=proxy.url,
        region=e.region,
        connect_timeout_s=2,
        retries=1,
        credentials=CredentialsRef(env_prefix="DR_S3"),
        **limits,  # type: ignore[arg-type]
    )
    return Site("dr", f"s3://{BUCKETS[0]}/{uuid.uuid4().hex[:12]}/dr", opts)


def _counted() -> int:
    return throttle.counts().get("dr", 0)


@pytest.mark.parametrize("status", [503, 429])
def test_throttled_writes_and_reads_are_retried_and_counted(
    throttling_proxy_a: ThrottleProxy, s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch, status: int
) -> None:
    site = _site(throttling_proxy_a, s3_endpoints[0], monkeypatch, throttle_base_ms=1)
    before = _counted()
    throttling_proxy_a.throttle(3, status)  # the PUT of the segment (boto3), three times
    facts = site.write_segment(REL, ROWS, {"segment": "x"})
    assert throttling_proxy_a.state.throttled == 3 and _counted() - before == 3
    assert facts.byte_size > 0

    throttling_proxy_a.throttle(4, status)  # the reads of the footer and pages (pyarrow)
    assert site.read_segment(REL).select(["k", "v"]).equals(ROWS)
    assert throttling_proxy_a.state.throttled == 7 and _counted() - before == 7
    throttling_proxy_a.throttle(2, status)
    assert site.exists(REL)
    assert _counted() - before == 9


def test_throttling_past_the_retries_is_a_clear_error_naming_the_site(
    throttling_proxy_a: ThrottleProxy, s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = _site(throttling_proxy_a, s3_endpoints[0], monkeypatch, throttle_retries=2, throttle_base_ms=1)
    throttling_proxy_a.throttle(10**6)
    with pytest.raises(StoreThrottledError) as err:
        site.write_segment(REL, ROWS, {"segment": "x"})
    message = str(err.value)
    assert message.startswith("site dr: the store throttled") and "after 2 retries" in message, message
    assert "SlowDown" in message and "throttle_retries" in message
    assert (
        throttling_proxy_a.state.throttled == 3 and throttling_proxy_a.state.forwarded == 0
    )  # one try, two retries: nothing stored

    throttling_proxy_a.throttle(0)
    site.write_segment(REL, ROWS, {"segment": "x"})
    throttling_proxy_a.throttle(10**6, 429)
    with pytest.raises(StoreThrottledError) as err:
        site.read_segment(REL)
    assert str(err.value).startswith("site dr: the store throttled") and "after 2 retries" in str(err.value)


def test_the_back_off_is_exponential_with_full_jitter() -> None:
    policy = throttle.ThrottlePolicy(retries=5, base_s=0.1)
    assert [policy.delay(n, draw=lambda lo, hi: hi) for n in (1, 2, 3, 4)] == pytest.approx([0.1, 0.2, 0.4, 0.8])
    assert policy.delay(40, draw=lambda lo, hi: hi) == throttle.MAX_BACKOFF_S
    assert all(policy.delay(3, draw=lambda lo, hi: lo) == 0.0 for _ in range(3))
    draws = [policy.delay(3) for _ in range(200)]
    assert all(0 <= d <= 0.4 for d in draws) and len(set(draws)) > 100  # jitter: spread, not one value


def test_the_request_bucket_lets_a_burst_then_the_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    bucket = throttle.RequestBucket(10, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    for _ in range(30):
        bucket.take()
    assert now[0] == pytest.approx((30 - bucket.burst) / 10)


def test_the_request_cap_bounds_the_rate_across_threads(
    throttling_proxy_a: ThrottleProxy, s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    rate = 25.0
    site = _site(throttling_proxy_a, s3_endpoints[0], monkeypatch, max_requests_per_second=rate)
    site.write_segment(REL, ROWS, {"segment": "x"})
    throttling_proxy_a.reset()
    calls = 20

    def work() -> None:
        for _ in range(calls):
            if random.random() < 0.5:
                site.exists(REL)  # pyarrow
            else:
                site.s3.client.head_object(Bucket=site.s3.bucket, Key=site.s3.key(site.path(REL)))  # type: ignore[union-attr]

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    times = sorted(throttling_proxy_a.state.times)
    n = len(times)
    assert n >= 4 * calls
    burst = max(1.0, rate)  # the bucket's burst; the site's limits hold from before the write
    # never faster than the cap: n requests need at least (n - burst) / rate seconds (a busy machine is slower)
    assert times[-1] - times[0] >= (n - burst) / rate * 0.95, (n, times[-1] - times[0])


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("max_requests_per_second: 0", "max_requests_per_second must be a number more than 0"),
        ("max_requests_per_second: -5", "max_requests_per_second must be a number more than 0"),
        ("max_requests_per_second: fast", "max_requests_per_second must be a number more than 0"),
        ("max_requests_per_second: .nan", "max_requests_per_second must be a number more than 0"),
        ("throttle_retries: -1", "throttle_retries must be an integer from 0 to 50"),
        ("throttle_retries: 2.5", "throttle_retries must be an integer from 0 to 50"),
        ("throttle_retries: true", "throttle_retries must be an integer from 0 to 50"),
        ("throttle_base_ms: 0", "throttle_base_ms must be a number more than 0"),
    ],
)
def test_bad_limits_are_one_clear_config_error(tmp_path: Path, value: str, needle: str) -> None:
    text = (
        "sites:\n  primary: {id: 1, uri: sites/primary}\n"
        f"  dr: {{id: 2, uri: 's3://b/p', storage_options: {{{value}}}}}\ntables: {{}}\n"
    )
    path = tmp_path / "segrep.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_definitions(path)
    message = str(err.value)
    assert needle in message and "site dr" in message and len(message.splitlines()) == 1, message


def test_good_limits_load_and_travel_in_a_manifest(tmp_path: Path) -> None:
    text = (
        "sites:\n  primary: {id: 1, uri: sites/primary}\n"
        "  dr: {id: 2, uri: 's3://b/p', storage_options: "
        "{throttle_retries: 4, throttle_base_ms: 50, max_requests_per_second: 300}}\ntables: {}\n"
    )
    path = tmp_path / "segrep.yaml"
    path.write_text(text)
    opts = load_definitions(path).site("dr").store
    assert (opts.throttle_retries, opts.throttle_base_ms, opts.max_requests_per_second) == (4, 50.0, 300.0)
    assert StoreOptions.from_doc(opts.to_doc()) == opts
    limits = throttle.limits_for("dr-manifest", opts)
    assert limits.policy == throttle.ThrottlePolicy(4, 0.05) and limits.bucket is not None
    assert limits.bucket.rate == 300.0 and throttle.limits_for("dr-manifest", opts) is limits


def test_a_limited_file_system_survives_pickling(
    throttling_proxy_a: ThrottleProxy, s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A site's file system sent to another process (pickled) keeps its limits, with a bucket of its own."""
    site = _site(throttling_proxy_a, s3_endpoints[0], monkeypatch, max_requests_per_second=50, throttle_base_ms=1)
    site.write_segment(REL, ROWS, {"segment": "x"})
    copy = pickle.loads(pickle.dumps(site.fs))
    limits = copy.handler.limits
    assert limits.site == "dr" and limits.bucket is not None and limits.bucket.rate == 50
    assert limits.bucket is not site.fs.handler.limits.bucket
    throttling_proxy_a.throttle(2)
    assert copy.get_file_info(site.path(REL)).size > 0 and throttling_proxy_a.state.throttled == 2


def test_errors_that_are_not_throttling_keep_their_retries_and_are_not_counted(
    throttling_proxy_a: ThrottleProxy, s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 500 is botocore's to retry within the site's ``retries`` (1: two attempts), as before: not counted."""
    site = _site(throttling_proxy_a, s3_endpoints[0], monkeypatch, throttle_base_ms=1)
    before = _counted()
    throttling_proxy_a.throttle(1, 500)
    site.write_segment(REL, ROWS, {"segment": "x"})  # the second attempt goes through
    throttling_proxy_a.throttle(10**6, 500)
    with pytest.raises(StoreUnreachableError) as err:
        site.write_segment(REL, ROWS, {"segment": "x"})
    assert not isinstance(err.value, StoreThrottledError) and "InternalError" in str(err.value)
    assert throttling_proxy_a.state.throttled == 3  # 1, then the two attempts botocore's retries allow
    assert _counted() == before


def test_every_file_system_call_is_retried_through_throttling(
    throttling_proxy_a: ThrottleProxy, s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each call of the wrapped pyarrow file system, its first request throttled, still does its work."""
    site = _site(throttling_proxy_a, s3_endpoints[0], monkeypatch, throttle_base_ms=1)
    fs, root = site.fs, site.root
    site.write_segment(REL, ROWS, {"segment": "x"})
    # (create_dir is left out: pyarrow takes a failed look for the directory as "absent" and makes it anyway)
    fs.create_dir(f"{root}/d", recursive=True)
    before = _counted()
    calls: list[tuple[str, Any]] = [
        ("write", lambda: _write(fs, f"{root}/d/a", b"abc")),
        ("copy_file", lambda: fs.copy_file(f"{root}/d/a", f"{root}/d/b")),
        ("move", lambda: fs.move(f"{root}/d/b", f"{root}/d/c")),
        ("list", lambda: sorted(i.path.rsplit("/", 1)[1] for i in fs.get_file_info(pafs.FileSelector(f"{root}/d")))),
        ("read", lambda: _read(fs, f"{root}/d/c")),
        ("segments", lambda: list(site.list_segment_files())),
        ("delete_file", lambda: fs.delete_file(f"{root}/d/a")),
        ("delete_dir_contents", lambda: fs.delete_dir_contents(f"{root}/d")),
    ]
    results = {}
    for n, (name, call) in enumerate(calls, 1):
        throttling_proxy_a.throttle(1, 503 if n % 2 else 429)
        results[name] = call()
        assert throttling_proxy_a.state.throttled == n, name
    assert results["list"] == ["a", "c"] and results["read"] == b"abc" and results["segments"] == [REL]
    assert _counted() - before == len(calls)
    assert fs.get_file_info(f"{root}/d/c").type == pafs.FileType.NotFound


def _write(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    with fs.open_output_stream(path) as out:
        out.write(data)


def _read(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_file(path) as f:
        data: bytes = f.read()
    return data
