"""`make airflow` (scripts/airflow.sh): the settings it refuses and the database it picks for Airflow.

The script on a free port, on PostgreSQL, with rounds and the UI, runs in tests/dags/test_make_airflow_ui.py
(one setting moves the UI and the tasks' execution API: its runs reach the execution API on that port).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from tests.support.airflow import REPO
from tests.support.airflow_services import free_port, script_env, stop_group

START_TIMEOUT_S = 300  # standalone migrates its database and starts four processes: slow on a busy machine


def test_a_bad_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(REPO / "scripts" / "airflow.sh")],
        env=script_env(tmp_path / "home", 1, SEGREP_AIRFLOW_PORT="80a"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "SEGREP_AIRFLOW_PORT must be a port number, not '80a'" in done.stderr
    assert not (tmp_path / "home").exists()


def test_without_postgresql_the_script_says_airflow_runs_on_sqlite(tmp_path: Path) -> None:
    """No server answers at SEGREP_AIRFLOW_PG_URL: the script falls back to SQLite and says so (backfills
    refused), before Airflow starts; stopped as soon as it has said it."""
    env = _sqlite_script_env(tmp_path)
    text = _until_the_sqlite_banner(env, tmp_path)
    assert "no PostgreSQL for Airflow at postgresql+psycopg://x@127.0.0.1:" in text, text[:3000]
    assert "one task at a time, backfills refused" in text, text[:3000]


def test_the_script_imports_a_pool_per_link_direction_before_airflow_starts(tmp_path: Path) -> None:
    """Definitions with a link of 4 copies both ways: the script imports `segrep airflow-pools --json` (two
    pools) into Airflow's database before the banner; Airflow's own CLI then lists them with their slots."""
    from tests.support.env import LINKS_YAML

    config = tmp_path / "links.yaml"
    config.write_text(LINKS_YAML)
    env = {**_sqlite_script_env(tmp_path), "SEGREP_CONFIG": str(config)}
    text = _until_the_sqlite_banner(env, tmp_path)
    assert "Uploaded 2 pool(s)" in text, text[:3000]
    listed = subprocess.run(
        [str(REPO / ".venv" / "bin" / "airflow"), "pools", "list", "-o", "json"],
        env={**env, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path / 'home' / 'airflow.db'}"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    slots = {p["pool"]: int(p["slots"]) for p in json.loads(listed.stdout)}
    assert {k: v for k, v in slots.items() if k.startswith("segrep_")} == {
        "segrep_link_dr_primary": 4,
        "segrep_link_primary_dr": 4,
    }


def test_the_database_script_creates_airflows_database_once_and_refuses_a_bad_name(pg_server: str) -> None:
    from sqlalchemy import create_engine, text

    server = make_url(pg_server).set(database="postgres")
    name = f"segrep_airflow_s{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "SEGREP_AIRFLOW_PG_URL": server.render_as_string(hide_password=False)}
    script = [sys.executable, str(REPO / "scripts" / "airflow_database.py")]
    try:
        first = subprocess.run(script, env={**env, "SEGREP_AIRFLOW_DB_NAME": name}, capture_output=True, text=True)
        again = subprocess.run(script, env={**env, "SEGREP_AIRFLOW_DB_NAME": name}, capture_output=True, text=True)
        assert first.returncode == 0 and f"created the database {name}" in first.stderr, first.stderr
        assert again.returncode == 0 and "created" not in again.stderr  # it exists: used as it is
        assert first.stdout.strip() == again.stdout.strip() and make_url(first.stdout.strip()).database == name
        bad = subprocess.run(script, env={**env, "SEGREP_AIRFLOW_DB_NAME": 'x"; drop'}, capture_output=True, text=True)
        assert bad.returncode == 2 and "is not a plain database name" in bad.stderr, bad.stderr
    finally:
        engine = create_engine(server, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        engine.dispose()


def _sqlite_script_env(tmp_path: Path) -> dict[str, str]:
    """The script's environment with no PostgreSQL server to find (so Airflow's database is SQLite)."""
    return {
        **script_env(tmp_path / "home", free_port()),
        "SEGREP_AIRFLOW_PG_URL": f"postgresql+psycopg://x@127.0.0.1:{free_port()}/postgres",
        # a catalog of its own: without one the script would run `segrep init` in the checkout's data/
        "SEGREP_CATALOG_URL": f"sqlite:///{tmp_path / 'catalog.db'}",
    }


def _until_the_sqlite_banner(env: dict[str, str], tmp_path: Path) -> str:
    """Run the script until its banner says SQLite (before Airflow starts), then stop it; its output."""
    log = tmp_path / "standalone.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(REPO / "scripts" / "airflow.sh")],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait(lambda: "database      SQLite" in log.read_text(errors="replace"), proc, tmp_path, "the banner")
    finally:
        stop_group(proc, timeout_s=30)
    return log.read_text(errors="replace")


def _wait(check: Any, proc: subprocess.Popen[bytes], tmp_path: Path, what: str) -> None:
    deadline = time.time() + START_TIMEOUT_S
    while time.time() < deadline:
        if check():
            return
        if proc.poll() is not None:
            pytest.fail(f"scripts/airflow.sh exited ({proc.returncode}) waiting for {what}:\n{_tail(tmp_path)}")
        time.sleep(1)
    pytest.fail(f"waited {START_TIMEOUT_S} s for {what}, in vain:\n{_tail(tmp_path)}")


def _tail(tmp_path: Path) -> str:
    return (tmp_path / "standalone.log").read_text(errors="replace")[-4000:]
