"""Where the page finds segrep: the definitions file the DAGs read (``SEGREP_CONFIG``, else the package's
default path) and the catalog it names (``SEGREP_CATALOG_URL`` first), as ``segrep_airflow.common`` does for
tasks. Kept here rather than imported from there: that module pulls in the Spark provider, which a web
process has no use for.

The definitions are read again when the file changes (an edited policy's RPO shows at the next request); the
catalog engine, with its connection pool, lives as long as the URL stays the same.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from segrep.catalog import Catalog
from segrep.catalog.engine import resolve_url
from segrep.config.definitions import Definitions, config_path, load_definitions


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
        path = config_path(self._config)
        key = (str(path), path.stat().st_mtime_ns)
        with self._lock:
            if self._current is None or key != self._key:
                defs = load_definitions(path, isolate_tables=True)  # one bad table does not hide the others
                url = resolve_url(None, defs.catalog_url, defs.data_dir)
                if self._current is not None and self._current.catalog.url == url:
                    catalog = self._current.catalog
                else:
                    self.close_locked()
                    catalog = Catalog(url)
                    try:
                        catalog.require_initialized()  # a catalog `segrep init` never made: say so, by name
                    except BaseException:
                        catalog.dispose()
                        raise
                self._current, self._key = Segrep(defs, catalog), key
            return self._current

    def close_locked(self) -> None:
        if self._current is not None:
            self._current.catalog.dispose()
        self._current = self._key = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()
