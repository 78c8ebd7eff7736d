"""Rounds on write (DESIGN section 15): `schedule: on_write` schedules a table's replication DAG on its writes
asset or a slow fallback interval, and a committed write triggers a run.

The DAG's schedule is read from the DagBag as the integrity tests read it; the end-to-end test runs Airflow's
own api-server (public REST API, simple auth manager, a user with the `op` role) and scheduler as
subprocesses: ``segrep write`` posts the asset event through the REST API, the scheduler creates an
asset-triggered run of ``segrep_replicate_events``, which replicates the write to every replica site.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from segrep.config.policy import Policy
from segrep.data import airflow_api, write_events
from tests.support.airflow import EVENTS_DAG, events_batch, load_dagbag, read_sorted, ti_states
from tests.support.airflow_services import Services
from tests.support.cli import cli

RUN_TIMEOUT_S = 300  # a ceiling: write to finished run took 135 s at a load of 23 on 2 cores


def test_an_on_write_table_is_scheduled_on_its_writes_or_the_fallback(segrep_env: Any) -> None:
    from airflow.sdk import AssetOrTimeSchedule, CronDataIntervalTimetable, DeltaDataIntervalTimetable

    from segrep_airflow.assets import replica_asset, writes_asset

    segrep_env({"schedule": "on_write", "min_interval": "30s", "rpo": "4m"})
    bag = load_dagbag()
    dag = bag.get_dag(EVENTS_DAG)

    assert isinstance(dag.timetable, AssetOrTimeSchedule)
    assert dag.timetable.asset_condition == writes_asset("events")
    assert writes_asset("events").uri == write_events.writes_uri("events") == "segrep-writes://events/"
    assert writes_asset("events").uri != replica_asset("writes", "events").uri  # a site named "writes"
    fallback = dag.timetable.timetable
    assert isinstance(fallback, DeltaDataIntervalTimetable) and fallback.delta == timedelta(minutes=2)  # rpo/2
    assert dag.max_active_runs == 1 and not dag.catchup  # events of a burst fold into the next run

    orders = bag.get_dag("segrep_replicate_orders")  # the default schedule stays a cron timetable
    assert isinstance(orders.timetable, CronDataIntervalTimetable) and orders.timetable.expression == "0 * * * *"
    assert isinstance(bag.get_dag("segrep_maintain_events").timetable, CronDataIntervalTimetable)


def test_only_asset_triggered_runs_are_spaced() -> None:
    from airflow.utils.types import DagRunType

    from segrep_airflow.schedules import spacing_s

    on_write = Policy(schedule="on_write", min_interval_s=30)
    assert spacing_s(on_write, DagRunType.ASSET_TRIGGERED) == 30
    assert spacing_s(on_write, "asset_triggered") == 30
    for other in (DagRunType.MANUAL, DagRunType.SCHEDULED, DagRunType.BACKFILL_JOB):
        assert spacing_s(on_write, other) == 0
    assert spacing_s(Policy(), DagRunType.ASSET_TRIGGERED) == 0


def test_an_asset_triggered_round_ends_when_it_plans() -> None:
    """After its spacing wait the round covers every write committed until it plans: its end is now (None),
    not the events' interval; a manual run ends when triggered, a scheduled one at its interval's end."""
    from datetime import UTC, datetime

    from airflow.utils.types import DagRunType

    from segrep_airflow.rounds import round_end

    after, end = datetime(2026, 11, 28, 7, 0, tzinfo=UTC), datetime(2026, 11, 28, 6, 55, tzinfo=UTC)
    assert round_end(DagRunType.ASSET_TRIGGERED, after, end) is None
    assert round_end(DagRunType.MANUAL, after, end) == after
    assert round_end(DagRunType.SCHEDULED, after, end) == end


def test_a_writer_inside_a_task_emits_the_same_event_as_its_outlet(segrep_env: Any) -> None:
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from segrep.data.writer import write_batch, write_event_extra
    from segrep_airflow.assets import emit_write, writes_asset

    env = segrep_env({"schedule": "on_write"}, tables=("events",))
    outlet_events = OutletEventAccessors()
    result = write_batch(env.catalog, "events", events_batch([1, 2, 3], "a"))  # no defs: no REST call

    extra = emit_write(outlet_events, result)

    assert result.event is None
    assert extra == write_event_extra(result) and outlet_events[writes_asset("events")].extra == extra
    assert emit_write(outlet_events, write_batch(env.catalog, "events", events_batch([], "a"))) is None


@pytest.mark.slow
def test_a_write_triggers_a_run_through_the_real_scheduler(
    segrep_env: Any, services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """segrep write -> REST asset event -> asset-triggered run -> every replica holds the write."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    start = datetime.now(UTC).replace(microsecond=0)  # the 5-minute fallback's first run is after the test
    env = segrep_env({"schedule": "on_write", "start_date": start.isoformat()}, tables=("events",))
    password = "op-pw-e2e-5"
    passwords = tmp_path / "passwords.json"
    passwords.write_text(json.dumps({"writer": password}))
    services.extra_env.update(
        {
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "writer:op",  # POST asset events needs op
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "True",  # asset-triggered runs are created there
        }
    )
    services.start_api_server(apps="all")  # starts up while the DAGs are registered
    services.cli("dags", "reserialize")  # the DAGs and their assets in Airflow's database
    services.cli("dags", "unpause", EVENTS_DAG)
    services.wait_api_healthy()
    services.start("scheduler", "scheduler")
    with create_session() as session:  # runs other tests of this worker left in its Airflow database
        earlier = set(session.scalars(select(DagRun.run_id).where(DagRun.dag_id == EVENTS_DAG)))

    monkeypatch.setenv(airflow_api.URL_ENV, f"http://127.0.0.1:{services.api_port}")
    monkeypatch.setenv(airflow_api.USER_ENV, "writer")
    monkeypatch.setenv(airflow_api.PASSWORD_ENV, password)
    monkeypatch.setenv(airflow_api.TIMEOUT_ENV, "60")  # a fresh api-server on a busy machine: seconds per call
    batch_file = tmp_path / "batch.parquet"
    pq.write_table(events_batch(list(range(40)), "a"), batch_file)
    started = time.time()
    code, out, err = cli(env, "write", "events", str(batch_file))
    assert code == 0 and "segrep: warning" not in err, out + err
    assert "asset event " in out and " on segrep-writes://events/ sent to http://127.0.0.1:" in out, out

    run = None
    while time.time() < started + RUN_TIMEOUT_S:
        with create_session() as session:
            runs = [
                r for r in session.scalars(select(DagRun).where(DagRun.dag_id == EVENTS_DAG)) if r.run_id not in earlier
            ]
            done = [r for r in runs if str(r.state) in ("success", "failed")]
            if done:
                run = done[0]
                consumed = [e.extra for e in run.consumed_asset_events]
                states = ti_states(run)
                kinds = {str(r.run_type) for r in runs}
                break
        assert services.procs["scheduler"].poll() is None, services.tail("scheduler")
        time.sleep(1)
    if run is None:
        pytest.fail(f"no run of {EVENTS_DAG} finished in {RUN_TIMEOUT_S} s:\n{services.tail('scheduler')}")
    print(f"write to finished run: {time.time() - started:.1f} s")

    assert kinds == {"asset_triggered"}, kinds  # no fallback run: its first interval ends after the test
    assert str(run.state) == "success", states
    assert len(consumed) == 1 and consumed[0]["table"] == "events" and consumed[0]["rows_written"] == 40
    assert consumed[0]["from_rest_api"] is True
    leader = read_sorted(env)
    assert leader.num_rows == 40
    for site in ("dr", "edge"):
        assert read_sorted(env, site).equals(leader), f"{site} differs from the leader"
