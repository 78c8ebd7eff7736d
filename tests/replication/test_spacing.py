"""Rounds on write are spaced by ``min_interval`` from the start of the table's latest round, read from
segrep's catalog (segrep.replication.spacing); the wait itself is handed a recording sleep, so nothing here
depends on how fast the machine is."""

from __future__ import annotations

import pytest

from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.core import hlc
from segrep.replication.spacing import spacing_wait_s, wait_for_spacing
from tests.support.env import Env

S = 1_000_000  # µs


def add_round(env: Env, table: str, started_us: int, end_us: int) -> None:
    with env.catalog.write() as s:
        table_id = q.table_info(s, table).table_id
        s.add(m.Round(table_id=table_id, interval_end_us=end_us, status="ok", started_us=started_us, report={}))


def test_no_round_yet_means_no_wait(env: Env) -> None:
    assert spacing_wait_s(env.catalog, "events", 10) == 0.0


def test_the_wait_counts_from_the_latest_rounds_start(env: Env) -> None:
    t0 = 1_800_000_000 * S
    add_round(env, "events", started_us=t0 - 60 * S, end_us=t0 - 60 * S)
    add_round(env, "events", started_us=t0, end_us=t0)  # the latest round, created last
    add_round(env, "orders", started_us=t0 + 9 * S, end_us=t0 + 9 * S)  # another table's round does not count

    assert spacing_wait_s(env.catalog, "events", 10, now_us=t0 + 3 * S) == pytest.approx(7.0)
    assert spacing_wait_s(env.catalog, "events", 10, now_us=t0 + 10 * S) == 0.0
    assert spacing_wait_s(env.catalog, "events", 10, now_us=t0 + 3600 * S) == 0.0
    assert spacing_wait_s(env.catalog, "events", 0, now_us=t0) == 0.0  # min_interval 0: back to back
    # a round stamped by a clock far ahead never makes a round wait longer than min_interval
    assert spacing_wait_s(env.catalog, "events", 10, now_us=t0 - 3600 * S) == 10.0
    assert spacing_wait_s(env.catalog, "orders", 10, now_us=t0 + 12 * S) == pytest.approx(7.0)


def test_wait_for_spacing_sleeps_what_is_left(env: Env) -> None:
    slept: list[float] = []
    assert wait_for_spacing(env.catalog, "events", 600, sleep=slept.append) == 0.0
    assert slept == []  # nothing to wait for: no sleep at all

    add_round(env, "events", started_us=hlc.now_us(), end_us=hlc.now_us())
    waited = wait_for_spacing(env.catalog, "events", 600, sleep=slept.append)
    assert slept == [waited] and 590 < waited <= 600  # the round just started: nearly all of it is left


def test_an_unknown_table_is_named(env: Env) -> None:
    from segrep.core.errors import SegrepError

    with pytest.raises(SegrepError, match="nosuch"):
        spacing_wait_s(env.catalog, "nosuch", 10)
