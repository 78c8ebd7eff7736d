"""Opening a site's store: a local directory, or an S3-compatible bucket with the site's own endpoint and
credentials (DESIGN 14), so two sites may live on two stores with two identities in one process.

The credentials are looked up when the store is opened, from the reference the definitions give
(``config.stores``), never from process-wide AWS variables unless the site names none. The secrets go only
to ``pyarrow.fs.S3FileSystem``; no error or message built here contains them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from segrep.config import stores as config_stores
from segrep.config.stores import CredentialsRef, StoreOptions
from segrep.core.errors import SegrepError

# What a store raises when it cannot be reached, read or written: the OS's errors, and pyarrow's (a URI its
# file systems cannot open, a path the store refuses).
STORE_ERRORS: tuple[type[Exception], ...] = (OSError, pa.ArrowException)


def first_line(exc: BaseException) -> str:
    """An error's first line (store errors can be long), or its type's name."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


@dataclass(frozen=True)
class Secrets:
    access_key: str
    secret_key: str
    session_token: str | None = None


# How an Airflow connection id becomes secrets: set by the Airflow glue (through its provider's hook) in the
# processes it runs; unset elsewhere, where such a site cannot be opened.
ConnectionResolver = Callable[[str], Secrets]
_connection_resolver: ConnectionResolver | None = None


def set_connection_resolver(resolver: ConnectionResolver | None) -> None:
    global _connection_resolver
    _connection_resolver = resolver


@dataclass(frozen=True)
class Store:
    fs: pafs.FileSystem
    root: str  # a local absolute path, or ``bucket/prefix`` for pyarrow's S3 file system
    local: bool


def open_store(name: str, uri: str, options: StoreOptions | None = None) -> Store:
    """The file system and root of site ``name`` at ``uri``; ``options`` default to what the loaded
    definitions give that site (``config.stores.options_for``)."""
    if "://" not in uri or uri.startswith("file://"):
        return Store(pafs.LocalFileSystem(), str(Path(uri.removeprefix("file://")).resolve()), True)
    scheme, _, rest = uri.partition("://")
    if scheme.lower() != "s3":
        fs, root = pafs.FileSystem.from_uri(uri)
        return Store(fs, root, False)
    opts = options if options is not None else config_stores.options_for(name, uri)
    return Store(s3_filesystem(name, opts), rest.strip("/"), False)


def s3_filesystem(name: str, opts: StoreOptions) -> pafs.S3FileSystem:
    kwargs: dict[str, Any] = {}
    if opts.endpoint is not None:
        scheme, _, host = opts.endpoint.partition("://")
        kwargs.update(endpoint_override=host, scheme=scheme)
    if opts.region is not None:
        kwargs["region"] = opts.region
    if opts.connect_timeout_s is not None:
        kwargs["connect_timeout"] = opts.connect_timeout_s
    if opts.request_timeout_s is not None:
        kwargs["request_timeout"] = opts.request_timeout_s
    if opts.retries is not None:
        kwargs["retry_strategy"] = pafs.AwsStandardS3RetryStrategy(max_attempts=opts.retries)
    kwargs["force_virtual_addressing"] = not opts.path_style
    if opts.credentials is not None:
        secrets = resolve_credentials(name, opts.credentials)
        kwargs.update(access_key=secrets.access_key, secret_key=secrets.secret_key)
        if secrets.session_token is not None:
            kwargs["session_token"] = secrets.session_token
    return pafs.S3FileSystem(**kwargs)


def resolve_credentials(name: str, ref: CredentialsRef) -> Secrets:
    """The secrets ``ref`` points at; SegrepError naming the site and what is missing (never a value)."""
    if ref.env_prefix is not None:
        prefix = ref.env_prefix
        missing = [v for v in (f"{prefix}_ACCESS_KEY_ID", f"{prefix}_SECRET_ACCESS_KEY") if not os.environ.get(v)]
        if missing:
            raise SegrepError(
                f"site {name}: its credentials ({ref.describe()}) need the environment variable(s) "
                f"{', '.join(missing)}, which are not set"
            )
        return Secrets(
            os.environ[f"{prefix}_ACCESS_KEY_ID"],
            os.environ[f"{prefix}_SECRET_ACCESS_KEY"],
            os.environ.get(f"{prefix}_SESSION_TOKEN") or None,
        )
    assert ref.airflow_conn_id is not None
    if _connection_resolver is None:
        raise SegrepError(
            f"site {name}: its credentials ({ref.describe()}) are an Airflow connection, resolved only inside "
            "Airflow tasks; outside Airflow give the site credentials: {env_prefix: PREFIX}"
        )
    return _connection_resolver(ref.airflow_conn_id)
