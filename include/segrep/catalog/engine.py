"""Connecting to the catalog, and transactions that lock correctly on SQLite and PostgreSQL.

SQLite: pysqlite's own transaction handling is switched off and every write transaction starts with
``BEGIN IMMEDIATE``, so two writers never both read and then both write (the lock is taken up front);
readers use a deferred ``BEGIN`` and WAL lets them run beside a writer. PostgreSQL: READ COMMITTED with
``SELECT ... FOR UPDATE`` and conditional updates where a decision depends on what was read.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, NoSuchModuleError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from segrep.catalog import damaged
from segrep.catalog.models import Base
from segrep.catalog.revisions import current_revision, head_revision, known_revision
from segrep.core.errors import SegrepError
from segrep.core.settings import seconds_from_env

CATALOG_URL_ENV = "SEGREP_CATALOG_URL"
CONNECT_TIMEOUT_ENV = "SEGREP_CATALOG_CONNECT_TIMEOUT_S"
DEFAULT_CONNECT_TIMEOUT_S = 10.0
MAX_CONNECT_TIMEOUT_S = 3600.0
_READONLY = "segrep_readonly"


def resolve_url(explicit: str | None = None, config_url: str | None = None, data_dir: Path | None = None) -> str:
    """Catalog URL: the explicit one, else ``SEGREP_CATALOG_URL``, else the definitions file's, else a SQLite
    file ``catalog.db`` in the data directory."""
    url = explicit or os.environ.get(CATALOG_URL_ENV) or config_url
    if url:
        return url
    return f"sqlite:///{(data_dir or Path('data')).resolve() / 'catalog.db'}"


SUPPORTED = ("sqlite", "postgresql")


def make_engine(url: str) -> Engine:
    """An engine for a SQLite or PostgreSQL catalog URL; anything else is refused here, by name, before a
    driver is looked for. Nothing is connected to (and no file created) until the catalog is used."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise SegrepError(f"invalid catalog URL {_redacted(url)!r}: expected e.g. sqlite:///PATH") from None
    except ValueError:  # the only value make_url converts is the port
        raise SegrepError(f"invalid catalog URL {_redacted(url)!r}: the port is not a number") from None
    backend = parsed.get_backend_name()
    if backend not in SUPPORTED:
        raise SegrepError(f"unsupported catalog URL {parsed.drivername!r}: use sqlite:///PATH or postgresql://...")
    if backend == "sqlite":
        return _sqlite_engine(url, parsed.database)
    if parsed.drivername == "postgresql":
        url = parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    # The URL's own connect_timeout wins; otherwise a server that does not answer fails in seconds, not
    # after the driver's default (130 s, or the kernel's TCP retries).
    connect = {} if "connect_timeout" in parsed.query else {"connect_timeout": connect_timeout_s()}
    try:
        return create_engine(url, pool_pre_ping=True, connect_args=connect)
    except (NoSuchModuleError, ImportError) as exc:
        raise SegrepError(f"catalog URL {parsed.drivername!r}: driver not available ({exc})") from None


def connect_timeout_s() -> int:
    """Seconds to wait for a PostgreSQL catalog to answer a connection: ``$SEGREP_CATALOG_CONNECT_TIMEOUT_S``,
    else 10 (libpq waits at least 2 s, so smaller values are raised to 2)."""
    value = seconds_from_env(CONNECT_TIMEOUT_ENV, DEFAULT_CONNECT_TIMEOUT_S, MAX_CONNECT_TIMEOUT_S)
    return max(2, math.ceil(value))


def _redacted(url: str) -> str:
    """A URL that failed to parse, with anything that may be a password cut out."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}" if sep else url


def sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite catalog URL (None for other backends and in-memory databases)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def _sqlite_engine(url: str, database: str | None) -> Engine:
    try:
        engine = create_engine(url, connect_args={"timeout": 60}, json_deserializer=damaged.loads)
    except ArgumentError:
        raise SegrepError(
            f"invalid SQLite catalog URL {url!r}: expected sqlite:///relative/path or sqlite:////abs/path"
        ) from None

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=60000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:  # type: ignore[no-untyped-def]
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(_READONLY) else "BEGIN IMMEDIATE")

    return engine


class Catalog:
    """A catalog connection. ``write()`` and ``read()`` give a Session inside one transaction."""

    def __init__(self, url: str, engine: Engine | None = None) -> None:
        self.url = url
        self.engine = engine or make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._read_engine = self.engine.execution_options(**{_READONLY: True})
        self._read_sessions = sessionmaker(self._read_engine, expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One write transaction: committed on success, rolled back on any exception."""
        with self._naming_damage(), self._sessions.begin() as session:
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._naming_damage(), self._read_sessions.begin() as session:
            yield session

    @contextmanager
    def _naming_damage(self) -> Iterator[None]:
        """A JSON value that does not parse, named by table, row and column (catalog.damaged)."""
        try:
            yield
        except damaged.DamagedValueError as exc:
            raise damaged.locate(self.engine, exc, self.safe_url) from None

    def is_initialized(self) -> bool:
        db = sqlite_file(self.url)
        if db is not None and not db.exists():
            return False  # connecting would create an empty file: a read-only command creates nothing
        if db is not None and db.is_file() and db.stat().st_size == 0:
            # Looked at before connecting: opening an empty file makes it a database (the connection's WAL
            # pragma writes a header), and a command that only reads must leave the file as it found it. Only
            # its size: opening and closing the file here would drop the POSIX locks SQLite holds on it in this
            # process (SQLite's own warning), and a concurrent writer could then corrupt the database.
            return False  # an empty file: `segrep init` makes it a catalog
        try:
            return inspect(self.engine).has_table("alembic_version")
        except OperationalError:
            raise  # unreachable or failing: the CLI reports it as such (exit 1)
        except DatabaseError as exc:  # e.g. SQLite's "file is not a database"
            raise SegrepError(
                f"catalog {self.safe_url} is not a usable database: {_first_line(exc)}, so not a segrep catalog "
                "(point --catalog at the catalog, or at a new file and run `segrep init`)"
            ) from None

    def require_initialized(self) -> None:
        db = sqlite_file(self.url)
        if db is not None and not db.exists():
            raise SegrepError(f"catalog {self.safe_url} does not exist: run `segrep init` to create it")
        if not self.is_initialized():
            raise SegrepError(f"catalog {self.safe_url} is not initialized: run `segrep init`")
        if self._known(current_revision(self)) != head_revision():
            raise SegrepError(f"catalog {self.safe_url} is at an older schema: run `segrep init` to upgrade")
        self.require_every_table()

    def require_every_table(self) -> None:
        """Refuse a catalog at the head revision that lacks one of its tables (dropped by hand, a partial
        restore): a round would copy, then fail at the table it writes last and stay recorded as running."""
        missing = sorted(set(Base.metadata.tables) - set(inspect(self.engine).get_table_names()))
        if missing:
            raise SegrepError(
                f"catalog {self.safe_url} is damaged: its schema lacks the table(s) {', '.join(missing)}; restore "
                f"it from a backup, or rebuild a new one from the sites' files ({damaged.REBUILD})"
            )

    def require_known_revision(self) -> None:
        """Refuse a catalog whose schema revision no migration of this segrep produced (a newer segrep's, or
        a damaged version table): upgrading or using it would guess."""
        if self.is_initialized():
            self._known(current_revision(self))

    def _known(self, revision: str | None) -> str | None:
        """``revision`` if this segrep knows it (or there is none); SegrepError naming it otherwise."""
        if revision is not None and not known_revision(revision):
            raise SegrepError(
                f"catalog {self.safe_url} is at schema revision {revision!r}, which this segrep does not know "
                "(made by a newer segrep, or damaged): use the segrep that created it"
            )
        return revision

    @property
    def safe_url(self) -> str:
        return make_url(self.url).render_as_string(hide_password=True)

    def dispose(self) -> None:
        self.engine.dispose()


def _first_line(exc: DatabaseError) -> str:
    return str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc).splitlines()[0]
