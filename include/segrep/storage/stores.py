"""Opening a site's store: a local directory, or an S3-compatible bucket with the site's own endpoint and
credentials (DESIGN 14), so two sites may live on two stores with two identities in one process.

The credentials are looked up when the store is opened, from the reference the definitions give
(``config.stores``), never from process-wide AWS variables unless the site names none. The secrets go only
to the store's clients (``pyarrow.fs.S3FileSystem`` for reads, boto3 for verified writes, ``storage.s3``); no
error or message built here contains them. Both clients carry the site's request limits (``storage.throttle``:
throttled requests retried and counted, requests paced); the S3 file system is wrapped for that
(``storage.throttled_fs``).

An Airflow connection id is resolved by the resolver the Airflow glue sets in its task processes (through
the connection's hook); a process Airflow starts without it (a Spark application) finds the same secrets
by reference in its environment, under ``connection_env_prefix(conn_id)``, which the glue fills for it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from segrep.config import stores as config_stores
from segrep.config.stores import CredentialsRef, StoreOptions
from segrep.core.errors import SegrepError
from segrep.storage import throttle
from segrep.storage.s3 import S3Target, Secrets, s3_target
from segrep.storage.store_errors import StoreRefusedError, first_line
from segrep.storage.throttled_fs import limited

# What a store raises when it cannot be reached, read or written: the OS's errors, and pyarrow's (a URI its
# file systems cannot open, a path the store refuses), and a store's refusal (credentials, permissions).
STORE_ERRORS: tuple[type[Exception], ...] = (OSError, pa.ArrowException, StoreRefusedError)
__all__ = ["STORE_ERRORS", "Secrets", "Store", "first_line", "open_store", "set_connection_resolver"]


# How an Airflow connection id becomes secrets: set by the Airflow glue (through its provider's hook) in the
# processes it runs; unset elsewhere, where such a site cannot be opened.
ConnectionResolver = Callable[[str], Secrets]
_connection_resolver: ConnectionResolver | None = None


def set_connection_resolver(resolver: ConnectionResolver | None) -> None:
    global _connection_resolver
    _connection_resolver = resolver


def connection_env_prefix(conn_id: str) -> str:
    """The environment-variable prefix under which a process started by Airflow (a Spark application) finds
    the secrets of Airflow connection ``conn_id``: ``SEGREP_CONN_<ID>`` (upper case, other characters ``_``)."""
    return "SEGREP_CONN_" + re.sub(r"[^A-Z0-9]", "_", conn_id.upper())


@dataclass(frozen=True)
class Store:
    fs: pafs.FileSystem
    root: str  # a local absolute path, or ``bucket/prefix`` for pyarrow's S3 file system
    local: bool
    s3: S3Target | None = None  # for S3 sites: verified writes, server-side copies, upload clean-up


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
    secrets = None if opts.credentials is None else resolve_credentials(name, opts.credentials)
    root = rest.strip("/")
    fs = limited(s3_filesystem(opts, secrets), throttle.limits_for(name, opts))
    return Store(fs, root, False, s3_target(name, root, opts, secrets))


def s3_filesystem(opts: StoreOptions, secrets: Secrets | None) -> pafs.S3FileSystem:
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
    if secrets is not None:
        kwargs.update(access_key=secrets.access_key, secret_key=secrets.secret_key)
        if secrets.session_token is not None:
            kwargs["session_token"] = secrets.session_token
    return pafs.S3FileSystem(**kwargs)


def resolve_credentials(name: str, ref: CredentialsRef) -> Secrets:
    """The secrets ``ref`` points at; SegrepError naming the site and what is missing (never a value)."""
    if ref.env_prefix is not None or _connection_resolver is None:
        prefix = ref.env_prefix or connection_env_prefix(str(ref.airflow_conn_id))
        if ref.env_prefix is None and not os.environ.get(f"{prefix}_ACCESS_KEY_ID"):
            raise SegrepError(
                f"site {name}: its credentials ({ref.describe()}) are an Airflow connection, resolved inside "
                f"Airflow tasks (and in the Spark applications they start, through {prefix}_*); outside Airflow "
                "give the site credentials: {env_prefix: PREFIX}"
            )
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
    return _connection_resolver(ref.airflow_conn_id)
