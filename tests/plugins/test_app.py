"""The plugin's FastAPI app through its test client, authorised by Airflow's real auth manager (SimpleAuthManager,
JWTs it signed): the page's numbers are ``segrep status``'s, a user who may not read the segrep DAGs is refused,
the Prometheus text carries the same values, and a breached objective is marked."""

from __future__ import annotations

import hashlib
import html
import json
import re
import sqlite3
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.core import hlc
from segrep.replication.status import status_rows
from tests.support.airflow_rows import DAG_TABLES, AirflowRows
from tests.support.cli import cli
from tests.support.env import Env
from tests.support.plugin_page import PLUGINS, RPO_YAML, Tokens, app_for

LAG_TOLERANCE_S = 5.0  # the page and the CLI measure the lag a moment apart
CHART_JS_SHA256 = "87364cc2b2a76a6684929e7d6b80b18a897794db38400caff1fcf1791c6925d2"  # Chart.js 4.6.1 as published


def client(env: Env) -> Any:
    from fastapi.testclient import TestClient

    return TestClient(app_for(env))


class Rows(HTMLParser):
    """The page's site rows: {(table, site): {field: data-value or text}}."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[tuple[str, str], dict[str, str]] = {}
        self._row: dict[str, str] | None = None
        self._field: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr" and "site-row" in (a.get("class") or ""):
            self._row = self.rows.setdefault((a["data-table"] or "", a["data-site"] or ""), {})
            self._row["class"] = a.get("class") or ""
        elif tag == "td" and self._row is not None and a.get("data-field"):
            self._field = a["data-field"]
            self._row[self._field] = a.get("data-value") or ""
            self._row[f"{self._field}:text"] = ""

    def handle_data(self, data: str) -> None:
        if self._row is not None and self._field is not None:
            self._row[f"{self._field}:text"] += data.strip()

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._field = None
        elif tag == "tr":
            self._row = None


def page_rows(page: str) -> dict[tuple[str, str], dict[str, str]]:
    parser = Rows()
    parser.feed(page)
    return parser.rows


def cli_status(env: Env) -> dict[tuple[str, str], dict[str, Any]]:
    code, out, err = cli(env, "status", "--json")
    assert code == 0, err
    return {(r["table"], r["target"]): r for r in json.loads(out)["replication"]}


def test_page_and_json_show_the_numbers_of_segrep_status(lag_env: Env, tokens: Tokens) -> None:
    c = client(lag_env)
    api = c.get("/api/overview", headers=tokens.header("viewer"))
    assert api.status_code == 200, api.text
    page = c.get("/", headers=tokens.header("viewer"))
    assert page.status_code == 200, page.text
    status = cli_status(lag_env)
    assert set(status) == {("events", "dr"), ("events", "edge"), ("orders", "dr")}

    records = {(r["table"], r["target"]): r for r in api.json()["replication"]}
    assert set(records) == set(status)
    for key, want in status.items():
        got = records[key]
        assert (
            abs(got["lag_s"] - want["lag_s"]) <= LAG_TOLERANCE_S if want["lag_s"] is not None else got["lag_s"] is None
        )
        for field in set(want) - {"lag_s", "note", "last_round", "rpo_s", "rpo_breached"}:
            assert got[field] == want[field], (key, field)
    assert records[("events", "dr")]["pending_segments"] == 2 and records[("events", "dr")]["pending_bytes"] > 0
    assert records[("events", "dr")]["rpo_s"] == 900 and records[("orders", "dr")]["rpo_s"] is None

    rows = page_rows(page.text)
    assert set(rows) == {*status, ("events", "primary"), ("orders", "primary")}  # leaders have a row too
    for key, want in status.items():
        row = rows[key]
        assert row["pending_segments"] == str(want["pending_segments"])
        assert row["pending_bytes"] == str(want["pending_bytes"])
        assert row["safe_time"] == ("" if want["safe_time_us"] is None else str(want["safe_time_us"]))
        assert row["last_round"] == ("" if want["last_round_end_us"] is None else str(want["last_round_end_us"]))
        if want["lag_s"] is not None:  # a replica that never had a round has one too: counted from its start
            assert abs(float(row["lag_s"]) - want["lag_s"]) <= LAG_TOLERANCE_S
        if want["safe_time_us"] is not None:
            assert hlc.iso(want["safe_time_us"]) in row["safe_time:text"]
        assert row["state:text"] == "LIVE" and row["role:text"] == "replica"
    assert rows[("events", "primary")]["role:text"] == "leader (2 partitions)"
    assert rows[("events", "dr")]["rpo:text"] == "15 min met" and rows[("orders", "dr")]["rpo:text"] == "-"
    assert "breached" not in rows[("events", "dr")]["class"]
    # the last round links to the replication DAG's run whose data interval ended then
    end = status[("events", "dr")]["last_round_end_us"]
    assert (
        f"/dags/segrep_replicate_events/runs?run_after_gte={hlc.iso(end - 1_000_000)}".replace(":", "%3A") in page.text
    )


def test_a_user_who_may_not_read_the_dags_is_refused(lag_env: Env, tokens: Tokens) -> None:
    c = client(lag_env)
    for path in ("/", "/api/overview", "/metrics", "/?dag_id=segrep_replicate_events"):
        refused = c.get(path, headers=tokens.header("nobody"))
        assert refused.status_code == 403, (path, refused.text)
        assert "may not read the segrep DAGs" in refused.text and "events" not in refused.text.replace(path, "")
    assert "may not read the segrep DAGs" in c.get("/api/overview", headers=tokens.header("nobody")).json()["detail"]
    for path in ("/api/overview", "/metrics"):  # no credentials, or a token Airflow did not sign: log in (401)
        for headers in ({}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Bearer " + tokens.viewer[:-4]}):
            answer = c.get(path, headers=headers)
            assert answer.status_code == 401, (path, headers, answer.text)
            assert answer.headers["www-authenticate"] == "Bearer" and "not authenticated" in answer.json()["detail"]
    to_login = c.get("/", follow_redirects=False)  # the page sends a visitor without a session to the login
    assert to_login.status_code == 307 and "/auth/login?next=" in to_login.headers["location"]
    assert c.get("/", headers=tokens.header("admin")).status_code == 200


def test_prometheus_endpoint_carries_the_status_values(lag_env: Env, tokens: Tokens) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    c = client(lag_env)
    got = c.get("/metrics", headers=tokens.header("viewer"))
    assert got.status_code == 200 and got.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {
        (s.name, s.labels["table"], s.labels["site"]): s.value
        for family in text_string_to_metric_families(got.text)
        for s in family.samples
    }
    for key, want in cli_status(lag_env).items():
        table, site = key
        assert samples[("segrep_pending_segments", table, site)] == want["pending_segments"]
        assert samples[("segrep_pending_bytes", table, site)] == want["pending_bytes"]
        if want["lag_s"] is None:
            assert ("segrep_lag_seconds", table, site) not in samples  # unknown is left out, not 0
        else:  # a replica that never had a round has one too: counted from its start
            assert abs(samples[("segrep_lag_seconds", table, site)] - want["lag_s"]) <= LAG_TOLERANCE_S
        if want["safe_time_us"] is None:
            assert ("segrep_safe_time_timestamp_seconds", table, site) not in samples
        else:
            assert samples[("segrep_safe_time_timestamp_seconds", table, site)] == pytest.approx(
                want["safe_time_us"] / 1e6
            )
    assert samples[("segrep_rpo_seconds", "events", "dr")] == 900
    assert samples[("segrep_rpo_breached", "events", "dr")] == 0
    assert ("segrep_rpo_seconds", "orders", "dr") not in samples
    assert "# TYPE segrep_lag_seconds gauge" in got.text and "# HELP segrep_pending_bytes " in got.text


def test_a_breached_objective_is_red_on_the_page_in_the_metrics_and_in_status(
    lag_env: Env, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lag measured an hour from now is past the 15-minute objective."""
    later = hlc.now_us() + 3600 * 1_000_000
    monkeypatch.setattr(hlc, "now_us", lambda: later)
    c = client(lag_env)
    rows = page_rows(c.get("/", headers=tokens.header("viewer")).text)
    for site in ("dr", "edge"):
        assert "breached" in rows[("events", site)]["class"]
        assert rows[("events", site)]["rpo:text"] == "15 min BREACHED"
    assert "breached" not in rows[("orders", "dr")]["class"]
    metrics = c.get("/metrics", headers=tokens.header("viewer")).text
    assert 'segrep_rpo_breached{site="dr",table="events"} 1.0' in metrics
    records = {r.target: r for r in status_rows(lag_env.catalog, "events", rpo={"events": 900})}
    assert records["dr"].rpo_breached and records["dr"].lag_s is not None and records["dr"].lag_s > 3600


def test_the_chart_data_comes_from_the_round_reports(lag_env: Env, tokens: Tokens) -> None:
    from segrep.replication.orchestrator import run_round
    from tests.support.rounds import no_spark

    assert run_round(lag_env.catalog, lag_env.defs, "events", submit=no_spark).status == "ok"
    doc = client(lag_env).get("/api/overview", headers=tokens.header("viewer")).json()
    series = {(s["table"], s["site"], s["window"]): s for s in doc["lag_history"]}
    sites = (("events", "dr"), ("events", "edge"), ("orders", "dr"))
    assert doc["windows"] == ["1h", "6h", "24h", "7d"]
    assert set(series) == {(t, s, w) for t, s in sites for w in doc["windows"]}
    # never replicated: no round, no point; its live point is behind from the replica's start (issue 34 item 4)
    lag = {(r["table"], r["target"]): r["lag_s"] for r in doc["replication"]}
    assert series[("orders", "dr", "24h")]["points"] == []
    assert series[("orders", "dr", "24h")]["live"][1] == lag[("orders", "dr")] and lag[("orders", "dr")] > 0
    for window in doc["windows"]:
        points = series[("events", "dr", window)]["points"]
        # two rounds: after the first; before and after the second
        assert len(points) == 3 and [p[3] for p in points] == ["ok", "ok", "ok"]
        assert all(p[1] >= 0 for p in points) and points == sorted(points, key=lambda p: p[0])
        assert series[("events", "dr", window)]["rpo_s"] == 900 and series[("events", "dr", window)]["slot_s"] is None
    assert series[("events", "dr", "1h")]["window_s"] == 3600 and series[("events", "dr", "7d")]["window_s"] == 604800


def test_the_chart_window_is_chosen_and_ends_at_the_live_lag(
    lag_env: Env, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica that stopped moving an hour ago: its last round shows a small lag, its live point (now against
    the safe time) the lag the table shows; the page draws the window asked for, 6 h unless asked."""
    later = hlc.now_us() + 3600 * 1_000_000
    monkeypatch.setattr(hlc, "now_us", lambda: later)
    c = client(lag_env)
    doc = c.get("/api/overview?window=6h", headers=tokens.header("viewer")).json()
    assert doc["windows"] == ["6h"] and {s["window"] for s in doc["lag_history"]} == {"6h"}
    lag = {(r["table"], r["target"]): r["lag_s"] for r in doc["replication"]}
    for s in doc["lag_history"]:
        assert s["live"] == [later // 1000, lag[(s["table"], s["site"])]] and s["live"][1] > 3600
        if (s["table"], s["site"]) == ("orders", "dr"):  # never replicated: behind since its start, no round
            assert s["points"] == []
            continue
        assert s["points"] and max(p[1] for p in s["points"]) < 60  # the rounds' own points: seconds behind
    assert c.get("/api/overview?window=1h", headers=tokens.header("viewer")).json()["lag_history"][0]["points"] == []

    for window, seconds in (("1h", 3600), (None, 21600), ("7d", 604800)):
        body = c.get("/" if window is None else f"/?window={window}", headers=tokens.header("viewer")).text
        data = json.loads(re.search(r'<script type="application/json" id="lag-data">(.*?)</script>', body, re.S)[1])
        assert {s["window_s"] for s in data} == {seconds}, window
        current = re.findall(r'<a class="window" href="([^"]*)" data-window="(\d+)" aria-current="true"', body)
        assert [int(w) for _, w in current] == [seconds]
    assert re.search(
        r'href="\?dag_id=segrep_replicate_events&amp;window=1h"',
        c.get("/?dag_id=segrep_replicate_events", headers=tokens.header("viewer")).text,
    )  # the window keeps the DAG's tab
    for bad in ("2h", "../1h", ""):
        answer = c.get("/api/overview", params={"window": bad}, headers=tokens.header("viewer"))
        assert answer.status_code == 422 and "invalid window" in answer.json()["detail"], answer.text
        assert "1h, 6h, 24h, 7d" in answer.json()["detail"]
        assert c.get("/", params={"window": bad}, headers=tokens.header("viewer")).status_code == 422


def test_each_window_keeps_its_own_resolution(lag_env: Env, tokens: Tokens) -> None:
    """Two hours of rounds every 4 s (two points each: 1,800 an hour) with one slow round: the last hour keeps
    5-second slots, the week 14-minute slots; at most 720 points each, and the peak is in every one."""
    from segrep.catalog import models as m

    now = hlc.now_us()
    with lag_env.catalog.write() as s:
        table_id = s.scalar(select(m.Table.table_id).where(m.Table.name == "events"))
        rows = []
        for k in range(1800):
            end = now - (1800 - k) * 4_000_000
            lag = 600_000_000 if k == 1750 else 2_000_000  # the round 200 s ago left dr 10 min behind
            rows.append(
                {
                    "table_id": table_id,
                    "interval_start_us": end - 4_000_000,
                    "interval_end_us": end,
                    "status": "ok",
                    "started_us": end + 1_000_000,
                    "finished_us": end + 3_000_000,
                    "report": {"targets": {"dr": {"site": "dr", "status": "ok"}}, "safe_time_us": {"dr": end - lag}},
                }
            )
        s.execute(m.Round.__table__.insert(), rows)
    doc = client(lag_env).get("/api/overview", headers=tokens.header("viewer")).json()
    series = {s["window"]: s for s in doc["lag_history"] if (s["table"], s["site"]) == ("events", "dr")}
    for window, seconds in (("1h", 3600), ("6h", 21600), ("24h", 86400), ("7d", 604800)):
        got = series[window]
        assert got["slot_s"] == pytest.approx(seconds / 720), window
        assert 0 < len(got["points"]) <= 720 and max(p[1] for p in got["points"]) >= 600, window
    # the last hour in 5-second slots (nearly every one has a point); a day's 2-minute slots: 60 in 2 h
    assert (
        len(series["1h"]["points"]) >= 700 and len(series["24h"]["points"]) <= 61 and len(series["7d"]["points"]) <= 10
    )


def test_the_dag_tab_picks_out_the_dags_table(lag_env: Env, tokens: Tokens) -> None:
    c = client(lag_env)
    tab = c.get("/?dag_id=segrep_split_orders", headers=tokens.header("viewer")).text
    assert {t for t, _ in page_rows(tab)} == {"orders"} and "DAG <code>segrep_split_orders</code>: table orders" in tab
    other = c.get("/?dag_id=some_other_dag", headers=tokens.header("viewer")).text
    assert {t for t, _ in page_rows(other)} == {"events", "orders"} and "every table shown" in other


def test_the_split_dags_tab_lists_the_partitions_its_form_can_take(lag_env: Env, tokens: Tokens) -> None:
    """The split form has no default partition (a retired one was the old default); the split DAG's tab lists
    the serving partitions with their key ranges: after an async split, the children and not the parent."""
    from segrep.split.workflow import start_split

    with lag_env.catalog.read() as s:
        second = sorted(s.scalars(select(m.Partition.partition_id).join(m.Table).where(m.Table.name == "orders")))[1]
    ref = start_split(lag_env.catalog, "orders", second, [200000], is_async=True)
    tab = client(lag_env).get("/?dag_id=segrep_split_orders", headers=tokens.header("viewer")).text
    rows = re.findall(
        r'<tr data-partition="(\d+)"><td>\d+</td><td>([^<]*)</td><td>(\w+)</td><td>([^<]*)</td></tr>', tab
    )
    assert [r[1:] for r in rows] == [
        ("[-inf, 150000)", "LIVE", "primary"),
        ("[150000, 200000)", "LIVE", "primary"),
        ("[200000, 300000)", "LIVE", "primary"),
        ("[300000, 450000)", "LIVE", "primary"),
        ("[450000, +inf)", "LIVE", "primary"),
    ], rows
    assert str(second) not in {r[0] for r in rows} and {int(r[0]) for r in rows[1:3]} == set(ref.children)
    other = client(lag_env).get("/?dag_id=segrep_replicate_orders", headers=tokens.header("viewer")).text
    assert 'id="split-candidates"' not in other


def test_the_vendored_chart_library_is_the_published_file(lag_env: Env) -> None:
    path = PLUGINS / "segrep_page" / "static" / "chart.umd.min.js"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == CHART_JS_SHA256
    served = client(lag_env).get("/static/chart.umd.min.js")
    assert served.status_code == 200 and served.content == path.read_bytes()
    assert re.search(r"Chart\.js v4\.6\.1", served.text[:200])


def test_no_module_of_the_page_is_loaded_by_airflow_as_a_plugin() -> None:
    """Airflow runs every .py file under plugins/ as a top-level module unless .airflowignore says otherwise."""
    ignored = (PLUGINS / ".airflowignore").read_text().splitlines()
    assert "segrep_page/" in ignored
    assert sorted(p.name for p in PLUGINS.glob("*.py")) == ["segrep_plugin.py"]
    assert Path(PLUGINS / "segrep_page" / "__init__.py").exists()


def test_the_last_verify_of_each_site_is_shown(lag_env: Env, tokens: Tokens) -> None:
    from segrep.maintenance.verify import verify

    verify(lag_env.catalog, "events")
    c = client(lag_env)
    status = cli_status(lag_env)
    sites = {
        (r["table"], r["site"]): r for r in c.get("/api/overview", headers=tokens.header("viewer")).json()["sites"]
    }
    rows = page_rows(c.get("/", headers=tokens.header("viewer")).text)
    for key in (("events", "dr"), ("events", "edge")):
        checked = status[key]["last_verified"]
        assert checked is not None and checked["differences"] == 0
        assert sites[key]["last_verified_us"] == checked["finished_us"] and sites[key]["verify_differences"] == 0
        assert rows[key]["last_verified"] == str(checked["finished_us"])
        assert rows[key]["last_verified:text"] == f"{hlc.iso(checked['finished_us'])} equal"
    assert status[("orders", "dr")]["last_verified"] is None and rows[("orders", "dr")]["last_verified:text"] == "-"


def test_a_table_filter_that_matches_nothing_returns_nothing(lag_env: Env, tokens: Tokens) -> None:
    c = client(lag_env)
    viewer = tokens.header("viewer")
    only = c.get("/api/overview?table=events", headers=viewer).json()
    assert {r["table"] for r in only["replication"]} == {"events"} and {d["table"] for d in only["dags"]} == {"events"}
    assert {s["table"] for s in only["lag_history"]} == {"events"}
    assert {t for t, _ in page_rows(c.get("/?table=orders", headers=viewer).text)} == {"orders"}
    for path in ("/api/overview?table=nosuch", "/?table=nosuch"):
        answer = c.get(path, headers=viewer)
        assert answer.status_code == 404, (path, answer.text)
        text = html.unescape(answer.text)
        assert "no table 'nosuch' in the catalog that you may read" in text and "events" not in text
    for bad in ("../etc", "Events", "", "x" * 300):
        for path in ("/api/overview", "/"):
            answer = c.get(path, params={"table": bad}, headers=viewer)
            assert answer.status_code == 422, (path, bad, answer.text)
            assert "invalid table name" in answer.text and "a-z, 0-9 and _" in html.unescape(answer.text)
            assert "x" * 100 not in answer.text  # a long value is cut, not echoed whole
    # a replication DAG's tab whose table is not in the catalog: no rows, and why
    tab = c.get("/?dag_id=segrep_replicate_nosuch", headers=viewer).text
    assert page_rows(tab) == {} and "table nosuch is not in the catalog, or you may not read its DAG" in tab


def _definitions_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "conf" / "segrep.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def _unavailable(config: Path, tokens: Tokens, hidden: str) -> str:
    """The 503 of each route for the definitions ``config``; its message, checked to carry no path."""
    from fastapi.testclient import TestClient

    from segrep_page.app import create_app
    from segrep_page.source import Source

    c = TestClient(create_app(Source(str(config))))
    details = set()
    for path in ("/api/overview", "/metrics", "/"):
        answer = c.get(path, headers=tokens.header("viewer"))
        assert answer.status_code == 503, (path, answer.text)
        assert hidden not in answer.text and str(config.parent) not in answer.text, answer.text
        if path != "/":
            details.add(answer.json()["detail"])
        else:
            assert "problem" in answer.text and answer.headers["content-type"].startswith("text/html")
    assert len(details) == 1
    return details.pop()


def test_segrep_that_cannot_be_read_is_a_503_naming_the_part_without_a_path(
    tmp_path: Path, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    from segrep_page.source import NOT_INITIALISED, UNREACHABLE
    from tests.support.airflow_services import free_port

    missing = tmp_path / "conf" / "segrep.yaml"
    assert _unavailable(missing, tokens, str(tmp_path)) == (
        "segrep's definitions file segrep.yaml cannot be read (No such file or directory): check SEGREP_CONFIG"
    )
    broken = _definitions_file(tmp_path, "sites: [\n")
    message = _unavailable(broken, tokens, str(tmp_path))
    assert message.startswith("segrep's definitions cannot be read: segrep.yaml: not valid YAML"), message

    config = _definitions_file(tmp_path, RPO_YAML)
    never_made = tmp_path / "db" / "catalog.db"  # `segrep init` never ran: no file
    monkeypatch.setenv("SEGREP_CATALOG_URL", f"sqlite:///{never_made}")
    assert (
        _unavailable(config, tokens, str(tmp_path))
        == NOT_INITIALISED
        == "the catalog is not initialised: run segrep init"
    )
    never_made.parent.mkdir()
    with sqlite3.connect(never_made) as db:  # a database, but no segrep table in it
        db.execute("create table other (a integer)")
    assert _unavailable(config, tokens, str(tmp_path)) == NOT_INITIALISED
    assert never_made.stat().st_size > 0

    monkeypatch.setenv("SEGREP_CATALOG_URL", f"postgresql://segrep:secret@127.0.0.1:{free_port()}/nowhere")
    assert _unavailable(config, tokens, "secret") == UNREACHABLE
    assert "127.0.0.1" not in UNREACHABLE


@pytest.mark.postgres
def test_a_postgresql_catalog_without_tables_is_not_initialised(
    pg_server: str, tmp_path: Path, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    from segrep_page.source import NOT_INITIALISED
    from tests.support.env import pg_schema_url

    schema = pg_schema_url(pg_server)
    url = next(schema)
    try:
        monkeypatch.setenv("SEGREP_CATALOG_URL", url)
        assert _unavailable(_definitions_file(tmp_path, RPO_YAML), tokens, "postgresql") == NOT_INITIALISED
    finally:
        schema.close()


def _samples(text: str) -> set[tuple[str, str]]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.labels["table"], s.labels["site"]) for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_scraper_reads_the_metrics_with_the_static_token(
    lag_env: Env, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$SEGREP_METRICS_TOKEN, else the Variable segrep_metrics_token: every table's metrics and nothing else;
    a wrong token is 401 with WWW-Authenticate, an Airflow user's token works as before."""
    from airflow.models.variable import Variable

    token = "scrape-" + "5" * 40
    monkeypatch.setenv("SEGREP_METRICS_TOKEN", token)
    c = client(lag_env)
    bearer = {"Authorization": f"Bearer {token}"}
    got = c.get("/metrics", headers=bearer)
    assert got.status_code == 200, got.text
    assert _samples(got.text) == {("events", "dr"), ("events", "edge"), ("orders", "dr")}
    for path in ("/api/overview", "/"):  # the token opens the metrics only
        refused = c.get(path, headers=bearer, follow_redirects=False)
        assert refused.status_code in (401, 307) and "events" not in refused.text, (path, refused.text)
    for wrong in (token[:-1], token + "x", "", "scrape"):
        answer = c.get("/metrics", headers={"Authorization": f"Bearer {wrong}"})
        assert answer.status_code == 401 and answer.headers["www-authenticate"] == "Bearer", (wrong, answer.text)
        assert "metrics token" in answer.json()["detail"] and token not in answer.text
    assert c.get("/metrics", headers=tokens.header("viewer")).status_code == 200  # Airflow users as before
    assert c.get("/metrics", headers=tokens.header("nobody")).status_code == 403  # valid user, no right: 403

    monkeypatch.delenv("SEGREP_METRICS_TOKEN")
    assert client(lag_env).get("/metrics", headers=bearer).status_code == 401  # configured nowhere
    Variable.set("segrep_metrics_token", f"{token}\n")  # as pasted into the UI
    try:
        from_variable = client(lag_env)  # a new app: the Variable is read at its first scrape
        assert from_variable.get("/metrics", headers=bearer).status_code == 200
        assert from_variable.get("/metrics", headers={"Authorization": "Bearer other"}).status_code == 401
    finally:
        Variable.delete("segrep_metrics_token")


def test_a_failed_paused_or_missing_replication_dag_is_shown_as_such(
    dag_env: Env, tokens: Tokens, airflow_rows: AirflowRows
) -> None:
    """The catalog's last round of pgt_failing is ok, but its DAG's newest finished run failed: the row says
    so in red and links that run and each failed task's log; a paused DAG and one Airflow does not know are
    problems too. Nothing of a problem row is green."""
    failing, paused, missing = DAG_TABLES
    dag = {t: f"segrep_replicate_{t}" for t in DAG_TABLES}
    airflow_rows.dag(dag[failing])
    airflow_rows.run(dag[failing], "scheduled__ok", "success", minutes_ago=30)
    airflow_rows.run(
        dag[failing], "scheduled__bad", "failed", minutes_ago=20, failed=(("fast_forward", 1), ("commit", -1))
    )
    airflow_rows.dag(dag[paused], paused=True)
    airflow_rows.run(dag[paused], "scheduled__1", "failed", minutes_ago=10, failed=(("round", -1),))
    c = client(dag_env)
    viewer = tokens.header("viewer")

    doc = c.get("/api/overview", headers=viewer).json()
    dags = {d["table"]: d for d in doc["dags"]}
    bad = dags[failing]
    assert (bad["health"], bad["problem"], bad["paused"], bad["in_airflow"]) == ("failed", True, False, True)
    run_url = f"/dags/{dag[failing]}/runs/scheduled__bad"
    assert bad["last_finished_run"]["run_id"] == "scheduled__bad" and bad["last_finished_run"]["url"] == run_url
    assert bad["latest_run"]["state"] == "failed"
    assert [(t["task"], t["log_url"]) for t in bad["failed_tasks"]] == [
        ("fast_forward[1]", f"{run_url}/tasks/fast_forward/mapped/1"),
        ("commit", f"{run_url}/tasks/commit"),
    ]
    assert "FAILED (task fast_forward[1], commit)" in bad["summary"]
    assert (dags[paused]["health"], dags[paused]["paused"], dags[paused]["problem"]) == ("paused", True, True)
    assert dags[paused]["summary"] == (  # paused after a failure: both said, the failed task's log linked
        f"{dag[paused]} is PAUSED: no round runs; its newest finished run FAILED (task round)"
    )
    assert dags[paused]["failed_tasks"][0]["log_url"] == f"/dags/{dag[paused]}/runs/scheduled__1/tasks/round"
    assert (dags[missing]["health"], dags[missing]["in_airflow"], dags[missing]["problem"]) == (
        "not in Airflow",
        False,
        True,
    )
    records = {(r["table"], r["target"]): r for r in doc["replication"]}
    assert records[(failing, "dr")]["last_round_status"] == "ok"  # segrep status's record, as it is
    for r in doc["sites"]:
        assert r["attention"] == dags[r["table"]]["summary"] and r["dag_health"] == dags[r["table"]]["health"]

    page = c.get("/", headers=viewer).text
    rows = page_rows(page)
    row = rows[(failing, "dr")]
    assert "dag-failed" in row["class"] and "dag-problem" in row["class"]
    assert row["dag:text"].startswith("FAILED") and row["dag"] == "failed"
    assert row["last_round:text"].endswith("DAG run FAILED") and "ok" not in row["last_round:text"]
    assert row["rpo:text"] == "15 min met"
    assert re.search(r'class="good"[^>]*>15 min met', page) is None  # met, but not green while the DAG fails
    assert f'href="{run_url}/tasks/commit"' in page and f'href="{run_url}/tasks/fast_forward/mapped/1"' in page
    assert f'<a class="failed-run" href="{run_url}">' in page
    attention = page[page.index('id="attention"') : page.index("</section>", page.index('id="attention"'))]
    assert all(f'data-table="{t}"' in attention for t in DAG_TABLES) and f"{run_url}/tasks/commit" in attention
    for table, word, text in (
        (paused, "dag-paused", "DAG PAUSED"),
        (missing, "dag-not-in-airflow", "DAG NOT IN AIRFLOW"),
    ):
        assert word in rows[(table, "dr")]["class"] and rows[(table, "dr")]["last_round:text"].endswith(text)

    # a run under way after the failure: still failed (the newest finished run), the running one linked
    airflow_rows.run(dag[failing], "manual__now", "running", minutes_ago=1)
    bad = {d["table"]: d for d in c.get(f"/api/overview?table={failing}", headers=viewer).json()["dags"]}[failing]
    assert bad["health"] == "failed" and bad["latest_run"]["run_id"] == "manual__now"
    assert "a run is running" in bad["summary"]
    # then a run that succeeds: the row is the catalog's again
    airflow_rows.run(dag[failing], "scheduled__fixed", "success", minutes_ago=0.5)
    row = page_rows(c.get(f"/?table={failing}", headers=viewer).text)[(failing, "dr")]
    assert "dag-problem" not in row["class"] and row["dag:text"] == "success"
    assert row["last_round:text"].endswith("ok (dr: ok)")


def test_the_page_works_when_airflows_dag_states_cannot_be_read(
    lag_env: Env, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.exc import OperationalError

    from segrep_page import airflow_state

    def unreachable(dag_ids: list[str]) -> None:
        raise OperationalError("select ...", {}, Exception("the metadata database went away"))

    monkeypatch.setattr(airflow_state, "_read", unreachable)
    c = client(lag_env)
    doc = c.get("/api/overview", headers=tokens.header("viewer")).json()
    assert {d["health"] for d in doc["dags"]} == {"unknown"} and not any(d["problem"] for d in doc["dags"])
    assert len(doc["replication"]) == 3
    rows = page_rows(c.get("/", headers=tokens.header("viewer")).text)
    assert rows[("events", "dr")]["dag:text"] == "unknown" and rows[("events", "dr")]["pending_segments"] == "2"


def test_each_sites_schema_version_is_shown_beside_the_tables(lag_env: Env, tokens: Tokens) -> None:
    """`segrep apply` adds a column to `events` and the leader writes at version 2: its row says v2, the
    replicas' (not replicated since) "v1 (table v2)", plainly (not an error), in the JSON and on the page."""
    import pyarrow as pa

    from segrep.catalog.apply import apply_definitions
    from segrep.data.writer import write_batch
    from tests.support.tables import batch

    lag_env.config.write_text(RPO_YAML.replace("at: timestamp}", "at: timestamp, note: string}"))
    apply_definitions(lag_env.catalog, lag_env.defs)
    new = batch(range(30, 40), "c")
    write_batch(lag_env.catalog, "events", new.append_column("note", pa.array(["n"] * new.num_rows)))

    c = client(lag_env)
    api = c.get("/api/overview", headers=tokens.header("viewer"))
    assert api.status_code == 200, api.text
    sites = {(r["table"], r["site"]): r for r in api.json()["sites"]}
    shown = {key: (r["schema_version"], r["table_schema_version"], r["schema"]) for key, r in sites.items()}
    assert shown == {
        ("events", "primary"): (2, 2, "v2"),
        ("events", "dr"): (1, 2, "v1 (table v2)"),
        ("events", "edge"): (1, 2, "v1 (table v2)"),
        ("orders", "primary"): (1, 1, "v1"),
        ("orders", "dr"): (None, 1, "- (table v1)"),  # never replicated: it holds no segment
    }
    replication = {(r["table"], r["target"]): r["schema"] for r in api.json()["replication"]}
    assert replication[("events", "dr")] == "v1 (table v2)"
    assert all(sites[key]["state"] == "LIVE" for key in sites)  # an older version is no state of its own

    rows = page_rows(c.get("/", headers=tokens.header("viewer")).text)
    assert rows[("events", "primary")]["schema:text"] == "v2" and rows[("events", "primary")]["schema"] == "2"
    assert rows[("events", "dr")]["schema:text"] == "v1 (table v2)" and rows[("events", "dr")]["schema"] == "1"
    assert rows[("orders", "dr")]["schema:text"] == "- (table v1)"
