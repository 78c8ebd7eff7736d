"""The Iceberg catalog the open tables are registered in (``iceberg_catalog:`` in the definitions file).

Absent, or ``{type: sql}``: pyiceberg's SQL catalog inside segrep's own catalog database (the default). ``{type:
rest, uri: http(s)://...}``: an Iceberg REST catalog service (Polaris, Nessie, Gravitino, Lakekeeper, a cloud's
own), with ``warehouse`` when the service asks for one. Its own credentials, if it needs any, come from the
environment variable named by ``token_env`` (a bearer token), never from this file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from segrep.config.entries import expect_mapping, no_unknown_keys
from segrep.core.errors import SegrepError

SQL = "sql"
REST = "rest"
_KEYS = {"type", "uri", "warehouse", "token_env"}
_URI = re.compile(r"^https?://[^\s/]+(/\S*)?$")
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*$")


@dataclass(frozen=True)
class IcebergCatalogDef:
    type: str = SQL
    uri: str | None = None  # the REST service's base URL
    warehouse: str | None = None
    token_env: str | None = None  # the environment variable holding the REST service's bearer token

    @property
    def is_rest(self) -> bool:
        return self.type == REST


def parse_iceberg_catalog(raw: Any) -> IcebergCatalogDef:
    """The entry, validated; every problem named with its key (a ``SegrepError``)."""
    if raw is None:
        return IcebergCatalogDef()
    body = expect_mapping(raw, "iceberg_catalog")
    no_unknown_keys(body, _KEYS, "iceberg_catalog")
    kind = body.get("type", SQL)
    if kind not in (SQL, REST):
        raise SegrepError(f"iceberg_catalog type: expected {SQL} or {REST}; got {kind!r}")
    strings = {k: body.get(k) for k in ("uri", "warehouse", "token_env")}
    for key, value in strings.items():
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise SegrepError(f"iceberg_catalog {key}: expected a non-empty string; got {value!r}")
    if kind == SQL:
        given = sorted(k for k, v in strings.items() if v is not None)
        if given:
            raise SegrepError(f"iceberg_catalog: {', '.join(given)} only apply to type: {REST}")
        return IcebergCatalogDef()
    uri = strings["uri"]
    if uri is None:
        raise SegrepError("iceberg_catalog: type: rest needs uri (the service's http:// or https:// URL)")
    if not _URI.match(uri):
        raise SegrepError(f"iceberg_catalog uri: expected an http:// or https:// URL; got {uri!r}")
    token_env = strings["token_env"]
    if token_env is not None and not _ENV.match(token_env):
        raise SegrepError(f"iceberg_catalog token_env: expected an environment variable's name; got {token_env!r}")
    return IcebergCatalogDef(REST, uri.rstrip("/"), strings["warehouse"], token_env)
