"""Issue 14's end-to-end run on PostgreSQL (item 7) through the `segrep_failover` DAG (``dag.test``): the story
of tests/failover/test_tpch_failover.py, with the dry run, the failover and the switchover back triggered
from the DAG's form instead of the command line.

TPC-H `orders` (scale 0.01, three partitions) led by `primary`, replicated to `dr` and `edge`; writes
`primary` alone holds when it goes away; the dry run names exactly their rows and moves nothing; the failover
to `dr` moves every leader while `primary` is down; writes at `dr` reach `edge`; `primary` returns with its
unreplicated rows in rollback files (exactly those rows, against a replay of those batches alone); the
switchover back to `primary` loses nothing; every site reads the replay of the writes that were kept. Rounds
run with the default submit (the real spark-submit, if a merge were planned: with `on_return: rollback`
none is).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.data import demo as demo_data
from segrep.data.reader import read_table
from segrep.replication.orchestrator import run_round
from segrep.replication.rollback import list_rollbacks
from tests.support.airflow import load_dag, postgres_dag_env, ti_states
from tests.support.checks import leaders
from tests.support.env import Env
from tests.support.rounds import bring_up, take_down
from tests.support.tpch_failover import (
    AFTER,
    AT_DR,
    KEPT,
    KEY,
    REPLICATED,
    TABLE,
    UNREPLICATED,
    check_rollback_files,
    definitions,
    leader_sites,
    tpch_orders_batches,
    write,
)

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.postgres]

SITES = ("primary", "dr", "edge")


@pytest.fixture
def pg_dag_env(airflow_home: Path, pg_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    """The definitions and a migrated, applied catalog in a fresh PostgreSQL schema, exported for the DAG file
    and its tasks as SEGREP_CONFIG / SEGREP_CATALOG_URL (tests/dags/conftest.py's segrep_env, on PostgreSQL)."""
    yield from postgres_dag_env(pg_server, tmp_path, monkeypatch, definitions())


def _run(dag: Any, conf: dict[str, Any]) -> Any:
    import pendulum

    return dag.test(logical_date=pendulum.now("UTC"), run_conf=conf)


def _xcom(dag_run: Any, task_id: str) -> Any:
    (ti,) = [ti for ti in dag_run.get_task_instances() if ti.task_id == task_id]
    return ti.xcom_pull(task_ids=task_id)


def _round(env: Env) -> Any:
    return run_round(env.catalog, env.defs, TABLE)  # the default submit: spark-submit, were a merge planned


def _assert_sites_equal_replay(
    env: Env, batches: list[demo_data.Batch], numbers: list[int], sites: tuple[str, ...]
) -> None:
    expected = demo_data.expected_rows([batches[n] for n in numbers], KEY)
    for site in sites:
        assert demo_data.compare(read_table(env.catalog, TABLE, site), expected, KEY) == [], site


def test_tpch_orders_failover_rollback_and_switchover_back_through_the_dag(
    pg_dag_env: Env, tmp_path_factory: pytest.TempPathFactory
) -> None:
    env = pg_dag_env
    batches = tpch_orders_batches(tmp_path_factory.mktemp("tpch") / "sf0.01")
    write(env, batches, REPLICATED)
    first = _round(env)
    assert first.status == "ok" and {t.status for t in first.targets.values()} == {"ok"}, first
    _assert_sites_equal_replay(env, batches, REPLICATED, ("dr", "edge"))

    lost = write(env, batches, UNREPLICATED)  # at primary only
    lost_rows = sum(batches[n].rows.num_rows for n in UNREPLICATED)
    before = leaders(env.catalog, TABLE)
    aside = take_down(env, "primary")
    dag = load_dag("segrep_failover")

    # The dry run (the form's default): the loss, exactly the unreplicated rows; nothing moves.
    dry = _run(dag, {"tables": [TABLE]})
    states = ti_states(dry)
    assert str(dry.state) == "success", states
    assert {states[(t, -1)] for t in ("failover", "switchover", "verify")} == {"skipped"}, states
    plan = _xcom(dry, "assess")
    assert plan["site"] == "dr" and plan["dry_run"] is True, plan
    (move,) = plan["assessment"]["moves"]
    assert move["failover_id"] is None and move["assessment"]["from_site"] == "primary"
    loss = move["assessment"]["loss"]
    assert sum(x["rows"] for x in loss) == lost_rows
    assert sorted(sid for x in loss for sid in x["segment_ids"]) == sorted(seg.segment_id for seg in lost)
    assert leaders(env.catalog, TABLE) == before

    # The failover to dr while primary is down; verify's round replicates from dr (primary's target fails).
    moved = _run(dag, {"tables": [TABLE], "site": "dr", "dry_run": False})
    states = ti_states(moved)
    assert str(moved.state) == "success", states
    assert states[("failover", -1)] == "success" and states[("switchover", -1)] == "skipped", states
    assert states[("verify", -1)] == "success", states
    done = _xcom(moved, "failover")
    (move,) = done["moves"]
    failover_id = move["failover_id"]
    assert failover_id is not None and move["partitions_moved"] == len(before)
    assert sum(x["rows"] for x in move["assessment"]["loss"]) == lost_rows
    (line,) = _xcom(moved, "verify")  # read at dr: the replicated rows only, the unreplicated ones given up
    rows_at_dr = len(demo_data.expected_rows([batches[n] for n in REPLICATED], KEY))
    assert line.startswith(f"{TABLE}: {rows_at_dr:,} rows at dr; round "), line
    after = leaders(env.catalog, TABLE)
    assert after == {pid: ("dr", epoch + 1) for pid, (_site, epoch) in before.items()}

    # Writes at dr reach edge; primary's target still fails.
    at_dr = write(env, batches, AT_DR)
    assert {seg.site for seg in at_dr} == {"dr"}
    down = _round(env)
    assert down.targets["primary"].status == "down" and down.targets["edge"].status == "ok", down
    _assert_sites_equal_replay(env, batches, REPLICATED + AT_DR, ("dr", "edge"))

    # primary is back: rollback files with exactly the unreplicated rows, then it follows dr again.
    bring_up(env, "primary", aside)
    back = _round(env)
    assert back.targets["primary"].status == "ok" and back.merges.items == 0, back
    assert back.targets["primary"].segments_copied == len(at_dr)  # incremental: no bootstrap
    _round(env)
    files = [f.to_dict() for f in list_rollbacks(env.catalog, TABLE)]
    assert sum(f["rows"] for f in files) == lost_rows, files
    with env.catalog.read() as s:
        primary_id = s.scalars(select(m.Site.site_id).where(m.Site.name == "primary")).one()
    check_rollback_files(env, batches, files, failover_id, primary_id)
    _assert_sites_equal_replay(env, batches, REPLICATED + AT_DR, SITES)

    # The switchover back to primary, from the DAG: RPO 0.
    switched = _run(dag, {"tables": [TABLE], "site": "primary", "action": "switchover", "dry_run": False})
    states = ti_states(switched)
    assert str(switched.state) == "success", states
    assert states[("switchover", -1)] == "success" and states[("failover", -1)] == "skipped", states
    assert states[("verify", -1)] == "success", states
    (move,) = _xcom(switched, "switchover")["moves"]
    assert move["assessment"]["loss"] == [] and move["partitions_moved"] == len(before)
    (line,) = _xcom(switched, "verify")
    rows_now = len(demo_data.expected_rows([batches[n] for n in REPLICATED + AT_DR], KEY))
    assert line == f"{TABLE}: {rows_now:,} rows at primary; round ok, failed: none", line
    assert leader_sites(env) == {"primary"}
    assert all(epoch == after[pid][1] + 1 for pid, (_site, epoch) in leaders(env.catalog, TABLE).items())
    with env.catalog.read() as s:
        kinds = s.scalars(select(m.Failover.kind).order_by(m.Failover.done_us)).all()
    assert kinds == ["failover", "switchover"]

    write(env, batches, AFTER)
    for _ in range(2):
        assert _round(env).status == "ok"
    _assert_sites_equal_replay(env, batches, KEPT, SITES)
    expected = demo_data.expected_rows([batches[n] for n in KEPT], KEY)
    assert demo_data.compare(read_table(env.catalog, TABLE), expected, KEY) == []  # at the leaders
    assert [f.to_dict() for f in list_rollbacks(env.catalog, TABLE)] == files  # kept until dropped
