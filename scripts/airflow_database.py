"""Airflow's own metadata database for `make airflow`: a database on the local PostgreSQL when one answers.

On SQLite, Airflow runs one writer at a time: a backfill from the UI and the scheduler locked each other out
(503 "database is locked"), after which every task failed until a restart. So scripts/airflow.sh asks this
script first. It connects to the server of ``SEGREP_AIRFLOW_PG_URL`` (default: the local server, user
postgres), creates the database ``SEGREP_AIRFLOW_DB_NAME`` (default ``segrep_airflow``) if it is missing, and
prints the SQLAlchemy URL of that database. Exit 0: printed; 3: no server answered (the caller falls back to
SQLite and says so); 2: a setting is malformed (nothing is created). Messages never show a password.
"""

from __future__ import annotations

import os
import re
import sys

from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

DEFAULT_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
DEFAULT_NAME = "segrep_airflow"
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
UNREACHABLE = 3
BAD_SETTING = 2


def server_url() -> URL:
    raw = os.environ.get("SEGREP_AIRFLOW_PG_URL", DEFAULT_SERVER)
    try:
        url = make_url(raw)
    except ArgumentError:
        raise SystemExit(_fail(BAD_SETTING, "SEGREP_AIRFLOW_PG_URL is not a database URL")) from None
    if not url.drivername.startswith("postgresql"):
        raise SystemExit(_fail(BAD_SETTING, f"SEGREP_AIRFLOW_PG_URL must be a postgresql URL, not {url.drivername}"))
    return url


def database_name() -> str:
    name = os.environ.get("SEGREP_AIRFLOW_DB_NAME", DEFAULT_NAME)
    if not _NAME.fullmatch(name):
        raise SystemExit(
            _fail(BAD_SETTING, f"SEGREP_AIRFLOW_DB_NAME {name!r} is not a plain database name ([a-z_][a-z0-9_]*)")
        )
    return name


def ensure_database(server: URL, name: str) -> URL:
    """Create ``name`` on ``server`` unless it exists; the URL of ``name``. OSError-like failures to connect
    are SQLAlchemy's OperationalError, reported by the caller as "no server"."""
    engine = create_engine(server, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": name}).first()
            if exists is None:
                conn.execute(text(f'CREATE DATABASE "{name}"'))  # name checked against _NAME: no quoting issue
                print(f"segrep: created the database {name} for Airflow", file=sys.stderr)
    finally:
        engine.dispose()
    return server.set(database=name)


def _fail(code: int, message: str) -> int:
    print(f"segrep: {message}", file=sys.stderr)
    return code


def main() -> int:
    server, name = server_url(), database_name()
    try:
        url = ensure_database(server, name)
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        where = server.render_as_string(hide_password=True)
        return _fail(UNREACHABLE, f"no PostgreSQL for Airflow at {where}: {reason}")
    print(url.render_as_string(hide_password=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
