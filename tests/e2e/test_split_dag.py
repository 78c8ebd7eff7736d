"""The split DAG through ``dag.test`` with a real spark-submit: its form, a refused request, a sync split whose
rewrite runs on Spark, and an async split; the children then replicate to every site (issue 5)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.data.writer import write_batch
from segrep.replication.run import run_round
from tests.e2e.conftest import events_batch, load_dag, read_sorted, ti_states

POLICY = {"schedule": "5m", "start_date": "2026-11-01", "retries": 0}
PARENT = 5  # events [-inf, m): tenants a0, a1, a2


def _no_spark(*_a: Any, **_k: Any) -> None:
    raise AssertionError("no Spark application expected")


def _partition_states(env: Any) -> dict[int, str]:
    with env.catalog.read() as s:
        return {pid: state for pid, state in s.execute(select(m.Partition.partition_id, m.Partition.state))}


def test_split_dag_form_and_structure(segrep_env: Any) -> None:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    segrep_env(POLICY)
    dag = load_dag("segrep_split")
    assert dag.schedule is None and dag.max_active_runs == 1 and "UNLOAD_FINAL" in dag.doc_md
    assert set(dag.params.keys()) == {"table", "partition", "split_keys", "async"}
    assert dag.params.get_param("table").schema["enum"] == ["events", "orders"]
    assert dag.params.get_param("split_keys").schema["type"] == "array"
    assert dag.params.get_param("partition").schema["minimum"] == 1
    for task_id in ("copy_rewrite", "unload_merge"):
        assert isinstance(dag.get_task(task_id), SparkSubmitOperator)
    assert dag.get_task("finalize").upstream_task_ids == {"start", "copy_plan", "copy_commit"}
    assert dag.get_task("finish").upstream_task_ids == {"start", "unload_commit"}


@pytest.mark.spark
def test_split_dag_sync_then_async(segrep_env: Any) -> None:
    import pendulum

    env = segrep_env(POLICY)
    for keys, tag in ((range(0, 60), "a"), (range(30, 90), "b")):
        write_batch(env.catalog, "events", events_batch(list(keys), tag))
    run_round(env.catalog, env.defs, "events", submit=_no_spark)
    before = read_sorted(env)
    dag = load_dag("segrep_split")

    bad = dag.test(logical_date=pendulum.now("UTC"),
                   run_conf={"table": "events", "partition": PARENT, "split_keys": ["zz"]})  # fmt: skip
    assert str(bad.state) == "failed" and ti_states(bad)[("start", -1)] == "failed"
    assert _partition_states(env)[PARENT] == "LIVE"  # refused: nothing changed

    run = dag.test(logical_date=pendulum.now("UTC"),
                   run_conf={"table": "events", "partition": PARENT, "split_keys": ["a1"]})  # fmt: skip
    states = ti_states(run)
    assert str(run.state) == "success", states
    assert states[("copy_rewrite", -1)] == "success" and states[("unload_merge", -1)] == "skipped"
    parts = _partition_states(env)
    assert parts[PARENT] == "UNLOAD_FINAL" and sorted(parts)[-2:] == [7, 8] and parts[7] == parts[8] == "LIVE"
    assert read_sorted(env).equals(before)

    write_batch(env.catalog, "events", events_batch(list(range(80, 100)), "c"))  # into the children
    run = dag.test(logical_date=pendulum.now("UTC"),
                   run_conf={"table": "events", "partition": 8, "split_keys": ["a2"], "async": True})  # fmt: skip
    states = ti_states(run)
    assert str(run.state) == "success", states
    assert states[("copy_rewrite", -1)] == "skipped" and states[("unload_merge", -1)] == "success"
    expected = read_sorted(env)
    assert expected.num_rows == 100
    for _ in range(2):
        run_round(env.catalog, env.defs, "events", submit=_no_spark)
    for site in ("dr", "edge"):
        assert read_sorted(env, site).equals(expected), site
