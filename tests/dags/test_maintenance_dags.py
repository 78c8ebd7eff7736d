"""The bootstrap and maintenance DAGs end to end through ``dag.test``: a new replica site joins a table that
holds data (and one that already holds files is refused), and the maintenance DAG compacts with a real
spark-submit and collects garbage, leaving every site's rows unchanged."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.data.writer import write_batch
from segrep.replication.orchestrator import run_round
from tests.support.airflow import edge_rejoins, events_batch, load_dag, read_sorted, ti_states

POLICY = {"schedule": "5m", "start_date": "2026-11-01", "retries": 0, "compact_min_segments": 2}


def _no_spark(*_a: Any, **_k: Any) -> None:
    raise AssertionError("no Spark application expected")


def _states(env: Any, site_id: int) -> list[str]:
    with env.catalog.read() as s:
        q = select(m.Placement.state).where(m.Placement.site_id == site_id, m.Placement.removed_us.is_(None))
        return sorted(s.scalars(q))


def test_bootstrap_dag_refuses_a_site_holding_data_then_joins_it(segrep_env: Any) -> None:
    import pendulum

    env = segrep_env(POLICY)
    edge_rejoins(env)
    before = _states(env, 3)
    assert "JOINING" in before
    with env.catalog.read() as s:
        pid = s.scalars(
            select(m.Placement.partition_id).where(
                m.Placement.site_id == 3, m.Placement.removed_us.is_(None), m.Placement.needs_bootstrap.is_(True)
            )
        ).first()
    stray = env.site_dir("edge") / "events" / str(pid) / ("0" * 32 + ".parquet")
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"data from an earlier life")
    dag = load_dag("segrep_bootstrap")
    conf = {"table": "events", "site": "edge", "mode": "auto"}

    run = dag.test(logical_date=pendulum.now("UTC"), run_conf=conf)
    assert str(run.state) == "failed" and ti_states(run)[("bootstrap", -1)] == "failed"
    assert _states(env, 3) == before and stray.exists()  # refused: nothing changed, nothing copied

    stray.unlink()
    run = dag.test(logical_date=pendulum.now("UTC"), run_conf=conf)
    assert str(run.state) == "success", ti_states(run)
    assert set(_states(env, 3)) == {"LIVE"}  # JOIN_FINALIZE after the catch-up rounds
    write_batch(env.catalog, "events", events_batch(list(range(85, 95)), "c"))  # writes go on; rounds deliver
    run_round(env.catalog, env.defs, "events", submit=_no_spark)
    assert read_sorted(env, "edge").equals(read_sorted(env))


@pytest.mark.spark
@pytest.mark.parametrize("engine", ["spark", "auto"])
def test_maintenance_dag_compacts_and_collects(segrep_env: Any, engine: str) -> None:
    """`merge_engine: spark`: the fold runs as the `compact` SparkSubmit task; `auto`: this small fold runs in
    the branch task itself and `compact` is skipped. The same major either way."""
    import pendulum

    env = segrep_env({**POLICY, "merge_engine": engine})
    for keys, tag in ((range(0, 50), "a"), (range(30, 80), "b"), (range(60, 100), "c")):
        write_batch(env.catalog, "events", events_batch(list(keys), tag))
    run_round(env.catalog, env.defs, "events", submit=_no_spark)
    before = read_sorted(env)
    dag = load_dag("segrep_maintain_events")
    run = dag.test(logical_date=pendulum.now("UTC"))
    states = ti_states(run)
    assert str(run.state) == "success", states
    assert states[("compact", -1)] == ("success" if engine == "spark" else "skipped")
    assert states[("gc", -1)] == "success"
    with env.catalog.read() as s:
        leader = s.scalars(select(m.Placement).where(m.Placement.site_id == 1, m.Placement.partition_id > 4)).all()
        roots = [
            s.scalars(select(m.Segment).where(m.Segment.segment_id == pl.root_segment_id)).first()
            for pl in leader
            if pl.root_segment_id
        ]
    assert roots and all(seg.is_major for seg in roots)  # the compacted partition's root is a major
    assert read_sorted(env).equals(before)
    run_round(env.catalog, env.defs, "events", submit=_no_spark)  # replicas take the major by fast-forward
    for site in ("dr", "edge"):
        assert read_sorted(env, site).equals(before)


@pytest.mark.spark
def test_maintenance_dag_continues_an_unfinished_split(segrep_env: Any) -> None:
    """An async split left in UNLOAD (nobody ran its unload) is finished by the next maintenance run."""
    import pendulum

    from segrep.replication.unload import finish_unloaded
    from segrep.split.progress import split_progress
    from segrep.split.workflow import start_split

    env = segrep_env(POLICY)
    write_batch(env.catalog, "events", events_batch(list(range(0, 60)), "a"))
    run_round(env.catalog, env.defs, "events", submit=_no_spark)
    before = read_sorted(env)
    start_split(env.catalog, "events", 5, ["a1"], is_async=True)
    assert [r.state for r in split_progress(env.catalog, "events")] == ["UNLOAD"]
    run = load_dag("segrep_maintain_events").test(logical_date=pendulum.now("UTC"))
    assert str(run.state) == "success" and ti_states(run)[("continue_splits", -1)] == "success"
    (progress,) = split_progress(env.catalog, "events")  # unloaded: only the replicas lack the children
    assert progress.state == "UNLOAD" and all(c.lacking == 0 for c in progress.children) and progress.replicas_behind
    assert read_sorted(env).equals(before) and read_sorted(env, "dr").equals(before)
    run_round(env.catalog, env.defs, "events", submit=_no_spark)
    finish_unloaded(env.catalog, env.defs, "events")  # as the replication DAG's commit task does
    assert split_progress(env.catalog, "events") == []  # finished: UNLOAD_FINAL
    assert read_sorted(env, "dr").equals(before)


VERIFY_POLICY = {**POLICY, "verify_schedule": "30 3 * * *", "verify_spark_threshold_bytes": 1}


def test_verify_dag_runs_on_the_policys_verify_schedule(segrep_env: Any) -> None:
    from airflow.sdk import CronDataIntervalTimetable

    segrep_env(VERIFY_POLICY)
    dag = load_dag("segrep_verify_events")
    assert dag.task_ids == ["verify"] and dag.catchup is False and dag.max_active_runs == 1
    assert isinstance(dag.timetable, CronDataIntervalTimetable) and dag.timetable.expression == "30 3 * * *"
    assert {k: dag.params[k] for k in dag.params} == {"files": True, "max_bytes_per_second": None}
    assert set(dag.tags) == {"segrep", "verify", "events"}


@pytest.mark.spark
def test_verify_dag_passes_when_clean_and_fails_naming_a_planted_difference(
    segrep_env: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both runs digest on Spark (the threshold is one byte) through the `spark_default` connection; the
    outcome is recorded by verify itself, where `segrep status` reads it."""
    import pendulum

    from segrep.catalog.verifications import last_verifications
    from tests.support.damage import change_payload, copy_holding, rewrite_segment

    env = segrep_env(VERIFY_POLICY)
    for keys, tag in ((range(0, 60), "a"), (range(40, 90), "b")):
        write_batch(env.catalog, "events", events_batch(list(keys), tag))
    run_round(env.catalog, env.defs, "events", submit=_no_spark)
    dag = load_dag("segrep_verify_events")

    run = dag.test(logical_date=pendulum.now("UTC"))
    assert str(run.state) == "success", ti_states(run)
    with env.catalog.read() as s:
        states = {v.site: (v.kind, v.outcome) for v in last_verifications(s, "events")}
    assert states == {"dr": ("rows+files", "equal"), "edge": ("rows+files", "equal"), "primary": ("files", "equal")}
    assert "digested on Spark, one application" in capsys.readouterr().out

    target = copy_holding(env, "edge", 10)  # written once (the second batch starts at 40)
    rewrite_segment(env, target, change_payload(10, "tampered"))
    run = dag.test(logical_date=pendulum.now("UTC"), run_conf={"max_bytes_per_second": 0})
    assert str(run.state) == "failed" and ti_states(run)[("verify", -1)] == "failed"
    out = capsys.readouterr()
    # the key differs, and the scrub sees the copy's catalog row diverge from the leader's row for that segment
    named = (f"partition {target.partition_id} at edge: different (1 key(s)); divergent ", str(target.path))
    assert any(
        "verify of events: 2 difference(s): " in line and all(n in line for n in named)
        for line in (out.out + out.err).splitlines()
    )
    with env.catalog.read() as s:
        states = {v.site: (v.outcome, v.differences) for v in last_verifications(s, "events")}
    assert states == {"dr": ("equal", 0), "edge": ("different", 2), "primary": ("equal", 0)}
