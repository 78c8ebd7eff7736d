"""Rounds to an S3 site whose store throttles (DESIGN 17): retried and counted, or a clear failure of that target.

`dr` reaches moto endpoint a through a throttling proxy (``tests.support.throttle_proxy``) that answers 503
SlowDown or 429 to the next N requests; `edge` is on endpoint b directly. A round through a few throttled
answers succeeds, and its report and metrics count the retries per store; one whose store keeps throttling
past `dr`'s ``throttle_retries`` fails that target with the throttled error, commits nothing there, and the
other target goes on.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from segrep.replication.orchestrator import run_round
from segrep.replication.reports import TargetStatus
from segrep.replication.view import report_lines, round_view
from segrep.storage import throttle
from segrep_airflow.metrics import emit_round
from tests.support.badinput import assert_user_error, unchanged
from tests.support.checks import assert_replicas_equal_leader, lease_count, segment_rows
from tests.support.cli import cli
from tests.support.env import Env, make_env, sqlite_url
from tests.support.models import Model
from tests.support.rounds import no_spark, round_until_idle
from tests.support.s3 import BUCKETS, S3Endpoint, s3_events_yaml, use_site_keys
from tests.support.tables import TABLE
from tests.support.throttle_proxy import ThrottleProxy, throttle_proxy

Endpoints = tuple[S3Endpoint, S3Endpoint]


@pytest.fixture
def throttled_s3_env(
    s3_endpoints: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Env, ThrottleProxy]]:
    """`s3_env` with `dr` behind a throttling proxy (not throttling yet), 3 throttle retries from 1 ms."""
    a, b = s3_endpoints
    use_site_keys(monkeypatch, DR_S3=a, EDGE_S3=b)
    with throttle_proxy(a) as proxy:
        options = "throttle_retries: 3, throttle_base_ms: 1"
        text = s3_events_yaml(proxy.endpoint(a), b, uuid.uuid4().hex[:12], options_a=options)
        yield make_env(tmp_path, sqlite_url(tmp_path), text), proxy


class _Stats:
    """What emit_round sends, by name (StatsBackend)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def gauge(self, stat: str, value: float, *, tags: dict[str, Any] | None = None) -> None:
        pass

    def incr(self, stat: str, count: int | None = None, *, tags: dict[str, Any] | None = None) -> None:
        self.counts[stat] = self.counts.get(stat, 0) + (count or 0)

    def timing(self, stat: str, dt: timedelta | float, *, tags: dict[str, Any] | None = None) -> None:
        pass


@pytest.mark.parametrize("status", [503, 429])
def test_a_round_through_throttling_succeeds_and_counts_the_retries(
    throttled_s3_env: tuple[Env, ThrottleProxy], status: int
) -> None:
    env, proxy = throttled_s3_env
    Model().upsert(env, range(200), "a")
    before = throttle.counts().get("dr", 0)
    proxy.throttle(3, status)  # within the 3 retries: each request at most 3 times
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert proxy.state.throttled == 3 and proxy.state.forwarded > 0
    dr = rep.targets["dr"]
    assert dr.status == TargetStatus.OK and dr.segments_copied > 0, dr.error
    assert throttle.counts().get("dr", 0) - before == 3
    assert dr.throttled == {"dr": 3} and "dr" not in rep.targets["edge"].throttled
    assert_replicas_equal_leader(env.catalog)

    assert "throttled by the store, retried dr 3" in rep.text(["dr"])  # what `segrep round` prints
    view = round_view(env.catalog, rep, None)
    assert any("throttled by the store, retried dr 3" in line for line in report_lines(view))
    stats = _Stats()
    emit_round(view, stats)
    assert stats.counts["segrep.throttled_retries.events.dr"] == 3
    assert "segrep.throttled_retries.events.edge" not in stats.counts


def test_throttling_past_the_retries_fails_that_target_and_commits_nothing_there(
    throttled_s3_env: tuple[Env, ThrottleProxy],
) -> None:
    env, proxy = throttled_s3_env
    Model().upsert(env, range(200), "a")
    proxy.throttle(10**6)
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    dr = rep.targets["dr"]
    assert dr.status == TargetStatus.FAILED and dr.segments_copied == 0
    assert dr.error is not None and "site dr: the store throttled" in dr.error, dr.error
    assert "after 3 retries" in dr.error and len(dr.error.splitlines()) == 1
    assert not dr.refused  # throttling clears by itself: the target backs off and is tried again
    assert dr.throttled.get("dr", 0) >= 3
    assert segment_rows(env.catalog, "dr") == []
    assert rep.targets["edge"].status == TargetStatus.OK and rep.targets["edge"].segments_copied > 0
    assert lease_count(env.catalog) == 0

    proxy.throttle(0)  # the store recovers: the next rounds replicate (the events policy retries at once)
    round_until_idle(env)
    assert_replicas_equal_leader(env.catalog)


@pytest.mark.parametrize(
    "bad",
    [
        "max_requests_per_second: 0",
        "max_requests_per_second: -2.5",
        "max_requests_per_second: fast",
        "throttle_retries: 99",
        "throttle_base_ms: -1",
    ],
)
def test_apply_refuses_bad_store_limits_with_exit_2_and_writes_nothing(
    s3_endpoints: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    a, b = s3_endpoints
    use_site_keys(monkeypatch, DR_S3=a, EDGE_S3=b)
    prefix = uuid.uuid4().hex[:12]
    env = make_env(tmp_path, sqlite_url(tmp_path), s3_events_yaml(a, b, prefix))
    Model().upsert(env, range(20), "a")
    objects = a.keys(BUCKETS[0], prefix)
    env.config.write_text(s3_events_yaml(a, b, prefix, options_a=bad))
    key = bad.partition(":")[0]
    for args in (("apply",), ("round", TABLE)):
        with unchanged(env):
            code, out, err = cli(env, *args)
        assert_user_error(code, out, err, "site dr", key)
    assert a.keys(BUCKETS[0], prefix) == objects
