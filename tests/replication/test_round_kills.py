"""A round killed with SIGKILL (an OOM-killed worker) blocks the next one only until its leases lapse.

Leases are short and renewed by a heartbeat while their round works: a live round keeps them through a copy
longer than their lifetime, a dead one stops renewing and they lapse. The declines a dead round's leases
cause (INFLIGHT) never back the target off, and `segrep status` names the round that holds them and until
when. The lease lifetime is cut to ~2 s here (``SEGREP_LEASE_TTL_S``); the figure for the default lifetime
(the next round replicates within 60 s of the kill) is measured by ``bench/chaos.py``. On SQLite and
PostgreSQL, with a real ``segrep round`` process killed at each point of the fast-forward.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.core import faults, hlc
from segrep.replication.fast_forward import fast_forward_target
from segrep.replication.orchestrator import run_round
from segrep.replication.reports import TargetStatus
from segrep.replication.round import LEASE_TTL_ENV
from segrep.replication.status import status_rows
from segrep.storage.transport import CopyItem, CopyOutcome, local_copier
from tests.support.checks import assert_replicas_equal_leader, lease_count, triples
from tests.support.env import Env
from tests.support.models import Model
from tests.support.rounds import no_spark
from tests.support.tables import REPLICAS, TABLE

TTL_S = 2.0
SHORT_TTL_S = 1.2  # the heartbeat test's lease lifetime: the copy takes three of them
KILL_POINTS = ("before_copy", "after_copy_before_commit", "after_commit_before_ack", "before_checkpoint")


def _segrep_round(env: Env, point: str) -> subprocess.Popen[str]:
    """``segrep round`` in its own process, stopping (alive, leases held) at the fault point."""
    run_env = {**os.environ, faults.FAULTS_ENV: f"{point}:hang", LEASE_TTL_ENV: str(TTL_S)}
    segrep = str(Path(sys.executable).with_name("segrep"))
    return subprocess.Popen(
        [segrep, "--config", str(env.config), "--catalog", env.url, "round", TABLE],
        env=run_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_hang(proc: subprocess.Popen[str], point: str) -> None:
    assert proc.stderr is not None
    line = proc.stderr.readline()  # blocks until the process reaches the point (or dies first)
    assert line.strip() == f"{faults.HANG_MARK}{point}", f"round did not reach {point}: {line!r}"


def _backoffs(env: Env) -> list[tuple[int, int]]:
    with env.catalog.read() as s:
        return [(b.site_id, b.failures) for b in s.scalars(select(m.Backoff))]


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_killed_round_blocks_the_next_only_until_its_leases_lapse(
    env: Env, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    monkeypatch.setenv(LEASE_TTL_ENV, str(TTL_S))
    model = Model()
    model.upsert(env, range(30), "a")
    proc = _segrep_round(env, point)
    try:
        _wait_for_hang(proc, point)
        if point in ("before_copy", "after_copy_before_commit"):  # later, the receiver released its receipts
            before = _lease_expiries(env)
            time.sleep(TTL_S)  # a live process keeps renewing: past one TTL its leases are still there
            after = _lease_expiries(env)
            assert before and set(before) <= set(after), "the live round's leases lapsed although it is alive"
            assert all(after[k] > before[k] for k in before), "the live round's leases were not renewed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    model.upsert(env, range(20, 40), "b")  # the next interval has more to carry

    killed_at = time.monotonic()
    first = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    if lease_count(env.catalog):  # the dead round's receipts are still in force: waiting, not backed off
        assert {t.status for t in first.targets.values()} <= {TargetStatus.WAITING, TargetStatus.OK}
        notes = [lease.holder for row in status_rows(env.catalog, TABLE) for lease in row.leases]
        assert notes and all(holder.startswith(f"{TABLE}-") for holder in notes)
    assert _backoffs(env) == [], "leases of a dead round backed the target off"

    rounds = 1
    while triples(env.catalog, "dr") != model.snapshot() or triples(env.catalog, "edge") != model.snapshot():
        assert time.monotonic() - killed_at < 20 * TTL_S, f"no convergence {rounds} rounds after the kill"
        time.sleep(TTL_S / 4)
        run_round(env.catalog, env.defs, TABLE, submit=no_spark)
        rounds += 1
        assert _backoffs(env) == []
    assert_replicas_equal_leader(env.catalog, REPLICAS)
    assert lease_count(env.catalog) == 0


def _lease_expiries(env: Env) -> dict[tuple[int, str], int]:
    with env.catalog.read() as s:
        return {(le.target_placement_id, le.segment_id): le.expires_us for le in s.scalars(select(m.Lease))}


def test_a_live_round_keeps_its_leases_through_a_copy_longer_than_their_lifetime(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one round copies for three lease lifetimes, a round of a later interval is declined INFLIGHT
    (without the heartbeat the leases would lapse and both would copy the same segments)."""
    # a lifetime long enough that a busy machine's late beat (a renewal every 0.4 s) never lets a lease lapse
    monkeypatch.setenv(LEASE_TTL_ENV, str(SHORT_TTL_S))
    model = Model()
    model.upsert(env, range(30), "a")
    copying, release = threading.Event(), threading.Event()

    def slow_copier(items: list[CopyItem]) -> list[CopyOutcome]:
        copying.set()
        release.wait(30)
        return local_copier(items)

    end = hlc.now_us()
    results: list[object] = []
    worker = threading.Thread(
        target=lambda: results.append(fast_forward_target(env.catalog, env.defs, TABLE, "dr", end, copier=slow_copier))
    )
    worker.start()
    try:
        assert copying.wait(30)
        time.sleep(3 * SHORT_TTL_S)
        later = fast_forward_target(env.catalog, env.defs, TABLE, "dr", hlc.now_us(), copier=local_copier)
        assert later.segments_copied == 0 and later.outcomes.get("INFLIGHT", 0) >= 1, later
        assert later.status == TargetStatus.WAITING and not later.backs_off
        assert later.error is not None and later.error.startswith("waiting: leases held by round "), later
        (row,) = [r for r in status_rows(env.catalog, TABLE) if r.target == "dr"]
        assert [lease.holder for lease in row.leases] == [f"{TABLE}-{end}"]
        assert all(lease.expires_us > hlc.now_us() for lease in row.leases)
    finally:
        release.set()
        worker.join()
    (report,) = results
    assert getattr(report, "status", None) == TargetStatus.OK
    assert lease_count(env.catalog) == 0
