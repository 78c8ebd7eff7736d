"""The split DAG of a table (``segrep_split_<table>``) through ``dag.test`` with a real spark-submit: its form,
a refused request, a sync split whose rewrite runs on Spark, and an async split; the children then replicate to
every site, and every site reads what an independent replay of the writes says (issue 5)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.data.writer import write_batch
from segrep.replication.orchestrator import run_round
from tests.support.airflow import (
    EVENTS_DAG,
    Batches,
    events_batch,
    load_dag,
    read_sorted,
    replay_rows,
    rows_of,
    ti_states,
)

POLICY = {"schedule": "5m", "start_date": "2026-11-01", "retries": 0, "merge_engine": "spark"}
PARENT = 5  # events [-inf, m): tenants a0, a1, a2
SPLIT_DAG = "segrep_split_events"
SITES = ("primary", "dr", "edge")


def _no_spark(*_a: Any, **_k: Any) -> None:
    raise AssertionError("no Spark application expected")


def _partition_states(env: Any) -> dict[int, str]:
    with env.catalog.read() as s:
        return {pid: state for pid, state in s.execute(select(m.Partition.partition_id, m.Partition.state))}


def test_split_dag_form_and_structure(segrep_env: Any) -> None:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from tests.support.airflow import load_dagbag

    segrep_env(POLICY)
    bag = load_dagbag()
    assert sorted(d for d in bag.dag_ids if d.startswith("segrep_split")) == [
        "segrep_split_events",
        "segrep_split_orders",
    ]
    dag = bag.dags[SPLIT_DAG]  # one DAG per table: the table's policy drives its Spark steps
    assert dag.schedule is None and dag.max_active_runs == 1 and "UNLOAD_FINAL" in dag.doc_md
    assert set(dag.params.keys()) == {"partition", "split_keys", "async"}
    assert set(dag.tags) == {"segrep", "split", "events"}
    assert dag.params.get_param("split_keys").schema["type"] == "array"
    assert dag.params.get_param("partition").schema["minimum"] == 1
    for task_id in ("copy_rewrite", "unload_merge"):
        spark = dag.get_task(task_id)
        assert isinstance(spark, SparkSubmitOperator)
        assert spark.retries == POLICY["retries"] == 0  # the table's policy, not the defaults (3)
    assert bag.dags["segrep_split_orders"].get_task("copy_rewrite").retries == 3  # orders sets no policy
    assert dag.get_task("finalize").upstream_task_ids == {"start", "copy_plan", "copy_commit"}
    assert dag.get_task("finish").upstream_task_ids == {"start", "unload_commit"}
    groups = dag.task_group.get_task_group_dict()
    assert set(groups["copy_step"].children) == {"copy_choose", "copy_rewrite", "copy_commit"}
    assert set(groups["unload_step"].children) == {"unload_choose", "unload_merge", "unload_commit"}


@pytest.mark.spark
def test_split_dag_sync_then_async(segrep_env: Any) -> None:
    import pendulum

    env = segrep_env(POLICY)
    written: Batches = [(range(0, 60), "a"), (range(30, 90), "b")]
    for keys, tag in written:
        write_batch(env.catalog, "events", events_batch(list(keys), tag))
    run_round(env.catalog, env.defs, "events", submit=_no_spark)
    before = read_sorted(env)
    assert rows_of(before) == replay_rows(written)
    dag = load_dag(SPLIT_DAG)

    bad = dag.test(logical_date=pendulum.now("UTC"), run_conf={"partition": PARENT, "split_keys": ["zz"]})
    assert str(bad.state) == "failed" and ti_states(bad)[("start", -1)] == "failed"
    assert _partition_states(env)[PARENT] == "LIVE"  # refused: nothing changed

    run = dag.test(logical_date=pendulum.now("UTC"), run_conf={"partition": PARENT, "split_keys": ["a1"]})
    states = ti_states(run)
    assert str(run.state) == "success", states
    assert states[("copy_rewrite", -1)] == "success" and states[("unload_merge", -1)] == "skipped"
    parts = _partition_states(env)  # the parent stays until a round carried the children to dr and edge
    assert parts[PARENT] == "UNLOAD" and sorted(parts)[-2:] == [7, 8] and parts[7] == parts[8] == "LIVE"
    for site in (None, "dr", "edge"):  # meanwhile they read it from their parent placements
        assert read_sorted(env, site).equals(before), site
    replication = load_dag(EVENTS_DAG).test(logical_date=pendulum.now("UTC"))  # its commit task retires it
    assert str(replication.state) == "success", ti_states(replication)
    assert _partition_states(env)[PARENT] == "UNLOAD_FINAL"
    assert read_sorted(env).equals(before)
    assert rows_of(read_sorted(env)) == replay_rows(written)

    written.append((range(80, 100), "c"))  # into the children
    write_batch(env.catalog, "events", events_batch(list(written[-1][0]), written[-1][1]))
    run = dag.test(logical_date=pendulum.now("UTC"), run_conf={"partition": 8, "split_keys": ["a2"], "async": True})
    states = ti_states(run)
    assert str(run.state) == "success", states
    assert states[("copy_rewrite", -1)] == "skipped" and states[("unload_merge", -1)] == "success"
    expected = read_sorted(env)
    assert expected.num_rows == 100
    for _ in range(2):
        run_round(env.catalog, env.defs, "events", submit=_no_spark)
    for site in ("dr", "edge"):
        assert read_sorted(env, site).equals(expected), site
    replay = replay_rows(written)  # not the leader's read: an independent replay of every write
    assert len(replay) == 100
    for site in SITES:
        got = rows_of(read_sorted(env, site))
        wrong = sorted(k for k in got.keys() | replay.keys() if got.get(k) != replay.get(k))
        assert not wrong, f"{site} differs from the replay of the writes in {len(wrong)} keys, e.g. {wrong[:3]}"
