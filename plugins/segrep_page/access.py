"""Who may see what: Airflow's own authentication and authorization, enforced by the page itself.

The api-server mounts plugin apps without authenticating their requests (apache/airflow #72655), so every
route of this app asks for the user the way Airflow's REST API does (``airflow.api_fastapi.core_api.security
.get_user``: the ``Authorization: Bearer`` token, else the UI's session cookie) and asks the configured auth
manager, table by table, whether that user may read the table's replication DAG (``segrep_replicate_<table>``;
the DAG whose runs produce the page's numbers). Tables the user may not read are left out; a user who may
read none gets 403. A request without a valid token gets 401 with ``WWW-Authenticate: Bearer`` (Airflow
answers a malformed token with 403, which tells a scraper "wrong user" instead of "log in").

The metrics route alone also takes the static scraper token (``scrape_token``): it reads every table's
metrics, nothing else.

Airflow is imported inside the functions: the plugin module is loaded by every Airflow component, and only
the api-server serves the page.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException, Request, status

REPLICATION_DAG = "segrep_replicate_{table}"
SCRAPE_ROUTE = "metrics"  # the name of the one route that takes the scraper token
SCRAPER = object()  # the caller that presented the scraper token


def replication_dag_id(table: str) -> str:
    return REPLICATION_DAG.format(table=table)


@dataclass(frozen=True)
class Viewer:
    name: str
    tables: frozenset[str]  # the tables whose replication DAG the user may read
    runs: frozenset[str] = frozenset()  # ... and of those, the tables whose DAG runs the user may read


async def current_user(request: Request) -> Any:
    """The authenticated Airflow user of the request (``SCRAPER`` for the scraper token on the metrics
    route); HTTPException 401 with ``WWW-Authenticate: Bearer`` when there is no valid credential."""
    from airflow.api_fastapi.core_api.security import bearer_scheme, get_user

    credentials = await bearer_scheme(request)
    scrape = getattr(request.scope.get("route"), "name", None) == SCRAPE_ROUTE
    if scrape and credentials is not None and request.app.state.scrape_token.matches(credentials.credentials):
        return SCRAPER
    try:
        return await get_user(request, None, credentials)
    except HTTPException as exc:
        if exc.status_code not in (status.HTTP_401_UNAUTHORIZED, status.HTTP_403_FORBIDDEN):
            raise
        wanted = "an Airflow token or the segrep metrics token" if scrape else "an Airflow login or token"
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            f"not authenticated ({str(exc.detail).lower()}): send {wanted} (Authorization: Bearer ...)",
            headers={"WWW-Authenticate": "Bearer"},
        ) from None


def readable_tables(user: Any, tables: Collection[str], entity: str | None = None) -> frozenset[str]:
    """The tables whose replication DAG ``user`` may read (GET), as the auth manager decides; with ``entity``
    (a ``DagAccessEntity`` name, e.g. ``RUN``) that part of the DAG."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    manager = get_auth_manager()
    teams = _teams([replication_dag_id(t) for t in tables]) if tables else {}
    part = None if entity is None else DagAccessEntity[entity]
    return frozenset(
        t
        for t in tables
        if manager.is_authorized_dag(
            method="GET",
            access_entity=part,
            details=DagDetails(id=replication_dag_id(t), team_name=teams.get(replication_dag_id(t))),
            user=user,
        )
    )


def may_read_dags(user: Any) -> bool:
    """Whether ``user`` may read DAGs at all (the check when there is no table yet)."""
    from airflow.api_fastapi.app import get_auth_manager

    return bool(get_auth_manager().is_authorized_dag(method="GET", user=user))


def authorize(user: Any, tables: Collection[str]) -> Viewer:
    """The user's view of ``tables``; 403 when the user may read none of their DAGs (or no DAG at all). The
    scraper token sees every table's numbers and no DAG run."""
    if user is SCRAPER:
        return Viewer("the metrics token", frozenset(tables))
    allowed = readable_tables(user, tables) if tables else frozenset()
    if not allowed and (tables or not may_read_dags(user)):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "you may not read the segrep DAGs (segrep_replicate_<table>): ask an Airflow admin for read access",
        )
    return Viewer(str(user.get_name()), allowed, readable_tables(user, allowed, "RUN") if allowed else frozenset())


def _teams(dag_ids: list[str]) -> dict[str, str | None]:
    """The DAGs' teams, which a multi-team auth manager decides on (Airflow's metadata, not segrep's data);
    none to look up unless ``[core] multi_team`` is on."""
    from airflow.configuration import conf

    if not conf.getboolean("core", "multi_team", fallback=False):
        return {}
    from airflow.models.dag import DagModel

    return dict(DagModel.get_dag_id_to_team_name_mapping(dag_ids))
