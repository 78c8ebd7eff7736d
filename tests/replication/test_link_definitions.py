"""The definitions' ``links:`` hold every copier (issue 36): a round run with no limits of its own takes the
cap and copy limit of the link its target is across; the windows' timetable reaches a running holder; and
``segrep status`` shows, per link in use, the rate measured, the shares, and who waits and why."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from segrep.catalog import link_slots as lk
from segrep.catalog.link_lease import LinkLease, LinkPacing
from segrep.catalog.link_limits import definitions_limits
from segrep.core import hlc
from segrep.core.links import CopyPriority
from segrep.data.writer import write_batch
from segrep.replication.join import catch_up
from segrep.replication.orchestrator import run_round
from segrep.replication.reports import RoundReport
from tests.support.cli import cli
from tests.support.env import Env, env_fixture, sqlite_url
from tests.support.rounds import no_spark

CAP = 1024 * 1024
DEFINED_YAML = f"""
data_dir: data
sites:
  primary: {{id: 1, uri: sites/primary}}
  dr: {{id: 2, uri: sites/dr}}
  edge: {{id: 3, uri: sites/edge}}
tables:
  hot:
    columns: {{k: int64, v: string}}
    primary_key: [k]
    leader: primary
    replicas: [dr, edge]
    policy: {{retry_delay_s: 0, spark_copy_threshold_bytes: 1099511627776}}
links:
  - from: primary
    to: dr
    max_bytes_per_second: {CAP}
    max_concurrent_copies: 1
"""
# the same link with a Saturday window (a round's test uses the link without it: any day of the week)
WINDOWED_YAML = (
    DEFINED_YAML
    + """    windows:
      - {days: sat, from: "00:00", to: "24:00", max_bytes_per_second: 4096}
"""
)


@pytest.fixture
def defined_env(tmp_path: Path) -> Iterator[Env]:
    yield from env_fixture(tmp_path, sqlite_url(tmp_path), DEFINED_YAML)


def tree_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.exists() else 0


def test_the_limits_come_from_the_link_and_its_window(defined_env: Env) -> None:
    defined_env.config.write_text(WINDOWED_YAML)
    friday, saturday = datetime(2026, 11, 27, 12, tzinfo=UTC), datetime(2026, 11, 28, 12, tzinfo=UTC)
    at_friday = definitions_limits(defined_env.defs, lambda: friday)
    assert at_friday("primary", "dr") == lk.Limits(cap_bytes_per_s=CAP, max_concurrent=1)
    assert definitions_limits(defined_env.defs, lambda: saturday)("primary", "dr") == lk.Limits(4096, 1)
    assert at_friday("dr", "primary") is None  # directional: no link back
    assert at_friday("primary", "edge") is None  # no link: no slot, unpaced


def test_a_window_reaches_a_holder_already_copying(defined_env: Env) -> None:
    defined_env.config.write_text(WINDOWED_YAML)
    now = [datetime(2026, 11, 27, 23, 59, 58, tzinfo=UTC)]  # Friday, just before Saturday's window
    limits = definitions_limits(defined_env.defs, lambda: now[0])
    with LinkLease(defined_env.catalog, "primary", "dr", CopyPriority.ROUND, lambda: limits("primary", "dr")) as held:
        assert held.pacer.rate == CAP
        now[0] = datetime(2026, 11, 28, 0, 0, tzinfo=UTC)  # the window begins
        started = time.monotonic()
        while held.pacer.rate != 4096:
            assert time.monotonic() - started < 5, held.pacer.rate
            time.sleep(0.1)


def test_a_round_takes_its_links_cap_and_status_shows_who_sends_and_who_waits(defined_env: Env) -> None:
    for n in range(3):
        rows = pa.table(
            {
                "k": pa.array(range(n * 1000, n * 1000 + 1000), pa.int64()),
                "v": [os.urandom(500).hex() for _ in range(1000)],
            }
        )
        write_batch(defined_env.catalog, "hot", rows)
    size = tree_bytes(defined_env.site_dir("primary") / "hot")
    assert size > 2_500_000  # a few seconds at the cap
    reports: list[RoundReport] = []
    started = time.monotonic()
    round_ = threading.Thread(
        target=lambda: reports.append(
            run_round(defined_env.catalog, defined_env.defs, "hot", target="dr", submit=no_spark)
        )
    )
    round_.start()
    try:
        seen = _status_while(defined_env, round_, lambda doc: any(x["holders"] for x in doc["link_activity"]))
        (link,) = seen["link_activity"]
        assert link["link"] == "primary -> dr" and link["max_bytes_per_second"] == CAP
        assert [h["what"] for h in link["holders"]] == ["round"]
        # a scrub reading over the same link waits: one copy at a time
        waiter = threading.Thread(
            target=lambda: (
                LinkLease(defined_env.catalog, "primary", "dr", CopyPriority.SCRUB, lambda: lk.Limits(CAP, 1))
                .__enter__()
                .__exit__(None, None, None)
            )
        )
        waiter.start()
        seen = _status_while(
            defined_env,
            round_,
            lambda doc: any(x["waiting"] and x["sending_bytes_per_s"] for x in doc["link_activity"]),
        )
        (link,) = seen["link_activity"]
        assert 0 < link["sending_bytes_per_s"] <= CAP * 2  # measured at beats, whole chunks of a MiB
        assert [w["what"] for w in link["waiting"]] == ["scrub"]
        assert "allows 1 copies at once, all held (round)" in link["waiting"][0]["why"]
        code, text, _err = cli(defined_env, "status", "hot")
        assert code == 0 and "links in use" in text and "primary -> dr" in text and "scrub:" in text, text
    finally:
        round_.join(120)
    elapsed = time.monotonic() - started
    waiter.join(30)
    (report,) = reports
    assert report.targets["dr"].status == "ok" and tree_bytes(defined_env.site_dir("dr") / "hot") == size
    assert elapsed >= (size - CAP // 2) / CAP  # never faster than the link's cap, less a burst
    edge = run_round(defined_env.catalog, defined_env.defs, "hot", target="edge", submit=no_spark)
    assert edge.targets["edge"].status == "ok"  # no link to edge: no slot, unpaced
    code, out, _err = cli(defined_env, "status", "--json")
    assert code == 0 and json.loads(out)["link_activity"] == []  # every slot released


def _status_while(env: Env, running: threading.Thread, wanted: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """``segrep status --json`` polled until ``wanted(doc)`` while ``running`` runs."""
    while running.is_alive():
        code, out, err = cli(env, "status", "--json")
        assert code == 0, err
        doc = json.loads(out)
        if wanted(doc):
            return doc
        time.sleep(0.1)
    raise AssertionError("the round ended before status showed it")


def test_a_catch_up_goes_at_a_catch_ups_share(defined_env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """`catch_up` (a replica back after a loss, or repair's re-bootstrap) copies as the second class, behind the
    scheduled rounds and ahead of bootstraps; a replica still joining takes a bootstrap's."""
    write_batch(defined_env.catalog, "hot", pa.table({"k": pa.array([1, 2], pa.int64()), "v": ["a", "b"]}))
    run_round(defined_env.catalog, defined_env.defs, "hot", submit=no_spark)
    write_batch(defined_env.catalog, "hot", pa.table({"k": pa.array([3], pa.int64()), "v": ["c"]}))
    taken: list[tuple[str, str, str]] = []
    real_enter = LinkLease.__enter__

    def entering(lease: LinkLease) -> LinkLease:
        taken.append((lease.source, lease.target, str(lease.what)))
        return real_enter(lease)

    monkeypatch.setattr(LinkLease, "__enter__", entering)
    reports = catch_up(defined_env.catalog, defined_env.defs, "hot", "dr", submit=no_spark)
    assert reports[-1].targets["dr"].status == "ok"
    assert taken == [("primary", "dr", "catchup")]


def test_a_link_unlimited_for_now_takes_no_slot_until_a_window_caps_it(defined_env: Env) -> None:
    """A defined link whose window leaves it unlimited costs a copy nothing (no slot, no catalog write); the
    copier asks at each file, so the first file after a window caps the link takes a slot and is paced."""
    now = [lk.Limits()]
    with LinkPacing(defined_env.catalog, CopyPriority.ROUND, lambda s, t: now[0]) as pacing:
        assert pacing.pacer("primary", "dr") is None
        with defined_env.catalog.read() as s:
            assert lk.slots(s, hlc.now_us()) == [] and lk.budget(s, lk.Link(1, 2)) is None
        now[0] = lk.Limits(cap_bytes_per_s=CAP)  # the window begins: the next file
        pacer = pacing.pacer("primary", "dr")
        assert pacer is not None and pacer.rate == CAP
