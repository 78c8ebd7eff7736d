"""Sites whose credentials are Airflow connections (``credentials: {airflow_conn_id: ...}``), end to end through
the replication DAG: the tasks resolve the connections through Airflow (here from ``AIRFLOW_CONN_*``, as a
secrets backend or the metadata database would give them), the Spark merge application gets the secrets in
its environment only, and no secret reaches segrep's catalog, the work directory or the task output.

`dr` and `edge` are on two S3 endpoints (moto) with their own keys; a fork written while `dr` led makes the
round's merge read dr's objects on Spark, which fails without the credentials in the application's env.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pendulum
import pytest

from segrep.data.writer import write_batch
from segrep.storage.stores import set_connection_resolver
from tests.support.airflow import (
    EVENTS_DAG,
    events_batch,
    load_dag,
    read_sorted,
    replay_rows,
    rounds,
    rows_of,
    set_leader,
    ti_states,
)
from tests.support.s3 import BUCKETS, S3Endpoint, s3_events_yaml, secrets_of

POLICY = "{schedule: 5m, start_date: '2026-11-01', retries: 0, retry_delay_s: 0, merge_engine: spark}"
CONNECTIONS = {"dr": "dr_store", "edge": "edge.store-b"}  # ids with the characters Airflow allows


@pytest.fixture(autouse=True)
def _outside_airflow_again() -> Iterator[None]:
    """dag.test runs the tasks in this process, and a task installs Airflow's connection resolver for the
    process (as it should, being a task process); the test process itself is "outside Airflow" again after."""
    set_connection_resolver(None)
    yield
    set_connection_resolver(None)


def _yaml(a: S3Endpoint, b: S3Endpoint, prefix: str) -> str:
    text = s3_events_yaml(a, b, prefix)
    text = text.replace("{env_prefix: DR_S3}", f"{{airflow_conn_id: {CONNECTIONS['dr']}}}")
    text = text.replace("{env_prefix: EDGE_S3}", f"{{airflow_conn_id: {CONNECTIONS['edge']}}}")
    return text.replace("policy: {retry_delay_s: 0}", f"policy: {POLICY}")


def _airflow_conn_env(conn_id: str) -> str:
    """How Airflow names a connection given by environment variable (its id upper-cased)."""
    return "AIRFLOW_CONN_" + conn_id.upper()


def _store_env(conn_id: str) -> str:
    """The fallback prefix the CLI (outside Airflow) reads for such a site (segrep.storage.stores)."""
    return "SEGREP_CONN_" + "".join(c if c.isalnum() else "_" for c in conn_id.upper())


@pytest.mark.spark
def test_replication_dag_resolves_site_credentials_through_airflow_connections(
    segrep_env: Any,
    s3_endpoints: tuple[S3Endpoint, S3Endpoint],
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    a, b = s3_endpoints
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    # `segrep apply` (run by the fixture, outside Airflow) reaches the stores through the CLI's fallback ...
    for site, endpoint in (("dr", a), ("edge", b)):
        for name, value in endpoint.env(_store_env(CONNECTIONS[site])).items():
            monkeypatch.setenv(name, value)
    env = segrep_env(yaml_text=_yaml(a, b, uuid.uuid4().hex[:12]))
    # ... which the tasks must not need: from here on only Airflow's connections hold the secrets.
    for site, endpoint in (("dr", a), ("edge", b)):
        for name in endpoint.env(_store_env(CONNECTIONS[site])):
            monkeypatch.delenv(name)
        conn = {"conn_type": "aws", "login": endpoint.access_key, "password": endpoint.secret_key}
        monkeypatch.setenv(_airflow_conn_env(CONNECTIONS[site]), json.dumps(conn))

    written = [(range(0, 60), "a"), (range(50, 80), "dr"), (range(70, 90), "p")]
    write_batch(env.catalog, "events", events_batch(list(written[0][0]), written[0][1]))
    dag = load_dag(EVENTS_DAG)
    first = dag.test(logical_date=pendulum.now("UTC"))
    assert str(first.state) == "success", ti_states(first)
    with monkeypatch.context() as m:  # writing at dr (the leader for a while) is done by this process
        for name, value in a.env(_store_env(CONNECTIONS["dr"])).items():
            m.setenv(name, value)
        set_leader(env, "dr")
        write_batch(env.catalog, "events", events_batch(list(written[1][0]), written[1][1]))
        set_leader(env, "primary")
    write_batch(env.catalog, "events", events_batch(list(written[2][0]), written[2][1]))

    fork = dag.test(logical_date=pendulum.now("UTC"))  # the merge reads dr's objects on Spark
    states = ti_states(fork)
    assert str(fork.state) == "success" and states[("merge", -1)] == "success", states
    assert rounds(env)[-1].report["merges"]["committed"] >= 1
    for _ in range(2):  # dr's fork is off the merged chain: a major for it, then its fast-forward
        later = dag.test(logical_date=pendulum.now("UTC"))
        assert str(later.state) == "success", ti_states(later)

    for site, endpoint in (("dr", a), ("edge", b)):  # reading here, outside Airflow: the CLI's way again
        for name, value in endpoint.env(_store_env(CONNECTIONS[site])).items():
            monkeypatch.setenv(name, value)
    leader = read_sorted(env)
    assert rows_of(leader) == replay_rows(written)
    for site in ("dr", "edge"):
        assert read_sorted(env, site).equals(leader), site

    output = capfd.readouterr()
    secrets = secrets_of(a, b)
    assert not [s for s in secrets if s in output.out or s in output.err], "a secret reached the task output"
    for path in tmp_path.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not [s for s in secrets if s.encode() in data], f"a secret was written to {path}"


def test_a_missing_airflow_connection_fails_its_target_naming_it(
    segrep_env: Any, s3_endpoints: tuple[S3Endpoint, S3Endpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = s3_endpoints
    for site, endpoint in (("dr", a), ("edge", b)):
        for name, value in endpoint.env(_store_env(CONNECTIONS[site])).items():
            monkeypatch.setenv(name, value)
    prefix = uuid.uuid4().hex[:12]
    env = segrep_env(yaml_text=_yaml(a, b, prefix))
    for site, endpoint in (("dr", a), ("edge", b)):
        for name in endpoint.env(_store_env(CONNECTIONS[site])):
            monkeypatch.delenv(name)
    conn = {"conn_type": "aws", "login": b.access_key, "password": b.secret_key}
    monkeypatch.setenv(_airflow_conn_env(CONNECTIONS["edge"]), json.dumps(conn))  # dr's is not defined
    write_batch(env.catalog, "events", events_batch(list(range(0, 20)), "a"))

    run = load_dag(EVENTS_DAG).test(logical_date=pendulum.now("UTC"))
    assert str(run.state) == "failed"
    report = rounds(env)[-1].report
    assert report["targets"]["edge"]["status"] == "ok", report["targets"]["edge"]
    error = report["targets"]["dr"]["error"]
    assert f"Airflow connection {CONNECTIONS['dr']}" in error and "cannot be read" in error, error
    assert a.keys(BUCKETS[0], f"{prefix}/dr/events") == []  # nothing written at dr
