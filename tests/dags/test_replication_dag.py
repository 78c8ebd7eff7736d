"""The replication DAG end to end through ``dag.test``: tasks run in-process, the merge task runs a real
``spark-submit`` (local[*]) and both replica sites (dr, edge) end up reading exactly what the leader reads.

Merge outputs are committed to the leader by the round's commit task, after that round's fast-forwards, so
the replicas receive them in the next round: a fork takes two rounds to converge, the third has nothing to do."""

from __future__ import annotations

from typing import Any

import pytest

from segrep.spark.results import CommitSummary
from tests.support.airflow import (
    EVENTS_DAG,
    events_batch,
    load_dag,
    read_sorted,
    replay_rows,
    rounds,
    rows_of,
    set_leader,
    ti_states,
)

# A fixed interval: dag.test(logical_date=now) covers [now - 5 min, now), so everything written so far is due.
POLICY = {"schedule": "5m", "start_date": "2026-11-01", "retries": 1, "retry_delay_s": 0}
REPLICAS = ("dr", "edge")


def _run(dag: Any, **kwargs: Any) -> Any:
    import pendulum

    return dag.test(logical_date=pendulum.now("UTC"), **kwargs)


def _safe_time_problems(env: Any, report: dict[str, Any], label: str) -> list[str]:
    """Safe time's promise, read through the public reader: as of its safe time, a replica site resolves every
    key the way the leader does (nothing here leaves an unmerged fork at a replica, so equal is required)."""
    from segrep.data.reader import read_table

    problems = []
    for site in REPLICAS:
        safe = report["safe_time_us"][site]
        lead = rows_of(read_table(env.catalog, "events", as_of=safe))
        there = rows_of(read_table(env.catalog, "events", site, as_of=safe))
        diff = sorted(k for k in lead.keys() | there.keys() if lead.get(k) != there.get(k))
        if diff:
            examples = ", ".join(f"{k}: leader {lead.get(k)!r}, {site} {there.get(k)!r}" for k in diff[:3])
            problems.append(
                f"after the {label} round, {site} as of its safe time {safe} differs from the leader "
                f"in {len(diff)} keys ({examples})"
            )
    return problems


@pytest.mark.spark
@pytest.mark.parametrize("engine", ["spark", "auto"])
def test_fork_is_merged_and_replicas_match_the_leader(segrep_env: Any, engine: str) -> None:
    """`merge_engine: spark`: the mapped path and the SparkSubmit merge; `auto`: this small fork merges in
    process, and the whole round runs in the one `round` task. Either way the same rows everywhere."""
    env = segrep_env({**POLICY, "merge_engine": engine})
    written = [(range(0, 100), "a"), (range(90, 120), "dr"), (range(95, 130), "p")]
    from segrep.data.writer import write_batch

    write_batch(env.catalog, "events", events_batch(list(written[0][0]), written[0][1]))
    set_leader(env, "dr")  # failover: dr leads and takes writes the primary never saw ...
    write_batch(env.catalog, "events", events_batch(list(written[1][0]), written[1][1]))
    set_leader(env, "primary")  # ... then the primary leads again and writes on its own branch: a fork
    write_batch(env.catalog, "events", events_batch(list(written[2][0]), written[2][1]))
    dag = load_dag(EVENTS_DAG)
    problems: list[str] = []

    # Round 1: plan finds the fork and writes a merge manifest; the replicas fast-forward the leader's chain;
    # one Spark application (the merge task, real spark-submit) merges dr's pushed writes into the leader.
    run = _run(dag)

    states = ti_states(run)
    assert run.state == "success", states
    first = rounds(env)[-1]
    if engine == "spark":
        assert states[("merge", -1)] == "success"
        assert {states[(f"fast_forward_{site}", -1)] for site in REPLICAS} == {"success"}
        assert states[("fast_forward_primary", -1)] == "skipped"  # the leader's: not a target
        assert {states[(t, -1)] for t in ("round", "choose", "commit", "report")} == {"success"}
        assert states[("done_in_round", -1)] == "skipped"  # a Spark merge: the big path
        assert first.report["spark_apps"] >= 1
    else:
        assert states[("round", -1)] == states[("done_in_round", -1)] == "success"
        assert states[("merge", -1)] == "skipped" and first.report["spark_apps"] == 0
    assert first.status == "ok", first.report
    assert first.report["merges"]["items"] >= 1
    assert first.report["merges"]["committed"] == first.report["merges"]["items"]
    assert sorted(first.report["targets"]) == list(REPLICAS)
    leader = read_sorted(env)
    assert rows_of(leader) == replay_rows(written)  # last writer wins, dr's surviving writes included
    problems += _safe_time_problems(env, first.report, "merge")

    # Round 2: the merge outputs were committed after round 1's fast-forwards: the replicas take them now, in
    # one task (a small round with nothing to merge).
    run = _run(dag)

    states = ti_states(run)
    assert run.state == "success", states
    assert states[("round", -1)] == states[("done_in_round", -1)] == "success"
    assert {states[(t, -1)] for t in ("fast_forward_dr", "choose", "merge", "commit", "report")} == {"skipped"}
    second = rounds(env)[-1]
    assert second.report["spark_apps"] == 0
    assert read_sorted(env).equals(leader)
    for site in REPLICAS:
        assert read_sorted(env, site).equals(leader), f"{site} differs from the leader"
        assert second.report["safe_time_us"][site] == second.interval_end_us - 1
    problems += _safe_time_problems(env, second.report, "catch-up")

    # Round 3 has nothing to do: one task, no Spark application.
    run = _run(dag)

    states = ti_states(run)
    assert run.state == "success", states
    assert states[("merge", -1)] == "skipped" and states[("done_in_round", -1)] == "success"
    idle = rounds(env)[-1]
    assert idle.round_id != second.round_id
    assert idle.report["spark_apps"] == 0
    assert CommitSummary.from_dict(idle.report["merges"]) == CommitSummary()  # no merge item: {"items": 0}
    assert all(t["outcomes"] == {} and t["status"] == "ok" for t in idle.report["targets"].values())
    for site in REPLICAS:
        assert read_sorted(env, site).equals(leader)
    problems += _safe_time_problems(env, idle.report, "idle")

    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", ["one_task", "mapped"])
def test_trigger_narrowed_to_one_target(segrep_env: Any, path: str) -> None:
    """The `target` Param limits a manual run to one replica site; the other is left alone (no Spark here).
    A small round runs whole in the `round` task; with `one_task_round_max_bytes: 0` every round takes the
    mapped path: the same round, the same result, through `fast_forward`, `commit` and `report`."""
    env = segrep_env({**POLICY, "one_task_round_max_bytes": 0} if path == "mapped" else POLICY)
    from segrep.data.writer import write_batch

    write_batch(env.catalog, "events", events_batch(list(range(40)), "a"))
    dag = load_dag(EVENTS_DAG)

    run = _run(dag, run_conf={"target": "edge"})

    states = ti_states(run)
    assert run.state == "success", states
    mapped = ("fast_forward_dr", "fast_forward_edge", "fast_forward_primary", "choose", "commit", "report")
    if path == "mapped":
        assert states[("fast_forward_edge", -1)] == "success"
        assert states[("fast_forward_dr", -1)] == states[("fast_forward_primary", -1)] == "skipped"
        assert states[("done_in_round", -1)] == "skipped" and states[("commit", -1)] == "success"
    else:
        assert states[("round", -1)] == states[("done_in_round", -1)] == "success"
        assert {state for (task_id, _i), state in states.items() if task_id in mapped} == {"skipped"}
    assert states[("merge", -1)] == "skipped"
    last = rounds(env)[-1]
    assert sorted(last.report["targets"]) == ["edge"]
    assert last.report["targets"]["edge"]["segments_copied"] == 2  # one per partition
    assert read_sorted(env, "edge").equals(read_sorted(env))
    assert read_sorted(env, "dr").num_rows == 0


def test_the_merge_task_keeps_the_rounds_leases_alive_while_spark_runs(
    segrep_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The merge task is one of the round's workers: while its Spark application runs (here a stand-in
    taking three lease lifetimes), the round's leases are renewed; once it ends, they are not."""
    import time

    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from sqlalchemy import select

    from segrep.catalog import leases as ls
    from segrep.catalog import models as m
    from segrep.core import hlc
    from segrep.replication.round import LEASE_TTL_ENV
    from segrep_airflow.common import LeasedSparkSubmitOperator

    env = segrep_env(POLICY)
    ttl_s = 1.2  # long enough that a busy machine's late beat (a renewal every 0.4 s) never lets the lease lapse
    monkeypatch.setenv(LEASE_TTL_ENV, str(ttl_s))
    holder = "events-1795000000000000"
    with env.catalog.write() as s:
        placement = s.scalars(select(m.Placement.placement_id).limit(1)).one()
        assert ls.acquire(s, placement, "0" * 32, holder, hlc.now_us() + int(ttl_s * 1_000_000))
    alive_during: list[int] = []

    def spark_runs(self: Any, context: Any) -> None:
        time.sleep(3 * ttl_s)
        with env.catalog.read() as s:
            alive_during.append(len(ls.held(s, [placement], hlc.now_us())))

    monkeypatch.setattr(SparkSubmitOperator, "execute", spark_runs)
    LeasedSparkSubmitOperator(task_id="merge", application="merge.py", lease_holder=holder).execute({})
    assert alive_during == [1]
    time.sleep(ttl_s + 0.2)  # no worker left: the lease lapses
    with env.catalog.read() as s:
        assert ls.held(s, [placement], hlc.now_us()) == []
