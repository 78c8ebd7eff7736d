"""A link's Airflow pool holds its copy tasks, through Airflow's own scheduler (issue 36, DESIGN section 17).

Two tables replicate primary -> dr over a link with ``max_concurrent_copies: 1``. The pools come from
``segrep airflow-pools --json`` through ``airflow pools import``, as ``make airflow`` loads them. One run of
each table's replication DAG (the big path: a copy task per target) is queued before a real scheduler
(LocalExecutor) and an execution-API server start, so both copies to dr become ready together: the pool's one
slot lets one run while the other waits, and their start and end times never overlap. The copies to edge
cross no pooled link and run in ``default_pool``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.airflow import EVENTS_DAG, events_batch, events_yaml, ti_states
from tests.support.airflow_services import Services
from tests.support.cli import cli
from tests.support.tables import orders

POOL = "segrep_link_primary_dr"
ORDERS_DAG = "segrep_replicate_orders"
RUN_TIMEOUT_S = 420  # both runs, from the scheduler's start, on a busy machine with 2 cores
BIG_PATH = {"one_task_round_max_bytes": 0, "retries": 0, "retry_delay_s": 0}  # a copy task per target


def _definitions() -> str:
    doc: dict[str, Any] = yaml.safe_load(events_yaml(BIG_PATH))
    doc["tables"]["orders"]["policy"] = dict(BIG_PATH)
    doc["links"] = [
        # paced, so that a copy lasts long enough for the other to be ready meanwhile
        {"from": "primary", "to": "dr", "max_bytes_per_second": "200KB", "max_concurrent_copies": 1},
    ]
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.mark.slow
def test_two_copies_over_a_one_slot_link_never_overlap(segrep_env: Any, services: Services, tmp_path: Path) -> None:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from segrep.data.writer import write_batch

    env = segrep_env(yaml_text=_definitions())
    write_batch(env.catalog, "events", events_batch(list(range(3000)), "a"))
    write_batch(env.catalog, "orders", orders(list(range(1, 3001))))
    services.start_api_server()  # starts up while the pools and the runs are made

    code, out, err = cli(env, "airflow-pools", "--json")
    assert code == 0, err
    pools = tmp_path / "pools.json"
    pools.write_text(out)
    assert "Uploaded 1 pool(s)" in services.cli("pools", "import", str(pools))
    assert POOL in services.cli("pools", "list")
    services.cli("dags", "reserialize")
    with create_session() as session:  # runs other tests of this worker left in its Airflow database
        earlier = set(session.scalars(select(DagRun.run_id)))
    for dag_id in (EVENTS_DAG, ORDERS_DAG):
        services.cli("dags", "unpause", dag_id)
        services.cli("dags", "trigger", dag_id)
    services.wait_api_healthy()
    services.start("scheduler", "scheduler")

    started = time.time()
    runs: dict[str, Any] = {}
    while time.time() < started + RUN_TIMEOUT_S:
        with create_session() as session:
            new = [r for r in session.scalars(select(DagRun)) if r.run_id not in earlier]
            done = {r.dag_id: r for r in new if str(r.state) in ("success", "failed")}
            if len(done) == 2:
                runs = {d: (str(r.state), ti_states(r), r.get_task_instances()) for d, r in done.items()}
                break
        assert services.procs["scheduler"].poll() is None, services.tail("scheduler")
        time.sleep(1)
    if not runs:
        pytest.fail(f"both runs not finished in {RUN_TIMEOUT_S} s:\n{services.tail('scheduler')}")
    print(f"both runs finished {time.time() - started:.1f} s after the scheduler started")

    for dag_id, (state, states, _tis) in runs.items():
        assert state == "success", (dag_id, states)
        assert states[("report", -1)] == states[("copies_done", -1)] == "success", (dag_id, states)
    copies = {d: next(ti for ti in tis if ti.task_id == "fast_forward_dr") for d, (_s, _st, tis) in runs.items()}
    assert {ti.pool for ti in copies.values()} == {POOL}
    edge = next(ti for ti in runs[EVENTS_DAG][2] if ti.task_id == "fast_forward_edge")
    assert edge.pool == "default_pool" and str(edge.state) == "success"
    first, second = sorted(copies.values(), key=lambda ti: ti.start_date)
    spans = {ti.dag_id: (ti.start_date.isoformat(), ti.end_date.isoformat()) for ti in (first, second)}
    print(f"copies to dr: {spans}")
    assert first.end_date <= second.start_date, f"two copies over a one-slot link overlapped: {spans}"
    # the second was ready while the first ran: the pool, not the timing, kept them apart
    assert second.scheduled_dttm is not None and second.scheduled_dttm < first.end_date, (
        second.scheduled_dttm,
        spans,
    )
