"""The plugin's FastAPI app through its test client, authorised by Airflow's real auth manager (SimpleAuthManager,
JWTs it signed): the page's numbers are ``segrep status``'s, a user who may not read the segrep DAGs is refused,
the Prometheus text carries the same values, and a breached objective is marked."""

from __future__ import annotations

import hashlib
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.core import hlc
from segrep.replication.status import status_rows
from tests.support.cli import cli
from tests.support.env import Env
from tests.support.plugin_page import PLUGINS, Tokens, app_for

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


def page_rows(html: str) -> dict[tuple[str, str], dict[str, str]]:
    parser = Rows()
    parser.feed(html)
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
        assert "may not read the segrep DAGs" in refused.json()["detail"] and "events" not in refused.text
    for path in ("/api/overview", "/metrics"):
        assert c.get(path).status_code == 401
        assert c.get(path, headers={"Authorization": "Bearer not-a-token"}).status_code in (401, 403)
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
    series = {(s["table"], s["site"], s["window_s"]): s for s in doc["lag_history"]}
    sites = (("events", "dr"), ("events", "edge"), ("orders", "dr"))
    assert set(series) == {(t, s, w) for t, s in sites for w in (86400, 604800)}
    assert series[("orders", "dr", 86400)]["points"] == []  # never replicated: no round, no point
    points = series[("events", "dr", 86400)]["points"]
    # two rounds: after the first; before and after the second
    assert len(points) == 3 and [p[3] for p in points] == ["ok", "ok", "ok"]
    assert all(p[1] >= 0 for p in points) and points == sorted(points, key=lambda p: p[0])
    assert series[("events", "dr", 86400)]["rpo_s"] == 900


def test_the_dag_tab_picks_out_the_dags_table(lag_env: Env, tokens: Tokens) -> None:
    c = client(lag_env)
    html = c.get("/?dag_id=segrep_split_orders", headers=tokens.header("viewer")).text
    assert {t for t, _ in page_rows(html)} == {
        "orders"
    } and "DAG <code>segrep_split_orders</code>: table orders" in html
    other = c.get("/?dag_id=some_other_dag", headers=tokens.header("viewer")).text
    assert {t for t, _ in page_rows(other)} == {"events", "orders"} and "every table shown" in other


def test_the_split_dags_tab_lists_the_partitions_its_form_can_take(lag_env: Env, tokens: Tokens) -> None:
    """The split form has no default partition (a retired one was the old default); the split DAG's tab lists
    the serving partitions with their key ranges: after an async split, the children and not the parent."""
    from segrep.split.workflow import start_split

    with lag_env.catalog.read() as s:
        second = sorted(s.scalars(select(m.Partition.partition_id).join(m.Table).where(m.Table.name == "orders")))[1]
    ref = start_split(lag_env.catalog, "orders", second, [200000], is_async=True)
    html = client(lag_env).get("/?dag_id=segrep_split_orders", headers=tokens.header("viewer")).text
    rows = re.findall(
        r'<tr data-partition="(\d+)"><td>\d+</td><td>([^<]*)</td><td>(\w+)</td><td>([^<]*)</td></tr>', html
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
