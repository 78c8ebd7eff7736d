"""The failover DAG through ``dag.test``: a dry run changes nothing and reports the loss; a failover moves the
leaders and replicates from the new one; a switchover back moves them again with nothing lost."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from segrep.catalog import models as m
from segrep.data.writer import write_batch
from segrep.replication.orchestrator import run_round
from tests.support.airflow import events_batch, load_dag, read_sorted, replay_rows, rows_of, ti_states
from tests.support.checks import leaders

POLICY = {"schedule": "5m", "start_date": "2026-11-01", "retries": 0, "retry_delay_s": 0}


def _no_spark(*_a: Any, **_k: Any) -> None:
    raise AssertionError("no Spark application expected")


def _leader_sites(env: Any) -> set[str]:
    return {site for site, _epoch in leaders(env.catalog, "events").values()}


def _run(dag: Any, conf: dict[str, Any]) -> Any:
    import pendulum

    return dag.test(logical_date=pendulum.now("UTC"), run_conf=conf)


def test_failover_dag_dry_run_then_failover_then_switchover_back(segrep_env: Any) -> None:
    env = segrep_env(POLICY)
    written = [(range(0, 40), "a")]
    write_batch(env.catalog, "events", events_batch(list(written[0][0]), "a"))
    run_round(env.catalog, env.defs, "events", submit=_no_spark)
    write_batch(env.catalog, "events", events_batch(list(range(30, 50)), "lost"))  # primary only
    dag = load_dag("segrep_failover")
    assert dag.params["dry_run"] is True and dag.schedule is None

    dry = _run(dag, {"tables": ["events"]})
    states = ti_states(dry)
    assert str(dry.state) == "success", states
    assert {states[(t, -1)] for t in ("failover", "switchover", "verify")} == {"skipped"}, states
    assert states[("report", -1)] == "success" and _leader_sites(env) == {"primary"}

    moved = _run(dag, {"tables": ["events"], "site": "dr", "dry_run": False})
    states = ti_states(moved)
    assert str(moved.state) == "success", states
    assert states[("failover", -1)] == "success" and states[("verify", -1)] == "success"
    assert _leader_sites(env) == {"dr"}
    assert rows_of(read_sorted(env)) == replay_rows(written)  # the unreplicated rows were given up
    assert rows_of(read_sorted(env, "edge")) == replay_rows(written)  # verify's round replicated from dr

    written.append((range(60, 70), "at_dr"))
    write_batch(env.catalog, "events", events_batch(list(written[-1][0]), "at_dr"))
    back = _run(dag, {"tables": ["events"], "site": "primary", "action": "switchover", "dry_run": False})
    states = ti_states(back)
    assert str(back.state) == "success", states
    assert states[("switchover", -1)] == "success" and states[("failover", -1)] == "skipped"
    assert _leader_sites(env) == {"primary"}
    assert rows_of(read_sorted(env)) == replay_rows(written)
    with env.catalog.read() as s:
        assert s.scalars(select(m.Failover.kind).order_by(m.Failover.done_us)).all() == ["failover", "switchover"]


def test_a_switchover_without_a_site_fails_before_anything_changes(segrep_env: Any) -> None:
    env = segrep_env(POLICY)
    write_batch(env.catalog, "events", events_batch(list(range(0, 10)), "a"))
    run = _run(load_dag("segrep_failover"), {"tables": ["events"], "action": "switchover", "dry_run": False})
    assert str(run.state) == "failed" and ti_states(run)[("assess", -1)] == "failed"
    assert _leader_sites(env) == {"primary"}
