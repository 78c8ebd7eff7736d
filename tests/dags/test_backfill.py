"""An outage of one target and its repair by a real Airflow backfill.

The table replicates every INTERVAL_S seconds (a fixed-interval policy). Target `dr` is unreachable (its site
directory is replaced by a regular file) for two intervals: a batch is written in each interval and each
interval's run fails (dr's fast_forward_dr task fails after its retry, edge succeeds, the report fails
the run). dr comes back, and ``airflow backfill create --reprocess-behavior failed`` -- executed by a real
scheduler (LocalExecutor) with an execution-API server, both started here -- re-runs exactly those two
intervals, in order (the second starts after the first ended). dr's safe time never goes backwards and in
the end dr and edge read what the leader reads.

Intervals are wall-clock time, so the test waits for each interval boundary to write that interval's batch.
The outage runs (dag.test, in order) come after the last interval, like runs of a scheduler that lags: a run
only offers what was committed before its interval end, however late it runs, and nothing then depends on
how long a dag.test takes on a busy machine. Interval k is [S_k, S_k+1). A run triggered by hand at X covers
the interval that *ends* at X (Airflow's manual data interval for a fixed-delta timetable is [X - delta, X)),
so interval k's run is dag.test(logical_date=S_k+1). The DAG's start_date is S_1 and its end_date S_2, so its
schedule is exactly the logical dates S_1..S_2: the backfill selects those runs; the scheduler creates no
scheduled run of its own (``use_job_schedule`` off: the DAG does not catch up, so it would add the interval
ending now).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.support.airflow import (
    EVENTS_DAG,
    events_batch,
    load_dag,
    read_sorted,
    rounds,
    ti_states,
    wait_until,
)
from tests.support.airflow_services import Services

pytestmark = pytest.mark.slow

INTERVAL_S = 8
OUTAGE_INTERVALS = 2  # enough for order and no overlap; each more costs ~40 s of the suite
BACKFILL_TIMEOUT_S = 240


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat()


def _us(epoch_s: float) -> int:
    return round(epoch_s * 1_000_000)


def _dag_runs(dag_id: str, logical_dates: list[datetime]) -> dict[datetime, Any]:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        runs = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.logical_date.in_(logical_dates)))
        out = {}
        for r in runs:
            session.expunge(r)
            out[r.logical_date] = r
        return out


def _round_for(env: Any, end_us: int) -> Any:
    found = [r for r in rounds(env) if r.interval_end_us == end_us]
    assert len(found) == 1, f"no round ending at {end_us}: {[r.interval_end_us for r in rounds(env)]}"
    return found[0]


def test_outage_then_backfill_replays_failed_intervals_in_order(segrep_env: Any, services: Services) -> None:
    import pendulum

    from segrep.data.writer import write_batch

    starts = [float(int(time.time()) + 4 + k * INTERVAL_S) for k in range(OUTAGE_INTERVALS + 2)]  # S_0 .. S_3
    ends = starts[1 : OUTAGE_INTERVALS + 1]  # the end of each outage interval = its run's logical date
    env = segrep_env(
        {
            "schedule": f"{INTERVAL_S}s",
            "start_date": _iso(ends[0]),
            "end_date": _iso(ends[-1]),
            "retries": 1,
            "retry_delay_s": 0,
            "one_task_round_max_bytes": 0,  # a fast_forward task per target: dr fails alone
        },
        tables=("events",),
    )
    services.start_api_server()  # starts up (~10 s) while the outage goes on

    dr_dir = env.site_dir("dr")
    offline = dr_dir.with_name("dr.offline")
    dr_dir.mkdir(parents=True, exist_ok=True)  # (a site's directory appears with its first segment)
    dr_dir.rename(offline)
    dr_dir.write_text("not a directory: the dr site is down\n")

    expected: dict[int, str] = {}  # seq -> payload of the last write
    for k in range(OUTAGE_INTERVALS):
        wait_until(starts[k])
        keys = list(range(k * 10, k * 10 + 30))  # new keys and updates of the previous batch's keys
        write_batch(env.catalog, "events", events_batch(keys, f"b{k}"))
        expected.update((key, f"b{k}-{key}") for key in keys)
        assert time.time() < starts[k + 1], f"batch {k} was written after its interval ended (machine too slow)"
    wait_until(ends[-1])

    t_outage = time.time()
    dag = load_dag(EVENTS_DAG)
    dr_safe_history: list[int] = []  # dr's safe time after every run, in the order the runs happened
    for k, end in enumerate(ends):
        _outage_run(env, dag, end, dr_safe_history, rows_due=k * 10 + 30)

    print(f"outage runs took {time.time() - t_outage:.1f} s")
    offline_entries = sorted(p.name for p in offline.rglob("*"))
    dr_dir.unlink()
    offline.rename(dr_dir)  # dr is back, untouched by the outage
    assert sorted(p.name for p in dr_dir.rglob("*")) == offline_entries

    services.cli("dags", "unpause", EVENTS_DAG)  # queued runs of a paused DAG never start
    services.wait_api_healthy()
    wait_until(starts[-1] + 1)  # a backfill only takes intervals that ended: the last one's timetable interval
    logical = [pendulum.instance(datetime.fromtimestamp(e, UTC)) for e in ends]
    started = time.time()
    services.cli(
        "backfill",
        "create",
        "--dag-id",
        EVENTS_DAG,
        "--from-date",
        logical[0].isoformat(),
        "--to-date",
        logical[-1].isoformat(),
        "--reprocess-behavior",
        "failed",
        "--max-active-runs",
        "1",
    )
    queued = _dag_runs(EVENTS_DAG, logical)
    assert {str(r.state) for r in queued.values()} == {"queued"} and len(queued) == OUTAGE_INTERVALS
    # Only now the scheduler (on SQLite, `backfill create` and a running scheduler can lock each other out). It
    # creates no run of its own: the DAG's schedule is S_1..S_2 and each of those logical dates has a run.
    services.start("scheduler", "scheduler")

    deadline = started + BACKFILL_TIMEOUT_S
    while True:
        runs = _dag_runs(EVENTS_DAG, logical)
        if all(str(r.state) in ("success", "failed") for r in runs.values()):
            break
        sched = services.procs["scheduler"]
        if sched.poll() is not None or time.time() > deadline:
            pytest.fail(
                f"backfill not done after {time.time() - started:.0f} s (scheduler exit {sched.poll()}): "
                f"{ {str(k): str(r.state) for k, r in runs.items()} }\n{services.tail('scheduler')}"
            )
        time.sleep(1)
    backfill_s = time.time() - started
    print(f"backfill of {OUTAGE_INTERVALS} intervals took {backfill_s:.1f} s")

    listed = services.cli("dags", "list-runs", EVENTS_DAG, "-o", "json")
    listing = json.loads(next(line for line in listed.splitlines() if line.startswith("[")))
    # runs without a logical date (asset-triggered, or triggered through the REST API) are other tests' in this
    # worker's Airflow database
    by_date = {pendulum.parse(r["logical_date"]): r for r in listing if r["logical_date"]}
    replayed = [by_date[d] for d in logical]
    assert [r["state"] for r in replayed] == ["success"] * OUTAGE_INTERVALS, (replayed, backfill_s)
    assert {r["run_id"] for r in replayed} == {r.run_id for r in queued.values()}  # the failed runs, reused
    assert {str(r.run_type) for r in runs.values()} == {"backfill"} and len({r.backfill_id for r in runs.values()}) == 1
    run_starts = [pendulum.parse(r["start_date"]) for r in replayed]
    run_ends = [pendulum.parse(r["end_date"]) for r in replayed]
    assert run_starts == sorted(run_starts), "the intervals did not re-run in order"
    for k in range(1, OUTAGE_INTERVALS):
        assert run_ends[k - 1] <= run_starts[k], "two backfill runs overlapped (max_active_runs 1)"
    assert run_starts[0].timestamp() >= started

    for k, end in enumerate(ends):
        rnd = _round_for(env, _us(end))
        assert rnd.status == "ok", rnd.report
        assert rnd.report["targets"]["dr"]["status"] == "ok"
        assert rnd.report["safe_time_us"]["dr"] == _us(end) - 1, f"interval {k}: dr's safe time"
        assert rnd.finished_us >= _us(started)  # committed again by the backfill
        dr_safe_history.append(rnd.report["safe_time_us"]["dr"])
    finished = [_round_for(env, _us(end)).finished_us for end in ends]
    assert finished == sorted(finished)
    assert dr_safe_history == sorted(dr_safe_history), f"dr's safe time went backwards: {dr_safe_history}"

    leader = read_sorted(env)
    assert dict(zip(leader["seq"].to_pylist(), leader["payload"].to_pylist(), strict=True)) == expected
    for site in ("dr", "edge"):
        assert read_sorted(env, site).equals(leader), f"{site} differs from the leader"


def _outage_run(env: Any, dag: Any, end_s: float, dr_safe_history: list[int], rows_due: int) -> None:
    """Interval ending at ``end_s`` while dr is down: dr fails (after its retry), edge succeeds, the run fails.
    Edge then holds exactly the rows committed before the interval end (``rows_due`` keys), nothing later."""
    import pendulum

    end = pendulum.instance(datetime.fromtimestamp(end_s, UTC))
    # A manual run ends at its run_after (the moment it was triggered): here, as a scheduler would have run it.
    run = dag.test(logical_date=end, run_after=end)

    states = ti_states(run)
    assert run.state == "failed", states
    assert run.data_interval_end.timestamp() == end_s
    assert states[("fast_forward_dr", -1)] == "failed"
    assert states[("fast_forward_edge", -1)] == "success"
    assert states[("commit", -1)] == "success" and states[("report", -1)] == "failed"
    assert states[("merge", -1)] == "skipped"
    dr_ff = next(ti for ti in run.get_task_instances() if ti.task_id == "fast_forward_dr")
    assert dr_ff.try_number == 2  # retried once (retries: 1, no delay)
    rnd = _round_for(env, _us(end_s))
    assert rnd.status == "failed"
    assert rnd.report["targets"]["dr"]["status"] == "failed"
    assert rnd.report["safe_time_us"]["edge"] == _us(end_s) - 1  # edge is current up to the interval end
    assert rnd.report["safe_time_us"]["dr"] < _us(end_s) - 1
    dr_safe_history.append(rnd.report["safe_time_us"]["dr"])
    assert read_sorted(env, "edge").num_rows == rows_due
