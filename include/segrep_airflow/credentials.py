"""Site credentials named by Airflow connection id (``credentials: {airflow_conn_id: ...}``), resolved inside
the task, through the connection's hook, the Airflow way: the secrets live in Airflow's connections (its
database, a secrets backend or ``AIRFLOW_CONN_*``), never in the definitions file or segrep's catalog.

The connection is read as the ``aws`` connection type defines it: login = access key id, password = secret
access key, ``aws_session_token`` in the extra (``aws_access_key_id`` / ``aws_secret_access_key`` in the extra
are accepted too). The Spark applications a task starts cannot ask Airflow; they get the same secrets in
their environment under ``segrep.storage.stores.connection_env_prefix`` (spark-submit's environment, never a
``--conf`` and never a manifest).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from airflow.sdk import BaseHook

from segrep.config.definitions import Definitions
from segrep.core.errors import SegrepError
from segrep.storage.stores import Secrets, connection_env_prefix, set_connection_resolver


def resolve_connection(conn_id: str) -> Secrets:
    """The S3 secrets of Airflow connection ``conn_id``; SegrepError naming it (never a value) if it lacks them."""
    try:
        conn: Any = BaseHook.get_connection(conn_id)
    except Exception as exc:  # the SDK raises its own error types for an unknown connection
        raise SegrepError(
            f"Airflow connection {conn_id} (a site's credentials) cannot be read: {type(exc).__name__}"
        ) from None
    extra = conn.extra_dejson or {}
    access = conn.login or extra.get("aws_access_key_id")
    secret = conn.password or extra.get("aws_secret_access_key")
    if not access or not secret:
        raise SegrepError(
            f"Airflow connection {conn_id} (a site's credentials) has no access key id (login) or no secret "
            "access key (password)"
        )
    return Secrets(str(access), str(secret), extra.get("aws_session_token") or None)


def use_airflow_connections() -> None:
    """Resolve ``airflow_conn_id`` credentials through Airflow in this (task) process."""
    set_connection_resolver(resolve_connection)


def connection_ids(defs: Definitions) -> list[str]:
    """The Airflow connection ids the definitions' sites name for their credentials."""
    ids = {
        sdef.store.credentials.airflow_conn_id
        for sdef in defs.sites.values()
        if sdef.store.credentials is not None and sdef.store.credentials.airflow_conn_id is not None
    }
    return sorted(ids)


def connection_env(conn_ids: Iterable[str]) -> dict[str, str]:
    """The environment through which a Spark application started by this task finds those connections'
    secrets (``SEGREP_CONN_<ID>_ACCESS_KEY_ID`` ...): resolved here, handed over by reference to the env."""
    env = {}
    for conn_id in conn_ids:
        secrets = resolve_connection(conn_id)
        prefix = connection_env_prefix(conn_id)
        env[f"{prefix}_ACCESS_KEY_ID"] = secrets.access_key
        env[f"{prefix}_SECRET_ACCESS_KEY"] = secrets.secret_key
        if secrets.session_token is not None:
            env[f"{prefix}_SESSION_TOKEN"] = secrets.session_token
    return env
