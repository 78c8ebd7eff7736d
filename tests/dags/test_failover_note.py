"""The failover DAG's loss report as its run's note (issue 14 item 5), through a real api-server's REST API.

The api-server (public API and execution API, simple auth manager with one user whose password this test
writes) runs as a subprocess on the session's Airflow database; the DAG runs in-process (``dag.test``) with
the connection ``segrep_airflow_api`` pointing at it. The note is then read back through the same REST API,
as the run's page shows it. A wrong password, or no connection, leaves the note unset and says why in the
task log, without the password.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.airflow import events_batch, load_dag, ti_states
from tests.support.airflow_services import Services

pytestmark = pytest.mark.slow

PASSWORD = "note-test-pw-1"


@pytest.fixture
def api(tmp_path: Path, services: Services) -> Services:
    passwords = tmp_path / "passwords.json"
    passwords.write_text(json.dumps({"operator": PASSWORD}))
    services.extra_env.update(
        {
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "operator:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        }
    )
    services.start_api_server(apps="all")
    services.wait_api_healthy()
    return services


def _note(api: Services, dag_id: str, run_id: str) -> str | None:
    base = f"http://127.0.0.1:{api.api_port}"
    token = httpx.post(f"{base}/auth/token", json={"username": "operator", "password": PASSWORD}).json()
    got = httpx.get(
        f"{base}/api/v2/dags/{dag_id}/dagRuns/{run_id}", headers={"Authorization": f"Bearer {token['access_token']}"}
    )
    assert got.status_code == 200, got.text
    note: str | None = got.json()["note"]
    return note


def test_the_dry_run_sets_the_loss_as_the_runs_note(
    segrep_env: Any, api: Services, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pendulum

    from segrep.data.writer import write_batch

    env = segrep_env(tables=("events",))
    write_batch(env.catalog, "events", events_batch(list(range(40)), "a"))  # at primary only: all would be lost
    dag = load_dag("segrep_failover")
    conf = {"tables": ["events"], "site": "dr", "action": "failover", "dry_run": True}

    monkeypatch.setenv("AIRFLOW_CONN_SEGREP_AIRFLOW_API", f"http://operator:{PASSWORD}@127.0.0.1:{api.api_port}")
    capsys.readouterr()
    run = dag.test(logical_date=pendulum.now("UTC"), run_conf=conf)

    assert str(run.state) == "success", ti_states(run)
    out = capsys.readouterr()
    log = out.out + out.err
    assert f"the loss report is the note of run {run.run_id}" in log, log[-3000:]
    note = _note(api, "segrep_failover", run.run_id)
    assert note is not None and note.startswith("failover of events: primary -> dr, at latest (dry run"), note
    assert "loss (would be given up): 2 segment(s), 40 rows" in note, note
    assert note in log  # the same text as the task log's

    monkeypatch.setenv("AIRFLOW_CONN_SEGREP_AIRFLOW_API", f"http://operator:wrong@127.0.0.1:{api.api_port}")
    run = dag.test(logical_date=pendulum.now("UTC"), run_conf=conf)
    assert str(run.state) == "success", ti_states(run)  # a note is a convenience: the run goes on
    out = capsys.readouterr()
    log = out.out + out.err
    assert "the run's note was not set: " in log and "/auth/token answered 401 for user 'operator'" in log
    assert "wrong" not in log and PASSWORD not in log
    assert _note(api, "segrep_failover", run.run_id) is None

    monkeypatch.delenv("AIRFLOW_CONN_SEGREP_AIRFLOW_API")
    run = dag.test(logical_date=pendulum.now("UTC"), run_conf=conf)
    out = capsys.readouterr()
    assert "the run's note was not set: no Airflow connection 'segrep_airflow_api'" in out.out + out.err


def test_a_long_report_is_cut_at_a_line_and_says_where_the_rest_is() -> None:
    from segrep_airflow.run_note import NOTE_LIMIT, note_text

    report = "\n".join(f"    partition {i}: 1 segment(s), 10 rows, 2.0 kB" for i in range(100))
    note = note_text(report)
    assert len(note) <= NOTE_LIMIT < len(report)
    *lines, last = note.splitlines()
    assert lines == report.splitlines()[: len(lines)]
    assert last == f"... {100 - len(lines)} more line(s): see the assess task's log"
    assert note_text("short") == "short"
