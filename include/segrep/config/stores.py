"""How a site's store is reached: its ``storage_options`` and a *reference* to its credentials (DESIGN 14).

A site on an S3-compatible store may name its endpoint, region, addressing style, timeouts and retries, how
throttled requests are retried and how many requests a second a process may send it (``storage.throttle``), and
where its credentials come from: ``{env_prefix: DR_S3}`` (the CLI and any process: ``DR_S3_ACCESS_KEY_ID``,
``DR_S3_SECRET_ACCESS_KEY`` and optionally ``DR_S3_SESSION_TOKEN``, read when the site is opened) or
``{airflow_conn_id: ...}`` (accepted here, resolved only by the Airflow glue). The definitions file holds
references, never secrets, so nothing secret can reach the catalog (which stores the URI only), a manifest or
output. Without ``credentials`` the store's default chain applies (AWS_* variables, ~/.aws, instance roles).

Every ``Site(name, uri)`` in the package is built from a catalog row (name and URI), so the options loaded with
the definitions are remembered here per (site, URI): ``load_definitions`` records them, ``storage.stores``
looks them up. A process that never loaded the definitions (a Spark job) gets them from its manifest, where the
plan step wrote them as a JSON document (``StoreOptions.to_doc``, read back as strictly by ``from_doc``).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from segrep.config.entries import no_unknown_keys
from segrep.config.locations import redact_uri
from segrep.core.errors import SegrepError

_PREFIX_RE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
_CONN_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,250}")
_REGION_RE = re.compile(r"[a-z0-9-]{1,64}")
_OPTION_KEYS = {
    "endpoint",
    "region",
    "path_style",
    "connect_timeout_s",
    "request_timeout_s",
    "retries",
    "throttle_retries",
    "throttle_base_ms",
    "max_requests_per_second",
}
_DOC_KEYS = _OPTION_KEYS | {"credentials"}
_CREDENTIAL_KEYS = {"env_prefix", "airflow_conn_id"}
MAX_TIMEOUT_S = 3600.0
MAX_RETRIES = 20
MAX_THROTTLE_RETRIES = 50
MAX_THROTTLE_BASE_MS = 60_000.0
MAX_REQUESTS_PER_SECOND = 100_000.0


@dataclass(frozen=True)
class CredentialsRef:
    """Where a site's secrets are found; exactly one of the two is set."""

    env_prefix: str | None = None
    airflow_conn_id: str | None = None

    def describe(self) -> str:
        if self.env_prefix is not None:
            return f"env_prefix {self.env_prefix}"
        return f"airflow_conn_id {self.airflow_conn_id}"

    def to_doc(self) -> dict[str, str | None]:
        """JSON form (equal to ``dataclasses.asdict``): a reference, never a secret."""
        return {"env_prefix": self.env_prefix, "airflow_conn_id": self.airflow_conn_id}


@dataclass(frozen=True)
class StoreOptions:
    """A site's store options (no secret): the defaults are pyarrow's (AWS endpoint, https, its retries)."""

    endpoint: str | None = None  # scheme://host[:port], e.g. http://127.0.0.1:9000
    region: str | None = None
    path_style: bool = True  # bucket in the path (MinIO, Ceph, moto); False: virtual-hosted addressing
    connect_timeout_s: float | None = None
    request_timeout_s: float | None = None
    retries: int | None = None  # attempts per request, pyarrow's AwsStandardS3RetryStrategy
    # throttled answers (503 SlowDown, 429...): retries with full-jitter back-off from this base (storage.throttle)
    throttle_retries: int | None = None
    throttle_base_ms: float | None = None
    max_requests_per_second: float | None = None  # paces this process's requests to the store; None: unpaced
    credentials: CredentialsRef | None = None

    def to_doc(self) -> dict[str, Any]:
        """JSON form for a manifest (equal to ``dataclasses.asdict``, so a manifest's ``asdict`` carries it):
        the options and the credentials reference, no secret."""
        return {
            "endpoint": self.endpoint,
            "region": self.region,
            "path_style": self.path_style,
            "connect_timeout_s": self.connect_timeout_s,
            "request_timeout_s": self.request_timeout_s,
            "retries": self.retries,
            "throttle_retries": self.throttle_retries,
            "throttle_base_ms": self.throttle_base_ms,
            "max_requests_per_second": self.max_requests_per_second,
            "credentials": None if self.credentials is None else self.credentials.to_doc(),
        }

    @classmethod
    def from_doc(cls, doc: Any, where: str = "store options") -> StoreOptions:
        """Options from ``to_doc``'s form, checked as strictly as the definitions file (a manifest is a file a
        job trusts: a bad value is refused here, not passed to the store)."""
        body = _mapping(doc, where)
        no_unknown_keys(body, _DOC_KEYS, where)
        creds = body.get("credentials")
        return cls(
            endpoint=_endpoint(body.get("endpoint"), where),
            region=_region(body.get("region"), where),
            path_style=_bool(body.get("path_style", True), f"{where}: path_style"),
            connect_timeout_s=_seconds(body.get("connect_timeout_s"), f"{where}: connect_timeout_s"),
            request_timeout_s=_seconds(body.get("request_timeout_s"), f"{where}: request_timeout_s"),
            retries=_retries(body.get("retries"), f"{where}: retries"),
            **_throttle_options(body, where),
            credentials=None if creds is None else _credentials(creds, f"{where}: credentials"),
        )


def parse_store(site: str, uri: str, options: Any, credentials: Any) -> StoreOptions:
    """The ``storage_options`` and ``credentials`` of site ``site`` (each may be None), checked strictly:
    unknown keys, wrong types and out-of-range values are refused, and both apply to s3:// sites only."""
    if options is None and credentials is None:
        return StoreOptions()
    if not uri.lower().startswith("s3://"):
        raise SegrepError(f"site {site}: storage_options and credentials apply to s3:// sites only")
    opts = _mapping(options, f"site {site} storage_options")
    where = f"site {site} storage_options"
    no_unknown_keys(opts, _OPTION_KEYS, where)
    return StoreOptions(
        endpoint=_endpoint(opts.get("endpoint"), where),
        region=_region(opts.get("region"), where),
        path_style=_bool(opts.get("path_style", True), f"{where}: path_style"),
        connect_timeout_s=_seconds(opts.get("connect_timeout_s"), f"{where}: connect_timeout_s"),
        request_timeout_s=_seconds(opts.get("request_timeout_s"), f"{where}: request_timeout_s"),
        retries=_retries(opts.get("retries"), f"{where}: retries"),
        **_throttle_options(opts, where),
        credentials=None if credentials is None else _credentials(credentials, f"site {site} credentials"),
    )


# -- what the loaded definitions said, per (site, URI) ----------------------------------------------------------
_lock = threading.Lock()
_known_stores: dict[tuple[str, str], StoreOptions] = {}


def remember(sites: Iterable[tuple[str, str, StoreOptions]]) -> None:
    """Record each (site, URI)'s options; the definitions loaded last win (a test process loads many)."""
    with _lock:
        for name, uri, options in sites:
            _known_stores[(name, uri)] = options


def options_for(name: str, uri: str) -> StoreOptions:
    """The options the loaded definitions give site ``name`` at ``uri`` (defaults for a site off object storage).

    An object-store site this process has no definitions for is refused, naming it: opening it with the
    defaults would send its requests to the provider's default endpoint under whatever identity the
    environment holds, not the site's own store and credentials."""
    with _lock:
        known = _known_stores.get((name, uri))
    if known is not None:
        return known
    if uri.lower().startswith("s3://"):
        raise SegrepError(
            f"site {name} ({redact_uri(uri)}): its storage options and credentials are not known in this process; "
            "load the definitions file that defines it (--config or SEGREP_CONFIG)"
        )
    return StoreOptions()


# -- checks ------------------------------------------------------------------------------------------------------
def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SegrepError(f"{where}: expected a mapping")
    return value


def _endpoint(raw: Any, where: str) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.strip():
        raise SegrepError(f"{where}: endpoint must be a URL such as http://127.0.0.1:9000")
    try:
        parts = urlsplit(raw.strip())
        port = parts.port
    except ValueError:
        raise SegrepError(f"{where}: endpoint is not a valid URL (write http(s)://host[:port])") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SegrepError(f"{where}: endpoint must be http://host[:port] or https://host[:port]")
    if parts.username is not None or parts.password is not None:
        raise SegrepError(f"{where}: endpoint must not hold credentials; name them under credentials")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise SegrepError(f"{where}: endpoint must be scheme://host[:port] only (no path or query)")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def _region(raw: Any, where: str) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not _REGION_RE.fullmatch(raw):
        raise SegrepError(f"{where}: region must be a region name such as eu-west-1")
    return raw


def _bool(raw: Any, where: str) -> bool:
    if not isinstance(raw, bool):
        raise SegrepError(f"{where} must be true or false")
    return raw


def _seconds(raw: Any, where: str) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        raise SegrepError(f"{where} must be a number of seconds")
    if not 0 < raw <= MAX_TIMEOUT_S:
        raise SegrepError(f"{where} must be more than 0 and at most {MAX_TIMEOUT_S:g} seconds")
    return float(raw)


def _retries(raw: Any, where: str) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= MAX_RETRIES:
        raise SegrepError(f"{where} must be an integer from 0 to {MAX_RETRIES}")
    return raw


def _throttle_options(body: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The throttling options, each checked (absent: the defaults of ``storage.throttle``)."""
    retries = body.get("throttle_retries")
    if retries is not None and (
        isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_THROTTLE_RETRIES
    ):
        raise SegrepError(f"{where}: throttle_retries must be an integer from 0 to {MAX_THROTTLE_RETRIES}")
    return {
        "throttle_retries": retries,
        "throttle_base_ms": _positive(body.get("throttle_base_ms"), MAX_THROTTLE_BASE_MS, f"{where}: throttle_base_ms"),
        "max_requests_per_second": _positive(
            body.get("max_requests_per_second"), MAX_REQUESTS_PER_SECOND, f"{where}: max_requests_per_second"
        ),
    }


def _positive(raw: Any, most: float, where: str) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) or not 0 < raw <= most:
        raise SegrepError(f"{where} must be a number more than 0 and at most {most:g}")
    return float(raw)


def _credentials(raw: Any, where: str) -> CredentialsRef:
    body = _mapping(raw, where)
    no_unknown_keys(body, _CREDENTIAL_KEYS, where)
    given = [k for k in sorted(_CREDENTIAL_KEYS) if body.get(k) is not None]
    if len(given) != 1:
        raise SegrepError(
            f"{where}: give exactly one of env_prefix (variables PREFIX_ACCESS_KEY_ID, PREFIX_SECRET_ACCESS_KEY) "
            "or airflow_conn_id; the secrets themselves never go in this file"
        )
    if given == ["env_prefix"]:
        prefix = body["env_prefix"]
        if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
            raise SegrepError(f"{where}: env_prefix must be upper case letters, digits and _ (e.g. DR_S3)")
        return CredentialsRef(env_prefix=prefix)
    conn_id = body["airflow_conn_id"]
    if not isinstance(conn_id, str) or not _CONN_ID_RE.fullmatch(conn_id):
        raise SegrepError(f"{where}: airflow_conn_id must be an Airflow connection id (letters, digits, _ . -)")
    return CredentialsRef(airflow_conn_id=conn_id)
