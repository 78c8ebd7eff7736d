"""A site's ``max_requests_per_second`` for the whole deployment (issue 36, DESIGN 17): the processes talking to
the site share it through request slots in the catalog, bound to liveness. Two holders get half each; when one
dies (a process killed: its slot lapses after its TTL), the other gets all of it. Real beats; waits are
bounded polls, not timed assertions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import pytest

from segrep.catalog import Catalog
from segrep.catalog import link_slots as lk
from segrep.catalog.request_slots import MILLI, RequestSharing, shared_site_requests
from segrep.config.stores import StoreOptions
from segrep.core import hlc
from segrep.core.links import CopyPriority
from segrep.storage import throttle
from segrep.storage.throttle import RequestBucket, SiteLimits, ThrottlePolicy
from tests.support.env import Env, sqlite_url
from tests.support.polling import eventually

BEAT_S = 0.2
TTL_US = 2_000_000


def site_limits(site: str, rate: float) -> SiteLimits:
    return SiteLimits(site, ThrottlePolicy(), RequestBucket(rate))


def request_slots(catalog: Catalog) -> list[lk.SlotView]:
    with catalog.read() as s:
        return [v for v in lk.slots(s, hlc.now_us()) if v.link.source_site_id == v.link.target_site_id]


def test_a_held_bucket_waits_for_a_rate_and_its_burst_follows_it() -> None:
    now = [0.0]
    bucket = RequestBucket(10, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    bucket.set_rate(5)
    assert bucket.burst == 5 and bucket.cap == 10
    for _ in range(25):
        bucket.take()
    assert now[0] == pytest.approx((25 - 5) / 5)  # at the share now, not the site's whole rate
    bucket.set_rate(0)  # no share yet: takers wait
    taker = threading.Thread(target=bucket.take)
    taker.start()
    taker.join(0.3)
    assert taker.is_alive()
    bucket.set_rate(10)
    taker.join(10)
    assert not taker.is_alive()


def test_two_holders_share_a_sites_request_rate_and_a_dead_ones_share_comes_back(env: Env) -> None:
    """Two processes' sharings of site dr's 10 requests/s: 5 each; the second gives its slot up (its task
    ended), the first gets all 10 again. Request slots are not links: status's links leave them out."""
    first, second = site_limits("dr", 10), site_limits("dr", 10)
    with RequestSharing(env.catalog, beat_s=BEAT_S, ttl_us=TTL_US) as one:
        one.join(first)
        assert first.bucket is not None and second.bucket is not None
        assert eventually(lambda: first.bucket.rate == 10)  # type: ignore[union-attr]  # alone: all of it
        with RequestSharing(env.catalog, beat_s=BEAT_S, ttl_us=TTL_US) as two:
            two.join(second)
            assert eventually(lambda: (first.bucket.rate, second.bucket.rate) == (5, 5))  # type: ignore[union-attr]
            slots = request_slots(env.catalog)
            assert len(slots) == 2 and {v.what for v in slots} == {CopyPriority.REQUESTS}
            assert sum(v.share or 0 for v in slots) <= 10 * MILLI
            with env.catalog.read() as s:
                assert lk.link_states(s, hlc.now_us()) == []  # not a link between sites
        assert second.bucket.rate == 10  # a sharing that ended leaves its process unheld
        assert eventually(lambda: first.bucket.rate == 10)  # type: ignore[union-attr]
    assert request_slots(env.catalog) == []


def test_a_killed_processs_request_slot_lapses_and_the_other_gets_the_whole_rate(
    sqlite_env: Env, tmp_path: Path
) -> None:
    env = sqlite_env
    url = sqlite_url(tmp_path)
    script = textwrap.dedent(
        f"""
        import time
        from segrep.catalog import Catalog
        from segrep.catalog.request_slots import RequestSharing
        from segrep.storage.throttle import RequestBucket, SiteLimits, ThrottlePolicy
        limits = SiteLimits("dr", ThrottlePolicy(), RequestBucket(10))
        sharing = RequestSharing(Catalog({str(url)!r}), beat_s={BEAT_S}, ttl_us={TTL_US})
        sharing.join(limits)
        while limits.bucket.rate == 0:
            time.sleep(0.05)
        open({str(tmp_path / "holding")!r}, "w").close()
        time.sleep(600)
        """
    )
    mine = site_limits("dr", 10)
    with RequestSharing(env.catalog, beat_s=BEAT_S, ttl_us=TTL_US) as sharing:
        sharing.join(mine)
        assert mine.bucket is not None
        assert eventually(lambda: mine.bucket.rate == 10)  # type: ignore[union-attr]
        other = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
        try:
            assert eventually(lambda: (tmp_path / "holding").exists(), timeout_s=60)
            assert eventually(lambda: mine.bucket.rate == 5)  # type: ignore[union-attr]
            assert len(request_slots(env.catalog)) == 2
        finally:
            os.kill(other.pid, signal.SIGKILL)  # dies without giving its slot up
            other.wait()
        assert eventually(lambda: mine.bucket.rate == 10)  # its slot lapsed after its TTL
        assert len(request_slots(env.catalog)) == 1


def test_the_throttle_hook_shares_every_paced_sites_limits(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the CLI and the Airflow tasks install: each site's limits made in the process (before or after)
    get a slot; a site the catalog does not know is paced at its whole rate, here only."""
    monkeypatch.setattr(throttle, "_limits", {})  # only this test's sites' limits in the process
    opts = StoreOptions(max_requests_per_second=8.0 + uuid.uuid4().int % 1000)
    rate = opts.max_requests_per_second
    assert rate is not None
    before = throttle.limits_for("edge", opts)
    with shared_site_requests(env.catalog):
        after = throttle.limits_for("dr", opts)
        unknown = throttle.limits_for("nowhere", opts)
        assert before.bucket is not None and after.bucket is not None and unknown.bucket is not None
        assert eventually(lambda: len(request_slots(env.catalog)) == 2)
        assert eventually(lambda: (before.bucket.rate, after.bucket.rate) == (rate, rate))  # type: ignore[union-attr]
        assert eventually(lambda: unknown.bucket.rate == rate)  # type: ignore[union-attr]
    assert request_slots(env.catalog) == []
    assert throttle.limits_for("primary", opts).bucket.rate == rate  # type: ignore[union-attr]  # not shared now
