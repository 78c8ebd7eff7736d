"""The RPO watchdog DAG (issue 34 item 4) through ``dag.test``: it fires while the replication DAG does not run.

A round replicates `events` (the replication DAG's steps, run in process); then no round runs (the replication
DAG paused, in a ``dag.test`` world) while a write lands at the leader. Within the 30 s objective the watchdog
run succeeds and alerts nobody; past it (a real wait: the safe time must be more than 30 s old on the wall
clock) its task fails, naming each replica with its lag, objective and why, and the alert hook
(``SEGREP_ALERT_CALLBACK``, a real callback writing a file) is called with that failure. `orders`, which no
round ever reached, is behind from its start and breaches too. A hook that names nothing importable fails the
run, naming it (read from the Airflow Variable). The schedule and the hook's wiring are checked on the DAG the
runs use.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.airflow import events_batch, events_yaml, load_dag, rounds, ti_states, wait_until
from tests.support.alerts import FILE_ENV

RPO_S = 30
POLICY = {"schedule": "5m", "start_date": "2026-11-01", "rpo": f"{RPO_S}s"}


def _definitions() -> str:
    """`events` and `orders`, both with a 30 s objective (events_yaml gives only events a policy)."""
    doc = yaml.safe_load(events_yaml(POLICY))
    doc["tables"]["orders"]["policy"] = dict(POLICY)
    return yaml.safe_dump(doc, sort_keys=False)


def _run(dag: Any) -> Any:
    import pendulum

    return dag.test(logical_date=pendulum.now("UTC"))


def _assert_watchdog_shape(dag: Any) -> None:
    """Its own schedule, one short run at a time, no catch-up; the alert hook is its task's failure callback."""
    from airflow.sdk import DeltaTriggerTimetable

    from segrep_airflow.watchdog import alert

    assert isinstance(dag.timetable, DeltaTriggerTimetable) and dag.timetable.delta == timedelta(minutes=1)
    assert dag.catchup is False and dag.max_active_runs == 1 and dag.dagrun_timeout == timedelta(minutes=2)
    assert dag.task_ids == ["check"] and not dag.params
    check = dag.get_task("check")
    assert check.on_failure_callback == [alert] and check.retries == 0
    assert check.execution_timeout == timedelta(seconds=90)


def _alerts(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_watchdog_fires_when_the_replication_dag_does_not_run(
    segrep_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from segrep.catalog.apply import apply_definitions
    from segrep.data.writer import write_batch
    from segrep.replication.orchestrator import run_round
    from segrep.replication.status import status_rows
    from tests.support.rounds import no_spark

    env = segrep_env(POLICY, tables=("events",))
    alert_file = tmp_path / "alerts.jsonl"
    monkeypatch.setenv("SEGREP_ALERT_CALLBACK", "tests.support.alerts:record")
    monkeypatch.setenv(FILE_ENV, str(alert_file))
    write_batch(env.catalog, "events", events_batch(list(range(40)), "a"))
    watchdog = load_dag("segrep_watchdog")  # parsed before the round: the first check follows it closely
    _assert_watchdog_shape(watchdog)

    # The one round (the replication DAG's steps, in process: a 30 s objective leaves no time for parsing),
    # then no other: the replication DAG is paused.
    assert run_round(env.catalog, env.defs, "events", submit=no_spark).status == "ok"
    last = rounds(env)[-1]
    safe = last.report["safe_time_us"]
    assert sorted(safe) == ["dr", "edge"] and last.finished_us is not None
    write_batch(env.catalog, "events", events_batch(list(range(40, 60)), "b"))  # lands at the leader only
    env.config.write_text(_definitions())  # `orders` joins the definitions: a replica no round will ever reach
    apply_definitions(env.catalog, env.defs)
    orders_start = max(r.behind_since_us or 0 for r in status_rows(env.catalog, "orders"))

    capsys.readouterr()
    run = _run(watchdog)  # well within the objective: the round just ran

    assert str(run.state) == "success", ti_states(run)
    assert _alerts(alert_file) == []
    out = capsys.readouterr()
    assert "3 replica(s), 0 breached" in out.out + out.err

    # While the objective runs out: a hook that does not import (here from the Airflow Variable, as
    # AIRFLOW_VAR_...) fails the run before it checks, naming the path: a typo must not lose alerts silently.
    with monkeypatch.context() as typo:
        typo.delenv("SEGREP_ALERT_CALLBACK")
        typo.setenv("AIRFLOW_VAR_SEGREP_ALERT_CALLBACK", "tests.support.alerts:recrod")
        run = _run(watchdog)
    assert str(run.state) == "failed" and _alerts(alert_file) == []
    out = capsys.readouterr()
    named = "Airflow Variable segrep_alert_callback: 'tests.support.alerts:recrod': tests.support.alerts has no"
    assert named in out.out + out.err

    # The safe times, and the round's end, are now over 30 s old (a real wait, on the clock status reads).
    wait_until(max(*safe.values(), last.finished_us, orders_start) / 1e6 + RPO_S + 1)
    run = _run(watchdog)

    assert str(run.state) == "failed" and ti_states(run) == {("check", -1): "failed"}
    [alert] = _alerts(alert_file)  # the hook ran once, with the failure
    assert (alert["dag_id"], alert["task_id"], alert["error"]) == ("segrep_watchdog", "check", "RpoBreached")
    breaches = {(b["table"], b["site"]): b for b in alert["breaches"]}
    assert sorted(breaches) == [("events", "dr"), ("events", "edge"), ("orders", "dr")]
    for (table, site), b in breaches.items():
        assert b["rpo_s"] == RPO_S and b["lag_s"] > RPO_S, b
        assert f"{table} at {site}: lag " in alert["message"] and "past its RPO of 30 s" in alert["message"]
    for site in ("dr", "edge"):
        reasons = breaches[("events", site)]["reasons"]
        assert reasons[0].startswith("no round of events has finished for "), reasons  # the DAG is not running
        assert reasons[-1].startswith("lacks 2 segment(s)"), reasons  # the write that landed after the round
    orders = breaches[("orders", "dr")]["reasons"]
    assert orders[0].startswith("no round of orders has finished yet") and orders[1].startswith("never replicated")
    assert alert["message"].startswith("RPO breach: 3 replica(s) behind their objective: ")


def test_the_hook_names_callables_by_dotted_path() -> None:
    """Where the hook is read from (the environment first, then the Variable), and what a path may name."""
    import json as json_module

    from segrep_airflow.watchdog import ALERT_ENV, AlertHookError, alert_paths, resolve
    from tests.support.alerts import record

    assert alert_paths({ALERT_ENV: " mypkg.alerts:slack , mypkg.alerts.email ,"}, "ignored:x") == (
        ALERT_ENV,
        ["mypkg.alerts:slack", "mypkg.alerts.email"],
    )
    assert alert_paths({}, "a.b:c") == ("Airflow Variable segrep_alert_callback", ["a.b:c"])
    assert alert_paths({ALERT_ENV: "  "}, "") == ("Airflow Variable segrep_alert_callback", [])
    assert resolve("tests.support.alerts:record") is record and resolve("tests.support.alerts.record") is record
    assert resolve("json:JSONDecoder.decode") is json_module.JSONDecoder.decode
    for path, named in [
        ("notify", "is not a dotted path like mypkg.alerts:notify"),
        ("no_such_module_here:notify", "module 'no_such_module_here' cannot be imported"),
        ("json:nothing", "json has no 'nothing'"),
        ("json:__name__", "'json:__name__' is not callable"),
    ]:
        with pytest.raises(AlertHookError, match=named):
            resolve(path)
