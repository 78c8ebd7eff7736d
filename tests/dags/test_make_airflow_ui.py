"""`make airflow` as an operator uses it, in Debian's Chromium: the traps of issue 34, met in the browser.

One Airflow for the module: scripts/airflow.sh on a free port (the UI and the tasks' execution API move
together), on a throw-away database of the local PostgreSQL that the script creates (LocalExecutor), with a
replication DAG for ``events`` (hourly, no Airflow retries, a 10-minute back-off after a failure). The tests
run in file order against it:

1. A backfill of 3 intervals from the UI's Backfill form ends with 3 successful runs (on SQLite it once
   answered 503 "database is locked" and broke every later task).
2. dr down: the run fails; dr restored; "Clear only failed tasks" in the run's Clear dialog: the next try is
   the operator's retry, which the back-off does not hold back, and the run ends Success with dr holding the
   segments (it once went Success with "dr: backoff; nothing to copy").
3. Every segrep DAG's Trigger form, submitted unchanged, makes a run (the failover form's Trigger once stayed
   disabled); a trigger with a key the form does not have is refused before a run exists.
Never skipped: without PostgreSQL or Chromium these fail.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.support.airflow import EVENTS_DAG, REPO, events_batch, events_yaml, read_sorted, rounds
from tests.support.airflow_services import free_port, script_env, stop_group
from tests.support.browser import button, chrome, dialog, login, wait
from tests.support.env import Env, make_env

START_TIMEOUT_S = 300  # standalone migrates its database and starts four processes: slow on a busy machine
RUN_TIMEOUT_S = 300
POLICY = {"schedule": "@hourly", "start_date": "2026-11-01", "retries": 0, "retry_delay_s": 600}
SEGREP_DAGS = (
    EVENTS_DAG,
    "segrep_maintain_events",
    "segrep_verify_events",
    "segrep_split_events",
    "segrep_bootstrap",
    "segrep_failover",
    "segrep_watchdog",
)


@dataclass
class Ui:
    url: str
    api: httpx.Client
    password: str
    env: Env
    log: Path
    proc: subprocess.Popen[bytes]

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def until(self, check: Callable[[], Any], what: str, timeout_s: float = START_TIMEOUT_S) -> Any:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            got = check()
            if got:
                return got
            if self.proc.poll() is not None:
                pytest.fail(f"scripts/airflow.sh exited ({self.proc.returncode}) waiting for {what}:\n{self.tail()}")
            time.sleep(1)
        pytest.fail(f"waited {timeout_s} s for {what}, in vain:\n{self.tail()}")

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        return list(self.api.get(f"/api/v2/dags/{dag_id}/dagRuns", params={"limit": 100}).json()["dag_runs"])

    def manual_runs(self, dag_id: str) -> list[dict[str, Any]]:
        """Runs made by a trigger (the form, the REST API): unpausing also schedules a run of the last interval."""
        return [r for r in self.runs(dag_id) if r["run_type"] == "manual"]

    def run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return dict(self.api.get(f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id)}").json())

    def finished(self, dag_id: str, run_id: str) -> str:
        def state() -> str | None:
            now = str(self.run(dag_id, run_id)["state"])
            return now if now in ("success", "failed") else None

        return str(self.until(state, f"run {run_id} to finish", RUN_TIMEOUT_S))

    def task(self, dag_id: str, run_id: str, task_id: str) -> tuple[str, int]:
        ti = self.api.get(f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id)}/taskInstances/{task_id}").json()
        return str(ti["state"]), int(ti["try_number"])


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory, pg_server: str) -> Iterator[Ui]:
    root = tmp_path_factory.mktemp("make-airflow")
    (root / "segrep").mkdir()
    env = make_env(root / "segrep", f"sqlite:///{root / 'catalog.db'}", events_yaml(POLICY, tables=("events",)))
    from segrep.data.writer import write_batch

    write_batch(env.catalog, "events", events_batch(list(range(20)), "a"))
    server = make_url(pg_server).set(database="postgres")
    database = f"segrep_airflow_t{uuid.uuid4().hex[:10]}"
    home, port = root / "airflow-home", free_port()
    settings = {
        "SEGREP_AIRFLOW_PG_URL": server.render_as_string(hide_password=False),
        "SEGREP_AIRFLOW_DB_NAME": database,
        "SEGREP_CONFIG": str(env.config),
        "SEGREP_CATALOG_URL": env.url,
    }
    log = root / "standalone.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(REPO / "scripts" / "airflow.sh")],
            env=script_env(home, port, **settings),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
    made = Ui(f"http://127.0.0.1:{port}", api, "", env, log, proc)
    try:
        made.until(lambda: _ok(api, "/api/v2/monitor/health"), "the api-server to answer")
        made.password = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
        token = api.post("/auth/token", json={"username": "admin", "password": made.password})
        assert token.status_code in (200, 201), token.text
        api.headers["Authorization"] = f"Bearer {token.json()['access_token']}"
        for dag_id in SEGREP_DAGS:
            made.until(lambda d=dag_id: _ok(api, f"/api/v2/dags/{d}"), f"{dag_id} to be parsed")
        yield made
    finally:
        stop_group(proc, timeout_s=60)
        api.close()
        env.catalog.dispose()
        engine = create_engine(server, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        engine.dispose()


@pytest.fixture(scope="module")
def admin_browser(ui: Ui) -> Iterator[Any]:
    with chrome() as driver:
        login(driver, ui.url, "admin", ui.password)
        yield driver


def test_make_airflow_runs_on_postgresql_and_a_backfill_from_the_ui_succeeds(ui: Ui, admin_browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    banner = ui.log.read_text(errors="replace")[:3000]
    assert "database      PostgreSQL, database segrep_airflow_t" in banner and "(LocalExecutor)" in banner, banner
    form = _open_trigger_form(admin_browser, ui, EVENTS_DAG)
    form.find_element(By.XPATH, ".//*[contains(text(), 'Run this Dag for a range of dates')]").click()
    for index, (day, hour) in enumerate((("2026/11/27", "00:00"), ("2026/11/27", "02:00"))):
        wait(admin_browser, lambda d: dialog(d, "Date Range"), "the backfill form")
        dialog(admin_browser, "Date Range").find_elements(By.CSS_SELECTOR, "[data-testid=datetime-input]")[
            index
        ].click()
        picker = wait(admin_browser, lambda d: _open_popover(d), "the date picker")
        date_in, time_in = picker.find_elements(By.CSS_SELECTOR, "input")[:2]
        for field, value in ((date_in, day), (time_in, hour)):
            field.send_keys(Keys.CONTROL, "a")
            field.send_keys(value)
        time_in.send_keys(Keys.ESCAPE)
        wait(admin_browser, lambda d: not _open_popover(d), "the date picker to close")
    wait(
        admin_browser, lambda d: "3 runs will be triggered" in dialog(d, "Date Range").text, "the form's count of runs"
    )
    wait(admin_browser, lambda d: button(dialog(d, "Date Range"), "Run Backfill"), "the Run Backfill button").click()

    def three_done() -> list[dict[str, Any]] | None:
        runs = [r for r in ui.runs(EVENTS_DAG) if r["run_type"] == "backfill"]
        return runs if len(runs) == 3 and all(r["state"] in ("success", "failed") for r in runs) else None

    runs = ui.until(three_done, "the backfill's 3 runs to finish", RUN_TIMEOUT_S)
    assert sorted((r["logical_date"], r["state"]) for r in runs) == [
        ("2026-11-27T00:00:00Z", "success"),
        ("2026-11-27T01:00:00Z", "success"),
        ("2026-11-27T02:00:00Z", "success"),
    ], ui.tail()
    ends = {r.interval_end_us for r in rounds(ui.env)}
    for hour in (1, 2, 3):  # each run's round was recorded for its own interval
        assert int(datetime(2026, 11, 27, hour, tzinfo=UTC).timestamp()) * 1_000_000 in ends


def test_clear_only_failed_after_the_target_returns_ends_the_run_success(ui: Ui, admin_browser: Any) -> None:
    from selenium.webdriver.common.by import By

    from segrep.data.writer import write_batch

    env = ui.env
    write_batch(env.catalog, "events", events_batch(list(range(100, 130)), "b"))
    dr_dir = env.site_dir("dr")
    aside = dr_dir.with_name("dr.away")
    dr_dir.rename(aside)
    dr_dir.write_text("not a directory: dr is down\n")
    ui.api.patch(f"/api/v2/dags/{EVENTS_DAG}", json={"is_paused": False}).raise_for_status()  # as the form would
    made = ui.api.post(f"/api/v2/dags/{EVENTS_DAG}/dagRuns", json={"logical_date": None})
    assert made.status_code == 200, made.text
    run_id = made.json()["dag_run_id"]
    assert ui.finished(EVENTS_DAG, run_id) == "failed"
    assert ui.task(EVENTS_DAG, run_id, "round") == ("failed", 1)

    dr_dir.unlink()
    aside.rename(dr_dir)  # dr is back; its back-off runs for 10 more minutes
    admin_browser.get(f"{ui.url}/dags/{EVENTS_DAG}/runs/{urllib.parse.quote(run_id)}")
    clear = wait(
        admin_browser, lambda d: d.find_element(By.CSS_SELECTOR, "button[aria-label='Press shift+c to clear']"), "Clear"
    )
    clear.click()
    box = wait(admin_browser, lambda d: dialog(d, "Clear only failed tasks"), "the Clear dialog")
    button(box, "Clear only failed tasks").click()
    affected = wait(admin_browser, lambda d: _affected(dialog(d, "Confirm")), "the tasks the clear affects")
    assert "Failed" in affected and "Success" not in affected, affected  # the failed round, nothing that succeeded
    wait(admin_browser, lambda d: _enabled(button(dialog(d, "Confirm"), "Confirm")), "Confirm").click()
    wait(admin_browser, lambda d: dialog(d, "Clear only failed tasks") is None, "the Clear dialog to close")
    ui.until(lambda: ui.run(EVENTS_DAG, run_id)["state"] != "failed", "the cleared run to start again", 60)

    assert ui.finished(EVENTS_DAG, run_id) == "success", ui.tail()
    assert ui.task(EVENTS_DAG, run_id, "round") == ("success", 2)
    report = rounds(env)[-1].report["targets"]["dr"]
    assert report["status"] == "ok" and report["segments_copied"] >= 1, report
    leader = read_sorted(env)
    assert leader.num_rows == 50 and read_sorted(env, "dr").equals(leader)


def test_every_form_makes_a_run_with_its_defaults_and_unknown_keys_are_refused(ui: Ui, admin_browser: Any) -> None:
    before = {dag_id: len(ui.manual_runs(dag_id)) for dag_id in SEGREP_DAGS}
    refused = ui.api.post("/api/v2/dags/segrep_maintain_events/dagRuns", json={"conf": {"gc_dryrun": True}})
    assert refused.status_code == 400, refused.text
    detail = refused.json()["detail"]
    assert "unknown form key(s) 'gc_dryrun'" in detail and "gc_dry_run" in detail, detail
    assert len(ui.manual_runs("segrep_maintain_events")) == before["segrep_maintain_events"]

    for dag_id in SEGREP_DAGS:
        form = _open_trigger_form(admin_browser, ui, dag_id)
        enabled = f"{dag_id}: the form's Trigger enabled"
        submit = wait(admin_browser, lambda _d, f=form: _enabled(button(f, "Trigger")), enabled)
        submit.click()
        ui.until(lambda d=dag_id: len(ui.manual_runs(d)) == before[d] + 1, f"{dag_id}: a run made by its form", 60)


def _open_trigger_form(browser: Any, ui: Ui, dag_id: str) -> Any:
    browser.get(f"{ui.url}/dags/{dag_id}")
    wait(browser, lambda d: button(d, "Trigger"), f"{dag_id}: the Trigger button").click()
    return wait(browser, lambda d: dialog(d, f"Trigger Dag - {dag_id}"), f"{dag_id}: the Trigger form")


def _affected(box: Any) -> str | None:
    """The Clear dialog's text from its "Affected Tasks" count on, once the (re-fetched) list is shown."""
    text = box.text if box is not None else ""
    return text[text.index("Affected Tasks") :] if "Affected Tasks" in text and "round" in text else None


def _open_popover(driver: Any) -> Any:
    from selenium.webdriver.common.by import By

    shown = [
        p for p in driver.find_elements(By.CSS_SELECTOR, "[data-scope=popover][data-part=content]") if p.is_displayed()
    ]
    return shown[0] if shown else None


def _enabled(element: Any) -> Any:
    return element if element is not None and element.get_attribute("disabled") is None else None


def _ok(api: httpx.Client, path: str) -> bool:
    try:
        return api.get(path).status_code == 200
    except httpx.HTTPError:
        return False
