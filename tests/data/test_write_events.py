"""A committed write to an on_write table tells Airflow (segrep.data.write_events), against a loopback server
that answers as Airflow 3.3's api-server does (tests/support/fake_airflow_api.py; the real api-server and
scheduler are in tests/dags/test_rounds_on_write.py).

One event per write, with the table and the write's commit in ``extra``; none for a table on a time schedule,
nor without the definitions; Airflow down, hung, unconfigured or refusing the login: the write is committed
all the same and the failure is said in one line naming the table and the API address, never the password.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from sqlalchemy import func, select

from segrep.catalog import models as m
from segrep.data import airflow_api, write_events
from segrep.data.reader import read_table
from segrep.data.write_events import EventOutcome, writes_uri
from segrep.data.writer import write_batch, write_event_extra
from tests.support.airflow import events_batch, events_yaml
from tests.support.cli import cli
from tests.support.env import Env, make_env, sqlite_url
from tests.support.fake_airflow_api import FakeAirflow, fake_airflow

PASSWORD = "writer-pw-9f3k"
URI = "segrep-writes://events/"


@pytest.fixture
def on_write_env(tmp_path: Path) -> Iterator[Env]:
    """`events` replicates on write (every 5 s at most); `orders` keeps the default hourly schedule."""
    env = make_env(tmp_path, sqlite_url(tmp_path), events_yaml({"schedule": "on_write", "min_interval": "5s"}))
    yield env
    env.catalog.dispose()


@pytest.fixture(autouse=True)
def fresh_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """No token or asset id from another test; no API address from the environment the tests run in."""
    monkeypatch.setattr(airflow_api, "_tokens", {})
    monkeypatch.setattr(write_events, "_asset_ids", {})
    for var in (airflow_api.URL_ENV, airflow_api.USER_ENV, airflow_api.PASSWORD_ENV, airflow_api.TIMEOUT_ENV):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def airflow(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAirflow]:
    with fake_airflow(users={"writer": PASSWORD}) as api:
        monkeypatch.setenv(airflow_api.URL_ENV, api.base_url)
        monkeypatch.setenv(airflow_api.USER_ENV, "writer")
        monkeypatch.setenv(airflow_api.PASSWORD_ENV, PASSWORD)
        yield api


def segment_count(env: Env) -> int:
    with env.catalog.read() as s:
        return int(s.scalar(select(func.count()).select_from(m.Segment)) or 0)


def test_writes_uri_cannot_be_a_replica_assets() -> None:
    """A site named "writes" cannot make segrep://<site>/<table> equal the writes asset: another scheme."""
    assert writes_uri("orders") == "segrep-writes://orders/"
    assert not writes_uri("orders").startswith("segrep://")


def test_a_write_to_an_on_write_table_emits_one_event_with_its_commit(on_write_env: Env, airflow: FakeAirflow) -> None:
    env = on_write_env
    # uri_pattern is a substring match (ILIKE): 150 other assets match it and come first, over two pages
    for i in range(150):
        airflow.add_asset(f"{URI}old{i}")
    airflow.add_asset("segrep://writes/events")  # the replica asset of a site named "writes"
    asset_id = airflow.add_asset(URI)

    result = write_batch(env.catalog, "events", events_batch(list(range(20)), "a"), defs=env.defs)

    assert result.event is not None and result.event.outcome is EventOutcome.SENT, result.event
    assert [e["id"] for e in airflow.events] == [result.event.event_id]
    event = airflow.events[0]
    assert event["asset_id"] == asset_id
    extra = event["extra"]
    assert extra == {**write_event_extra(result), "from_rest_api": True}
    assert extra["table"] == "events" and extra["rows_written"] == 20 and extra["deleted"] is False
    assert extra["committed_us"] == result.committed_us and extra["committed"].startswith("20")
    assert extra["max_version"] == max(seg.version for seg in result.segments)
    assert sorted(s["segment_id"] for s in extra["segments"]) == sorted(s.segment_id for s in result.segments)
    assert extra["segment_count"] == len(result.segments) == 2  # both partitions
    assert result.event.detail == f"asset event {event['id']} on {URI} sent to {airflow.base_url}"

    before = len(airflow.requests)
    keys = events_batch([1, 2], "b").select(["tenant", "seq"])
    again = write_batch(env.catalog, "events", keys, delete=True, defs=env.defs)
    assert again.event is not None and again.event.sent
    assert airflow.requests[before:] == [("POST", "/api/v2/assets/events")]  # token and asset id cached
    assert airflow.events[-1]["extra"]["deleted"] is True and len(airflow.events) == 2


def test_no_event_for_a_table_on_a_time_schedule_or_without_definitions(
    on_write_env: Env, airflow: FakeAirflow
) -> None:
    from tests.support.tables import orders

    airflow.add_asset(URI)
    result = write_batch(on_write_env.catalog, "orders", orders([1, 2, 3]), defs=on_write_env.defs)
    assert result.event is None and result.committed_us is not None
    result = write_batch(on_write_env.catalog, "events", events_batch([1], "a"))  # no definitions: no policy
    assert result.event is None
    empty = write_batch(on_write_env.catalog, "events", events_batch([], "a"), defs=on_write_env.defs)
    assert empty.event is None and empty.committed_us is None  # nothing committed, nothing to tell
    assert airflow.requests == [] and airflow.events == []


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_airflow_down_the_write_is_committed_and_a_warning_names_table_and_address(
    on_write_env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = on_write_env
    address = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv(airflow_api.URL_ENV, address)
    monkeypatch.setenv(airflow_api.USER_ENV, "writer")
    monkeypatch.setenv(airflow_api.PASSWORD_ENV, PASSWORD)
    batch_file = tmp_path / "batch.parquet"
    pq.write_table(events_batch(list(range(10)), "a"), batch_file)

    code, out, err = cli(env, "write", "events", str(batch_file))

    assert code == 0, err
    assert out.startswith("wrote 10 row(s) of events")
    warning = [line for line in err.splitlines() if line.startswith("segrep: warning: ")]
    assert len(warning) == 1, err
    assert f"write to events committed, but its asset event {URI} was not sent to Airflow at {address}" in warning[0]
    assert "cannot reach it" in warning[0] and "fallback schedule" in warning[0] and "within 300 s" in warning[0]
    assert PASSWORD not in out + err
    assert read_table(env.catalog, "events").num_rows == 10 and segment_count(env) == 2


def test_not_configured_says_which_variable_and_still_writes(on_write_env: Env, tmp_path: Path) -> None:
    batch_file = tmp_path / "batch.parquet"
    pq.write_table(events_batch(list(range(4)), "a"), batch_file)
    code, _out, err = cli(on_write_env, "write", "events", str(batch_file))
    assert code == 0, err
    assert "segrep: warning: write to events committed; Airflow was not told (SEGREP_AIRFLOW_API_URL is not set)" in err
    assert read_table(on_write_env.catalog, "events").num_rows == 4

    result = write_batch(on_write_env.catalog, "events", events_batch([9], "b"), defs=on_write_env.defs)
    assert result.event is not None and result.event.outcome is EventOutcome.NOT_CONFIGURED


def test_a_refused_login_is_named_without_the_password(
    on_write_env: Env, airflow: FakeAirflow, monkeypatch: pytest.MonkeyPatch
) -> None:
    airflow.add_asset(URI)
    monkeypatch.setenv(airflow_api.PASSWORD_ENV, "wrong-pw-77")
    result = write_batch(on_write_env.catalog, "events", events_batch([1, 2], "a"), defs=on_write_env.defs)
    assert result.event is not None and result.event.outcome is EventOutcome.FAILED
    assert "/auth/token answered 401 for user 'writer'" in result.event.detail
    assert "wrong-pw-77" not in result.event.detail and "wrong-pw-77" not in repr(result.event)
    assert airflow.events == [] and read_table(on_write_env.catalog, "events").num_rows == 2


def test_an_expired_token_and_a_recreated_asset_are_recovered(on_write_env: Env, airflow: FakeAirflow) -> None:
    env = on_write_env
    old_id = airflow.add_asset(URI)
    first = write_batch(env.catalog, "events", events_batch([1], "a"), defs=env.defs)
    assert first.event is not None and first.event.sent

    airflow.expire_tokens()  # the cached token is refused once: a new one is fetched
    del airflow.assets[old_id]  # the asset was removed and made again under a new id: looked up again
    new_id = airflow.add_asset(URI)
    second = write_batch(env.catalog, "events", events_batch([2], "b"), defs=env.defs)

    assert second.event is not None and second.event.sent, second.event
    assert [e["asset_id"] for e in airflow.events] == [old_id, new_id]


def test_no_asset_yet_says_the_dag_is_not_deployed(on_write_env: Env, airflow: FakeAirflow) -> None:
    airflow.add_asset("segrep-writes://eventsx/")  # matches nothing exactly
    result = write_batch(on_write_env.catalog, "events", events_batch([1], "a"), defs=on_write_env.defs)
    assert result.event is not None and result.event.outcome is EventOutcome.FAILED
    assert f"Airflow has no asset {URI}" in result.event.detail and "schedule: on_write" in result.event.detail


def test_all_admins_mode_logs_in_without_credentials(on_write_env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    with fake_airflow() as api:
        api.add_asset(URI)
        monkeypatch.setenv(airflow_api.URL_ENV, api.base_url + "/")
        result = write_batch(on_write_env.catalog, "events", events_batch([1], "a"), defs=on_write_env.defs)
        assert result.event is not None and result.event.sent, result.event
        assert api.requests[0] == ("GET", "/auth/token")


def test_a_hung_api_server_costs_the_write_its_budget_only(
    on_write_env: Env, airflow: FakeAirflow, monkeypatch: pytest.MonkeyPatch
) -> None:
    airflow.add_asset(URI)
    airflow.hang = True
    monkeypatch.setenv(airflow_api.TIMEOUT_ENV, "0.5")
    result = write_batch(on_write_env.catalog, "events", events_batch([1, 2, 3], "a"), defs=on_write_env.defs)
    assert result.event is not None and result.event.outcome is EventOutcome.FAILED
    assert "cannot reach it" in result.event.detail or "no answer within 0.5 s" in result.event.detail
    assert read_table(on_write_env.catalog, "events").num_rows == 3


@pytest.mark.parametrize("budget", ["soon", "0", "-1", "nan", "301"])
def test_a_bad_budget_is_named_and_the_write_stays(
    on_write_env: Env, airflow: FakeAirflow, monkeypatch: pytest.MonkeyPatch, budget: str
) -> None:
    airflow.add_asset(URI)
    monkeypatch.setenv(airflow_api.TIMEOUT_ENV, budget)
    result = write_batch(on_write_env.catalog, "events", events_batch([1], "a"), defs=on_write_env.defs)
    assert result.event is not None and result.event.outcome is EventOutcome.FAILED
    assert f"SEGREP_AIRFLOW_API_TIMEOUT_S={budget!r} is not a number of seconds from 0.1 to 300" in result.event.detail
    assert airflow.requests == [] and read_table(on_write_env.catalog, "events").num_rows == 1
