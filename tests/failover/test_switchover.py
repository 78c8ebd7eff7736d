"""Planned switchover with RPO 0 (issue 14 item 4): writes pause with a clear, retryable error, rounds drain
the new leader, the leaders move, writes resume there, and the old leader follows by fast-forward; on timeout
writes resume at the old leader and nothing else changes. Failback after a failover is a switchover back."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.core.errors import SegrepError, WritesPausedError
from segrep.data.writer import write_batch
from segrep.failover import switchover as sw
from segrep.failover.promote import failover
from segrep.replication.orchestrator import run_round
from segrep.split.workflow import start_split
from tests.support.badinput import assert_user_error, unchanged
from tests.support.checks import assert_replicas_equal_leader, leaders, triples
from tests.support.cli import cli
from tests.support.env import Env
from tests.support.models import Model
from tests.support.rounds import no_spark
from tests.support.tables import TABLE, batch


def paused(env: Env) -> set[int | None]:
    with env.catalog.read() as s:
        return set(s.scalars(select(m.Partition.paused_us)))


def test_switchover_moves_the_leader_with_nothing_lost(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    model = Model()
    model.upsert(env, range(0, 40), "a")
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    model.upsert(env, range(30, 70), "pending")  # not replicated yet: the drain carries it
    model.delete(env, range(0, 4))
    before = leaders(env.catalog)
    refused: list[str] = []
    real_round = sw.run_round

    def round_with_a_writer(*args: Any, **kwargs: Any) -> Any:
        try:  # a writer during the drain: refused with a clear, retryable error, nothing written
            write_batch(env.catalog, TABLE, batch([500], "during"))
        except WritesPausedError as exc:
            refused.append(str(exc))
        code, out, _err = cli(env, "status", TABLE)
        assert code == 0 and "SWITCHING OVER: writes paused since" in out, out
        return real_round(*args, **kwargs)

    monkeypatch.setattr(sw, "run_round", round_with_a_writer)
    report, drained = sw.switchover(env.catalog, env.defs, [TABLE], "edge", submit=no_spark)
    assert refused and "is switching over" in refused[0] and "write again" in refused[0]
    (move,) = report.moves
    assert move.assessment.loss == [] and move.failover_id is not None  # RPO 0
    assert drained[0].segments_copied > 0 and drained[-1].lacking == 0
    assert {site for site, _ in leaders(env.catalog).values()} == {"edge"}
    assert all(leaders(env.catalog)[pid][1] == before[pid][1] + 1 for pid in before)
    assert paused(env) == {None}  # writes resumed
    assert triples(env.catalog) == model.snapshot()  # nothing lost, nothing of the refused write
    model.upsert(env, range(100, 110), "after")  # at edge now
    report2 = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert report2.targets["primary"].outcomes == {"FAST_FORWARD": 2}  # the old leader follows by fast-forward
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert_replicas_equal_leader(env.catalog, ("primary", "dr"))
    with env.catalog.read() as s:
        assert s.scalars(select(m.Failover.kind)).all() == ["switchover"]


def test_a_switchover_that_times_out_resumes_writes_at_the_old_leader(outage_env: Env) -> None:
    env = outage_env
    model = Model()
    model.upsert(env, range(0, 20), "a")
    before = leaders(env.catalog)
    (env.site_dir("edge")).mkdir(parents=True, exist_ok=True)
    (env.site_dir("edge") / TABLE).write_text("in the way\n")  # edge cannot receive anything
    with pytest.raises(SegrepError, match=r"switchover to edge timed out .* writes resumed at the old leader"):
        sw.switchover(env.catalog, env.defs, [TABLE], "edge", timeout_s=0.01, submit=no_spark)
    assert leaders(env.catalog) == before and paused(env) == {None}
    model.upsert(env, range(20, 30), "b")  # writes work again at primary
    assert triples(env.catalog) == model.snapshot()
    with env.catalog.read() as s:
        assert s.scalars(select(m.Failover)).all() == []


def test_a_zero_timeout_switches_only_when_nothing_is_left_to_drain(env: Env) -> None:
    """``--timeout 0`` does not wait: no drain round runs (nothing is copied), and the leaders move only if the
    new leader already holds everything."""
    model = Model()
    model.upsert(env, range(0, 20), "a")
    before = leaders(env.catalog)
    with unchanged(env):
        code, out, err = cli(env, "switchover", TABLE, "--to", "dr", "--timeout", "0")
        assert_user_error(code, out, err, "timeout of 0", "dr still lacks segments", "nothing else changed")
    assert leaders(env.catalog) == before and paused(env) == {None}
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)  # dr catches up
    code, out, err = cli(env, "switchover", TABLE, "--to", "dr", "--timeout", "0")
    assert code == 0, err
    assert "drain" not in out and "loss: none" in out, out
    assert {site for site, _ in leaders(env.catalog).values()} == {"dr"} and paused(env) == {None}
    assert triples(env.catalog) == model.snapshot()


def test_failback_after_a_failover_is_a_switchover_back_through_the_cli(env: Env) -> None:
    model = Model()
    model.upsert(env, range(0, 30), "a")
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    failover(env.catalog, env.defs, [TABLE], to="dr")
    model.upsert(env, range(20, 50), "at_dr")
    code, out, err = cli(env, "switchover", TABLE, "--to", "primary", "--timeout", "2m")
    assert code == 0, err
    assert "switchover of events: dr -> primary" in out and "loss: none" in out, out
    assert {site for site, _ in leaders(env.catalog).values()} == {"primary"}
    assert triples(env.catalog) == model.snapshot()
    with unchanged(env):
        code, _out, err = cli(env, "switchover", TABLE, "--to", "primary", "--timeout", "soon")
    assert code == 2 and "--timeout" in err and "soon" in err


def test_a_switchover_during_a_split_lifts_the_pause_everywhere(env: Env) -> None:
    """A split parent in UNLOAD takes no writes and has no leader to move: its pause must go all the same."""
    model = Model()
    model.upsert(env, range(0, 20), "a")
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    start_split(env.catalog, TABLE, 5, ["b"], is_async=True)  # the parent enters UNLOAD at once
    sw.switchover(env.catalog, env.defs, [TABLE], "dr", submit=no_spark)
    assert paused(env) == {None}
    model.upsert(env, range(20, 30), "b")  # writes go on, at dr
    assert triples(env.catalog) == model.snapshot()
