"""An Iceberg REST catalog service on loopback for the tests: the endpoints pyiceberg's ``RestCatalog`` uses to
create namespaces and tables, load them and commit to them, served by FastAPI over a pyiceberg SQL catalog in
the service's own SQLite file (not segrep's database), with an optional bearer token. What a deployment gets
from Polaris, Nessie or a cloud's catalog, reduced to what publication needs."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pyiceberg.catalog.rest import CreateTableRequest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchNamespaceError,
    NoSuchTableError,
)
from pyiceberg.table import CommitTableRequest, Table

from tests.support.s3 import free_port


@dataclass(frozen=True)
class RestService:
    uri: str
    store: SqlCatalog  # the service's own catalog, to look at what it holds
    requests: list[str]  # "METHOD path" of every request served


def _error(code: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": code}}, status_code=code)


def _loaded(tbl: Table) -> dict[str, Any]:
    return {
        "metadata-location": tbl.metadata_location,
        "metadata": json.loads(tbl.metadata.model_dump_json()),
        "config": {},
    }


def make_app(store: SqlCatalog, requests: list[str], token: str | None) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def authorize(request: Request, call_next: Any) -> Response:
        requests.append(f"{request.method} {request.url.path}")
        if token is not None and request.headers.get("authorization") != f"Bearer {token}":
            return _error(401, "NotAuthorizedException", "a bearer token is required")
        response: Response = await call_next(request)
        return response

    @app.get("/v1/config")
    def config() -> dict[str, Any]:
        return {"defaults": {}, "overrides": {}}

    @app.get("/v1/namespaces")
    def namespaces() -> dict[str, Any]:
        return {"namespaces": [list(ns) for ns in store.list_namespaces()]}

    @app.post("/v1/namespaces")
    async def create_namespace(request: Request) -> Response:
        body = await request.json()
        try:
            store.create_namespace(tuple(body["namespace"]))
        except NamespaceAlreadyExistsError as exc:
            return _error(409, "AlreadyExistsException", str(exc))
        return JSONResponse({"namespace": body["namespace"], "properties": {}})

    @app.api_route("/v1/namespaces/{ns}", methods=["GET", "HEAD"])
    def namespace(ns: str) -> Response:
        try:
            store.load_namespace_properties(ns)
        except NoSuchNamespaceError as exc:
            return _error(404, "NoSuchNamespaceException", str(exc))
        return JSONResponse({"namespace": [ns], "properties": {}})

    @app.post("/v1/namespaces/{ns}/tables")
    async def create_table(ns: str, request: Request) -> Response:
        req = CreateTableRequest.model_validate_json(await request.body())
        tbl = store.create_table(
            (ns, req.name), schema=req.table_schema, location=req.location, properties=req.properties
        )
        return JSONResponse(_loaded(tbl))

    @app.api_route("/v1/namespaces/{ns}/tables/{name}", methods=["GET", "HEAD"])
    def load_table(ns: str, name: str) -> Response:
        try:
            return JSONResponse(_loaded(store.load_table((ns, name))))
        except NoSuchTableError as exc:
            return _error(404, "NoSuchTableException", str(exc))

    @app.post("/v1/namespaces/{ns}/tables/{name}")
    async def commit(ns: str, name: str, request: Request) -> Response:
        req = CommitTableRequest.model_validate_json(await request.body())
        try:
            tbl = store.load_table((ns, name))
            out = store.commit_table(tbl, tuple(req.requirements), tuple(req.updates))
        except NoSuchTableError as exc:
            return _error(404, "NoSuchTableException", str(exc))
        except CommitFailedException as exc:
            return _error(409, "CommitFailedException", str(exc))
        body = {"metadata-location": out.metadata_location, "metadata": json.loads(out.metadata.model_dump_json())}
        return JSONResponse(body)

    return app


@contextmanager
def rest_catalog_service(root: Path, token: str | None = None) -> Iterator[RestService]:
    """The service on a free loopback port for the duration; stopped afterwards."""
    store = SqlCatalog("service", uri=f"sqlite:///{root}/rest-service.db")
    requests: list[str] = []
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(make_app(store, requests, token), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the REST catalog service did not start")
        time.sleep(0.05)
    try:
        yield RestService(f"http://127.0.0.1:{port}", store, requests)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        store.engine.dispose()
