"""Where the page finds segrep: the definitions file the DAGs read (``SEGREP_CONFIG``, else the package's
default path) and the catalog it names (``SEGREP_CATALOG_URL`` first), as ``segrep_airflow.common`` does for
tasks. Kept here rather than imported from there: that module pulls in the Spark provider, which a web
process has no use for.

The definitions are read again when the file changes (an edited policy's RPO shows at the next request); the
catalog engine, with its connection pool, lives as long as the URL stays the same.

What cannot be used is an :class:`Unavailable` whose message is fit for an HTTP answer: it says which part
failed (the definitions, a catalog ``segrep init`` never made, an unreachable database) and never carries a
server path or the catalog URL (the api-server's log has the full error).
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from segrep.catalog import Catalog
from segrep.catalog.engine import resolve_url
from segrep.config.definitions import Definitions, config_path, load_definitions
from segrep.core.errors import SegrepError

log = logging.getLogger(__name__)

NOT_INITIALISED = "the catalog is not initialised: run segrep init"
UNREACHABLE = "the catalog cannot be reached (see the api-server's log)"
# An absolute path, or a URL whose path is one (sqlite:////srv/catalog.db): shown by its last part only.
_PATH = re.compile(r"(?<![\w.~-])(?:[a-z][a-z0-9+.-]*:/+)?/[^\s'\"`,;()]+", re.IGNORECASE)


class Unavailable(Exception):
    """segrep cannot be read now; the message names the part that failed, without paths or URLs."""


def public(text: str, *hidden: str) -> str:
    """``text`` with each of ``hidden`` (a path as configured, a catalog URL) and every absolute path cut to
    its last part: an HTTP answer names the problem, not the server's layout."""
    for secret in sorted((h for h in hidden if h), key=len, reverse=True):
        text = text.replace(secret, Path(secret).name or "(hidden)")
    return _PATH.sub(lambda m: m.group().rstrip("/").rsplit("/", 1)[-1] or "(path)", text)


@dataclass(frozen=True)
class Segrep:
    defs: Definitions
    catalog: Catalog

    @property
    def rpo(self) -> dict[str, int | None]:
        """Each valid table's objective in seconds (None: none); a table left out of the definitions has none."""
        return {name: table.policy.rpo_s for name, table in self.defs.tables.items()}


class Source:
    """The current definitions and catalog, re-read when the definitions file changes."""

    def __init__(self, config: str | None = None) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._key: tuple[str, int] | None = None
        self._current: Segrep | None = None

    def get(self) -> Segrep:
        """The definitions and an initialised catalog; :class:`Unavailable` naming what is wrong."""
        path = config_path(self._config)
        try:
            key = (str(path), path.stat().st_mtime_ns)
        except OSError as exc:
            raise Unavailable(
                f"segrep's definitions file {path.name} cannot be read ({exc.strerror or type(exc).__name__}): "
                "check SEGREP_CONFIG"
            ) from None
        with self._lock:
            if self._current is None or key != self._key:
                defs = _definitions(path)
                url = resolve_url(None, defs.catalog_url, defs.data_dir)
                if self._current is not None and self._current.catalog.url == url:
                    catalog = self._current.catalog
                else:
                    self.close_locked()
                    catalog = _catalog(url)
                self._current, self._key = Segrep(defs, catalog), key
            return self._current

    def close_locked(self) -> None:
        if self._current is not None:
            self._current.catalog.dispose()
        self._current = self._key = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()


def _definitions(path: Path) -> Definitions:
    try:
        return load_definitions(path, isolate_tables=True)  # one bad table does not hide the others
    except (SegrepError, OSError) as exc:
        raise Unavailable(f"segrep's definitions cannot be read: {public(str(exc), str(path))}") from None


def _catalog(url: str) -> Catalog:
    """The catalog at ``url``, checked as every segrep command checks it: one `segrep init` made and upgraded."""
    try:
        catalog = Catalog(url)
    except SegrepError as exc:
        raise Unavailable(f"the catalog URL cannot be used: {public(str(exc), url)}") from None
    try:
        if not catalog.is_initialized():
            raise Unavailable(NOT_INITIALISED)
        catalog.require_initialized()  # an older schema, a newer segrep's, a damaged one: said by name
        return catalog
    except Unavailable:
        catalog.dispose()
        raise
    except SegrepError as exc:
        catalog.dispose()
        raise Unavailable(f"the catalog cannot be used: {public(str(exc), catalog.safe_url, url)}") from None
    except SQLAlchemyError as exc:
        catalog.dispose()
        log.warning("segrep page: the catalog %s cannot be reached: %s", catalog.safe_url, exc)
        raise Unavailable(UNREACHABLE) from None
