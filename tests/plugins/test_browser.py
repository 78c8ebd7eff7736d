"""The page in a real browser, as an operator opens it: Debian's Chromium driven by Selenium against a real
``airflow api-server`` with the plugin (its own Airflow home, SimpleAuthManager users), logging in through
Airflow's login form, opening "Replication" from the UI, reading the rows and the chart inside the UI's frame;
then a user without rights is refused. Never skipped: without Chromium and ChromeDriver (``make test``
installs them, scripts/install_browser.sh) the test fails."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.airflow import AIRFLOW
from tests.support.airflow_services import free_port, stop_group
from tests.support.browser import WAIT_S, chrome, login, wait
from tests.support.cli import cli
from tests.support.env import Env
from tests.support.plugin_page import JWT_SECRET, PLUGINS, USERS

START_TIMEOUT_S = 120
METRICS_TOKEN = "browser-test-scrape-" + "7" * 32


@dataclass(frozen=True)
class Server:
    url: str
    passwords: dict[str, str]
    log: Path


def _airflow_env(home: Path) -> dict[str, str]:
    """A throw-away Airflow of its own (the api-server reads nothing of the test process's Airflow)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    (home / "dags").mkdir(parents=True)
    return env | {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__API_AUTH__JWT_SECRET": JWT_SECRET,
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": USERS,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "SEGREP_METRICS_TOKEN": METRICS_TOKEN,
    }


@pytest.fixture
def api_server(lag_env: Env, tmp_path: Path) -> Iterator[Server]:
    """``airflow db migrate``, then ``airflow api-server`` on a free loopback port with the plugin and
    ``lag_env``'s SEGREP_CONFIG / SEGREP_CATALOG_URL; stopped (its process group) afterwards."""
    home = tmp_path / "airflow"
    env = _airflow_env(home)
    migrate = subprocess.run([AIRFLOW, "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
    assert migrate.returncode == 0, f"airflow db migrate failed:\n{migrate.stdout[-2000:]}{migrate.stderr[-2000:]}"
    port = free_port()
    log = home / "api-server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [AIRFLOW, "api-server", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its workers are in its process group: stopped together below
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, f"api-server exited:\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, (
                    f"api-server not up in {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}"
                )
                time.sleep(0.5)
        yield Server(url, json.loads((home / "passwords.json").read_text()), log)
    finally:
        stop_group(proc)


@pytest.fixture
def browser() -> Iterator[Any]:
    with chrome() as driver:
        yield driver


def _wait(driver: Any, condition: Any, what: str) -> Any:
    return wait(driver, condition, what)


def _login(driver: Any, server: Server, user: str) -> None:
    login(driver, server.url, user, server.passwords[user])


def test_operator_opens_the_replication_page_and_sees_rows_and_chart(
    api_server: Server, browser: Any, lag_env: Env
) -> None:
    from selenium.webdriver.common.by import By

    code, out, err = cli(lag_env, "status", "--json")
    assert code == 0, err
    status = {(r["table"], r["target"]): r for r in json.loads(out)["replication"]}

    _login(browser, api_server, "viewer")
    browser.get(f"{api_server.url}/")
    link = _wait(browser, lambda d: d.find_element(By.XPATH, "//a[contains(@href, '/plugin/segrep')]"), "the UI's link")
    browser.get(link.get_attribute("href"))  # the navigation entry the plugin adds ("Replication")
    frame = _wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, "iframe[title=Replication]"), "the frame")
    browser.switch_to.frame(frame)
    _wait(browser, lambda d: d.execute_script("return document.body.dataset.chartsReady") == "true", "the page")

    rows = browser.find_elements(By.CSS_SELECTOR, "tr.site-row")
    seen = {(r.get_attribute("data-table"), r.get_attribute("data-site")): r for r in rows}
    assert set(seen) == {*status, ("events", "primary"), ("orders", "primary")}
    for key, want in status.items():
        row = seen[key]
        cell = {
            f: row.find_element(By.CSS_SELECTOR, f"td[data-field={f}]").get_attribute("data-value")
            for f in ("pending_segments", "pending_bytes", "safe_time")
        }
        assert cell["pending_segments"] == str(want["pending_segments"])
        assert cell["pending_bytes"] == str(want["pending_bytes"])
        assert cell["safe_time"] == ("" if want["safe_time_us"] is None else str(want["safe_time_us"]))
    dr = seen[("events", "dr")]
    assert dr.find_element(By.CSS_SELECTOR, "td[data-field=state]").text == "LIVE"
    assert dr.find_element(By.CSS_SELECTOR, "td[data-field=rpo]").text == "15 min met"

    # the chart of events at dr: drawn by Chart.js from the round's report, with the RPO line
    drawn = browser.execute_script(
        "const c = Chart.getChart(document.getElementById('lag-events-dr'));"
        "return c ? [c.data.datasets.length, c.data.datasets[0].data.length, c.canvas.width] : null;"
    )
    assert drawn is not None and drawn[0] == 2 and drawn[1] >= 1 and drawn[2] > 0, drawn
    # the line ends at the live lag (now against the safe time); the window shown is 6 h until another is chosen
    assert browser.find_element(By.ID, "lag-events-dr").get_attribute("data-live") == "true"
    assert browser.find_element(By.ID, "lag-events-dr").get_attribute("data-window") == "21600"
    browser.find_element(By.CSS_SELECTOR, "a.window[data-window='3600']").click()
    chart = "const c = Chart.getChart(document.getElementById('lag-events-dr'));"
    span = chart + "return c && c.scales.x.max - c.scales.x.min;"
    _wait(browser, lambda d: d.execute_script(span) == 3600 * 1000, "the 1-hour chart")
    assert "window=1h" in browser.execute_script("return window.location.search")
    assert {th.text for th in browser.find_elements(By.CSS_SELECTOR, "#sites th")} >= {"DAG", "last verify"}
    dr = browser.find_element(By.CSS_SELECTOR, "tr.site-row[data-table=events][data-site=dr]")  # the new page's
    assert dr.find_element(By.CSS_SELECTOR, "td[data-field=last_verified]").text == "-"  # never verified

    # auto-refresh: on unless turned off (remembered); turned on again, it fetches the page at once
    toggle = browser.find_element(By.ID, "auto-refresh")
    assert toggle.is_selected()
    toggle.click()
    assert browser.execute_script("return localStorage.getItem('segrep.autoRefresh')") == "off"
    refreshed = browser.execute_script("return document.body.dataset.refreshes || '0'")
    toggle.click()
    _wait(browser, lambda d: d.execute_script("return document.body.dataset.refreshes") != refreshed, "a refresh")
    assert browser.execute_script("return localStorage.getItem('segrep.autoRefresh')") == "on"
    assert "refreshed" in browser.find_element(By.ID, "refresh-status").text
    assert len(browser.find_elements(By.CSS_SELECTOR, "tr.site-row")) == len(seen)  # the rows, fetched again
    assert browser.find_element(By.ID, "lag-events-dr").get_attribute("data-window") == "3600"  # the window kept
    browser.switch_to.default_content()

    # a scraper with the static token, through the api-server's own middleware and mount
    scrape = urllib.request.Request(
        f"{api_server.url}/segrep/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
    )
    with urllib.request.urlopen(scrape, timeout=WAIT_S) as got:
        assert 'segrep_pending_segments{site="dr",table="orders"}' in got.read().decode()
    scrape.add_header("Authorization", "Bearer wrong")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(scrape, timeout=WAIT_S)
    assert refused.value.code == 401 and refused.value.headers["WWW-Authenticate"] == "Bearer"

    # Airflow's own database is SQLite here: a backfill (the UI's Backfill, this REST call) is refused with the
    # reason before it can lock the scheduler out, and the server goes on answering
    login_call = urllib.request.Request(
        f"{api_server.url}/auth/token",
        data=json.dumps({"username": "admin", "password": api_server.passwords["admin"]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(login_call, timeout=WAIT_S) as got:
        token = json.loads(got.read())["access_token"]
    backfill = urllib.request.Request(
        f"{api_server.url}/api/v2/backfills",
        data=json.dumps(
            {
                "dag_id": "segrep_replicate_events",
                "from_date": "2026-11-27T00:00:00Z",
                "to_date": "2026-11-27T02:00:00Z",
            }
        ).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    with pytest.raises(urllib.error.HTTPError) as sqlite:
        urllib.request.urlopen(backfill, timeout=WAIT_S)
    detail = json.loads(sqlite.value.read())["detail"]
    assert sqlite.value.code == 409 and "backfills are refused while Airflow's own database is SQLite" in detail
    with urllib.request.urlopen(f"{api_server.url}/api/v2/monitor/health", timeout=WAIT_S) as got:
        assert got.status == 200

    # a user without rights: the same entry shows the refusal, and the app answers 403
    _login(browser, api_server, "nobody")
    browser.get(f"{api_server.url}/segrep/")
    assert "may not read the segrep DAGs" in browser.find_element(By.TAG_NAME, "body").text
    assert (
        browser.execute_script("return fetch('/segrep/api/overview', {credentials: 'same-origin'}).then(r => r.status)")
        == 403
    )
