"""What an operator sees of a replication run (issue 16 items 2-6), through ``dag.test`` on real catalogs:

- the report task's own log lines (ISO times, human sizes, one line per target, what is still pending) and
  its XCom of machine values;
- a target behind the table's RPO fails the report task naming the table, site and lag, and the round's
  metrics (rpo_breaches among them) reach a StatsD listener on loopback through Airflow's metrics settings;
- a run emits an asset event per advanced site, and the scheduler's asset step queues the example consumer;
- "Clear only failed tasks" after an outage: the report re-reads the catalog instead of the old commit XCom;
- a failed plan leaves ``choose`` skipped (no TypeError) and the report names the plan.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from segrep_airflow.rounds import VIEW_KEY
from tests.support.airflow import (
    AIRFLOW,
    EVENTS_DAG,
    events_batch,
    load_dag,
    load_dagbag,
    rounds,
    ti_states,
)

POLICY = {"schedule": "5m", "start_date": "2026-11-01", "retries": 0, "retry_delay_s": 0}
CONSUMER = "segrep_example_fresh_replica"


def _ti(run: Any, task_id: str, map_index: int = -1) -> Any:
    return next(ti for ti in run.get_task_instances() if ti.task_id == task_id and ti.map_index == map_index)


@pytest.fixture
def statsd_listener(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A UDP socket on loopback, and Airflow's metrics pointed at it the way a deployment does it
    (``AIRFLOW__METRICS__*``), then the metrics facade initialised as the task runner initialises it."""
    from airflow.sdk._shared.observability.metrics import stats
    from airflow.sdk.observability.metrics import stats_utils

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_HOST", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PORT", str(sock.getsockname()[1]))
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PREFIX", "airflow")
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
    try:
        yield sock
    finally:
        sock.close()
        monkeypatch.undo()
        stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=True)


def _received(sock: socket.socket) -> dict[str, str]:
    """Every StatsD line received so far: name -> 'value|type' (the last one per name)."""
    out: dict[str, str] = {}
    deadline = time.time() + 2
    while time.time() < deadline:
        try:
            data = sock.recv(65535)
        except TimeoutError:
            if out:
                break
            continue
        for line in data.decode().splitlines():
            name, _, value = line.partition(":")
            out[name] = value
    return out


def test_a_target_behind_its_rpo_fails_the_report_and_the_metrics_reach_statsd(
    segrep_env: Any, statsd_listener: socket.socket, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run whose round ended 20 minutes ago (an interval run executed late) leaves both targets 20 min
    behind: with `rpo: 15m` the one-task round fails naming table, site and lag."""
    import pendulum

    from segrep.data.writer import write_batch

    env = segrep_env({**POLICY, "rpo": "15m"}, tables=("events",))
    write_batch(env.catalog, "events", events_batch(list(range(30)), "a"))
    end = pendulum.now("UTC") - timedelta(minutes=20)  # nothing was written before it: nothing to copy
    dag = load_dag(EVENTS_DAG)
    capsys.readouterr()

    run = dag.test(logical_date=end, run_after=end)

    states = ti_states(run)
    assert str(run.state) == "failed", states
    assert states[("round", -1)] == "failed" and states[("done_in_round", -1)] == "upstream_failed", states
    out = capsys.readouterr()
    log = out.out + out.err
    for site in ("dr", "edge"):
        # 20 min and some seconds: the round ends when it plans, a little after the run was made
        assert f"RPO breach: events at {site} is behind its objective of 15 min (lag 2" in log, log[-3000:]
        # the report's own line for the target: ISO safe time, human sizes, pending, the verdict
        line = next(x.split(f"  {site}: ok; ", 1)[1] for x in log.splitlines() if f"  {site}: ok; " in x)
        assert "safe time 20" in line and "Z" in line and "pending 2 segments (" in line and "kB)" in line
        assert "RPO 15 min BREACHED" in line, line
    assert "still pending (committed after" in log

    got = _received(statsd_listener)
    for site in ("dr", "edge"):
        assert got[f"airflow.segrep.rpo_breaches.events.{site}"] == "1|c"
        assert got[f"airflow.segrep.pending_segments.events.{site}"] == "2|g"
        assert float(got[f"airflow.segrep.lag_seconds.events.{site}"].split("|")[0]) >= 20 * 60
        assert got[f"airflow.segrep.bytes_copied.events.{site}"] == "0|c"
    assert int(got["airflow.segrep.pending_bytes.events.dr"].split("|")[0]) > 0
    assert got["airflow.segrep.spark_applications.events"] == "0|c"
    assert got["airflow.segrep.round_duration_seconds.events"].endswith("|ms")


def test_the_report_logs_one_line_per_target_and_returns_machine_values(
    segrep_env: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A manual run ends when it was triggered, so rows written just before are copied; the XCom keeps µs
    and bytes, the log shows ISO and kB."""
    import pendulum

    from segrep.data.writer import write_batch

    env = segrep_env({**POLICY, "schedule": "@hourly"}, tables=("events",))
    write_batch(env.catalog, "events", events_batch(list(range(30)), "a"))
    dag = load_dag(EVENTS_DAG)
    capsys.readouterr()

    run = dag.test(logical_date=pendulum.now("UTC"))  # @hourly: its data interval ended at the last full hour

    assert str(run.state) == "success", ti_states(run)
    value = _ti(run, "round").xcom_pull(task_ids="round", key=VIEW_KEY)  # a small round: one task
    rnd = rounds(env)[-1]
    assert value["end_us"] == rnd.interval_end_us > int(pendulum.now("UTC").start_of("hour").timestamp() * 1e6)
    for site in ("dr", "edge"):
        target = value["targets"][site]
        assert target["segments_copied"] == 2 and target["pending_segments"] == 0 and target["bytes_copied"] > 0
        assert value["safe_time_us"][site] == rnd.interval_end_us - 1
    out = capsys.readouterr()
    marks = (f"round {rnd.round_id} of events", "  dr: ", "  edge: ", "  still pending")
    lines = [x for x in (out.out + out.err).splitlines() if any(m in x for m in marks) and "[segrep.round]" in x]
    assert f"round {rnd.round_id} of events up to 20" in lines[0] and ": ok in " in lines[0]
    assert "  dr: ok; copied 2 segments (" in lines[1] and " kB) from primary " in lines[1]
    assert " kB; safe time 20" in lines[1]
    assert "  edge: ok; copied 2 segments (" in lines[2]
    assert "  still pending: nothing, every target holds every segment of the leaders" in lines[3]


def test_a_run_emits_an_asset_event_per_advanced_site_and_the_consumer_is_triggered(
    segrep_env: Any,
) -> None:
    """segrep_replicate_orders copies to dr: an event on segrep://dr/orders with the safe time and what was
    copied; the scheduler's asset step then creates a run of the example consumer carrying that event."""
    import pendulum
    import pyarrow as pa
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import func, select, update

    from segrep.data.writer import write_batch

    env = segrep_env()
    orders = pa.table(
        {
            "o_orderkey": pa.array([1, 2, 200000], pa.int64()),
            "o_custkey": pa.array([7, 8, 9], pa.int64()),
            "o_orderstatus": ["O", "F", "O"],
            "o_totalprice": pa.array([1, 2, 3], pa.decimal128(15, 2)),
            "o_orderdate": pa.array([0, 1, 2], pa.date32()),
            "o_orderpriority": ["1-URGENT"] * 3,
            "o_clerk": ["Clerk#1"] * 3,
            "o_shippriority": pa.array([0, 0, 0], pa.int32()),
            "o_comment": ["a", "b", "c"],
        }
    )
    write_batch(env.catalog, "orders", orders)
    with create_session() as session:  # the worker's Airflow database is shared: earlier tests' events stay
        seen = session.scalar(select(func.max(AssetEvent.id))) or 0
    bag = load_dagbag()
    producer = bag.get_dag("segrep_replicate_orders")
    producer.test(logical_date=pendulum.now("UTC"))  # registers every DAG of the folder, the consumer too
    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id == CONSUMER).values(is_paused=False))

    run = producer.test(logical_date=pendulum.now("UTC"))  # writes nothing new: dr's safe time still advances

    assert str(run.state) == "success", ti_states(run)
    rnd = rounds(env)[-1]
    with create_session() as session:
        events = session.scalars(
            select(AssetEvent)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetModel.uri == "segrep://dr/orders", AssetEvent.id > seen)
            .order_by(AssetEvent.id)
        ).all()
        assert len(events) == 2, [e.extra for e in events]  # one per run: each advanced dr's safe time
        first, last = events[0].extra, events[-1].extra
        assert first["segments_copied"] == 2 and first["bytes_copied"] > 0
        assert last["round_id"] == rnd.round_id and last["segments_copied"] == 0
        assert last["safe_time_us"] == rnd.interval_end_us - 1
        assert last["safe_time"].startswith(pendulum.from_timestamp(last["safe_time_us"] / 1e6).to_date_string())
        assert {last["table"], last["site"]} == {"orders", "dr"}
        assert last["schema_version"] == 1 and len(last["columns"]) == 9  # the table's current schema
        assert last["columns"][0] == {"id": 1, "name": "o_orderkey", "type": "int64"}
        assert last["columns"][-1] == {"id": 9, "name": "o_comment", "type": "string"}

        _query, triggered = DagModel.dags_needing_dagruns(session)
        assert CONSUMER in triggered
        runner = SchedulerJobRunner(job=Job())
        consumer_model = session.scalars(select(DagModel).where(DagModel.dag_id == CONSUMER)).one()
        runner._create_dag_runs_asset_triggered(dag_models=[consumer_model], session=session)
        session.flush()
        consumer_runs = session.scalars(select(DagRun).where(DagRun.dag_id == CONSUMER)).all()
        assert len(consumer_runs) == 1 and str(consumer_runs[0].run_type) == "asset_triggered"
        consumed = [e.extra for e in consumer_runs[0].consumed_asset_events]
        assert last in consumed


def test_a_replica_event_carries_the_tables_current_schema(segrep_env: Any) -> None:
    """After `segrep apply` adds a column, the events of a round carry version 2 and its columns with their
    field ids (what the DAG's `commit` and `report` tasks emit through the table's alias)."""
    import pyarrow as pa
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from segrep.catalog.apply import apply_definitions
    from segrep.data.writer import write_batch
    from segrep.replication.orchestrator import run_round
    from segrep_airflow.assets import alias, emit, table_schema
    from tests.support.env import ORDERS_YAML
    from tests.support.rounds import no_spark

    env = segrep_env(yaml_text=ORDERS_YAML)
    env.config.write_text(ORDERS_YAML.replace("at: timestamp}", "at: timestamp, note: {type: string, default: n}}"))
    apply_definitions(env.catalog, env.defs)
    write_batch(env.catalog, "events", events_batch([1, 2, 3], "a").append_column("note", pa.array(["x"] * 3)))
    report = run_round(env.catalog, env.defs, "events", submit=no_spark)
    outlet_events = OutletEventAccessors()

    extras = emit(outlet_events, report, report.advanced, table_schema(env.catalog, "events"))

    assert sorted(e["site"] for e in extras) == ["dr", "edge"]
    for extra in extras:
        assert extra["schema_version"] == 2
        assert extra["columns"] == [
            {"id": 1, "name": "tenant", "type": "string"},
            {"id": 2, "name": "seq", "type": "int64"},
            {"id": 3, "name": "payload", "type": "string"},
            {"id": 4, "name": "at", "type": "timestamp"},
            {"id": 5, "name": "note", "type": "string", "default": "n"},
        ]
    sent = outlet_events[alias("events")].asset_alias_events
    assert sorted(e.extra["schema_version"] for e in sent) == [2, 2]


def test_clear_only_failed_tasks_reports_from_the_catalog_not_the_old_commit(
    segrep_env: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """dr is down: its fast_forward fails, commit succeeds, the report fails naming dr and what the plan had
    for it. dr comes back; the failed tasks are cleared and re-run: the report re-reads the catalog and passes."""
    import pendulum

    from segrep.data.writer import write_batch

    env = segrep_env({**POLICY, "one_task_round_max_bytes": 0}, tables=("events",))  # a task per target
    write_batch(env.catalog, "events", events_batch(list(range(30)), "a"))
    dr_dir = env.site_dir("dr")
    aside = dr_dir.with_name("dr.away")
    dr_dir.rename(aside)  # it held only its identity marker
    dr_dir.write_text("not a directory: dr is down\n")
    dag = load_dag(EVENTS_DAG)
    capsys.readouterr()

    run = dag.test(logical_date=pendulum.now("UTC"))

    states = ti_states(run)
    assert states[("fast_forward_dr", -1)] == "failed" and states[("commit", -1)] == "success", states
    assert states[("report", -1)] == "failed"
    out = capsys.readouterr()
    dr_line = next(x for x in (out.out + out.err).splitlines() if "  dr: failed; " in x)
    assert "copied nothing of the 2 segments (" in dr_line, dr_line  # not "nothing to offer"

    dr_dir.unlink()
    aside.rename(dr_dir)  # dr is back, with its identity marker
    # "Clear only failed tasks": the failed fast_forward (dr) and report run again in the same DAG run; plan
    # and commit do not (their XComs stay as they were). `airflow tasks test` runs one task of that run.
    for task_id, extra in (("fast_forward_dr", []), ("report", [])):
        proc = subprocess.run(
            [AIRFLOW, "tasks", "test", EVENTS_DAG, task_id, run.run_id, *extra],
            capture_output=True,
            text=True,
            env=os.environ.copy(),
            timeout=180,
        )
        assert proc.returncode == 0, f"{task_id}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert rounds(env)[-1].report["targets"]["dr"]["status"] == "ok"  # the report committed again
    lines = (proc.stdout + proc.stderr).splitlines()
    assert any("  dr: ok; copied 2 segments (" in x for x in lines), proc.stdout[-3000:]
    assert not any("round of events: target(s) dr failed" in x for x in lines)


def test_a_failed_plan_runs_no_step_after_it(segrep_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import pendulum

    from segrep.replication import orchestrator

    segrep_env(POLICY, tables=("events",))

    def broken(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("catalog unreachable")

    monkeypatch.setattr(orchestrator, "plan_round", broken)
    run = load_dag(EVENTS_DAG).test(logical_date=pendulum.now("UTC"))

    states = ti_states(run)
    assert states[("round", -1)] == "failed" and str(run.state) == "failed", states
    # nothing after the plan did any work: the branch's XCom is missing, so no step copies, merges or commits
    assert not any(state == "success" for state in states.values()), states
