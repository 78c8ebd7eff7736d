"""Refusals before a run exists: requests that Airflow's API would accept and then let fail or do harm.

Installed by the plugin as a root middleware of the api-server (``fastapi_root_middlewares``), so it sees the
UI's own calls and the REST API's alike, before Airflow's routes:

- **A trigger of a segrep DAG with a form key the DAG does not have** (``gc_dryrun`` for ``gc_dry_run``):
  Airflow adds an unknown key to the run's conf without a schema, so the run would be created and fail at its
  first task (``segrep_airflow.forms``). Here it is a 400 naming the unknown keys and the form's keys, and no
  run is created. The same for a backfill's ``dag_run_conf``.
- **A backfill while Airflow's own database is SQLite**: a backfill and the scheduler locked each other out
  (503 "database is locked"), and from then on every task of every DAG failed until Airflow was restarted.
  Here it is a 409 saying why and what to do; the running instance is untouched.

Anything else passes through unchanged (the body is read only for those two POSTs, and replayed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse

from segrep_airflow.forms import FormError, check_conf

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_TRIGGER = re.compile(r"/api/v2/dags/(?P<dag_id>[^/]+)/dagRuns/?$")
_BACKFILL = re.compile(r"/api/v2/backfills(/dry_run)?/?$")
SEGREP_DAG_PREFIX = "segrep_"
SQLITE_BACKFILL = (
    "backfills are refused while Airflow's own database is SQLite: a backfill and the scheduler lock each "
    "other out, after which tasks fail until Airflow restarts. Start PostgreSQL and restart `make airflow` "
    "(it then runs Airflow on PostgreSQL, see docs/airflow.md), or trigger the intervals one at a time."
)


@dataclass(frozen=True)
class Refusal:
    status: int
    detail: str


def refusal_of(path: str, body: bytes) -> Refusal | None:
    """Why a POST to ``path`` with ``body`` must not reach Airflow (None: let it through). Reads Airflow's
    configuration and, for a segrep DAG, its stored form (blocking: run in a thread)."""
    trigger, backfill = _TRIGGER.search(path), _BACKFILL.search(path)
    if trigger is None and backfill is None:
        return None
    if backfill is not None and _airflow_on_sqlite():
        return Refusal(409, SQLITE_BACKFILL)
    payload = _json(body)
    if payload is None:
        return None  # Airflow's own validation answers malformed bodies
    dag_id = trigger.group("dag_id") if trigger is not None else payload.get("dag_id")
    conf = payload.get("conf") if trigger is not None else payload.get("dag_run_conf")
    if not isinstance(dag_id, str) or not dag_id.startswith(SEGREP_DAG_PREFIX) or not isinstance(conf, dict):
        return None
    known = _form_keys(dag_id)
    if known is None:
        return None  # not parsed yet: Airflow answers 404
    try:
        check_conf(conf, known)
    except FormError as exc:
        return Refusal(400, f"{dag_id}: {exc}".replace("in the run's conf", "in the trigger's conf"))
    return None


class RequestGuard:
    """The ASGI middleware: answers a :class:`Refusal` itself, else calls the app with the body replayed."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if (
            scope["type"] != "http"
            or scope.get("method") != "POST"
            or not (_TRIGGER.search(path) or _BACKFILL.search(path))
        ):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            more = bool(message.get("more_body", False))
        body = b"".join(chunks)
        refusal = await run_in_threadpool(refusal_of, path, body)
        if refusal is not None:
            await JSONResponse({"detail": refusal.detail}, status_code=refusal.status)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _json(body: bytes) -> dict[str, Any] | None:
    try:
        payload = json.loads(body or b"null")
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


def _airflow_on_sqlite() -> bool:
    from airflow.configuration import conf

    return str(conf.get("database", "sql_alchemy_conn")).startswith("sqlite")


def _form_keys(dag_id: str) -> list[str] | None:
    """The Params of the DAG's latest stored version (None: no such DAG stored)."""
    from airflow.models.serialized_dag import SerializedDagModel

    dag = SerializedDagModel.get_dag(dag_id)
    return None if dag is None else list(dag.params)
