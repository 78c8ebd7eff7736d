"""A loopback stand-in for the part of Airflow 3.3's api-server that a write's asset event uses.

It answers as ``airflow/api_fastapi`` does (checked against the installed version): ``POST /auth/token``
(simple auth manager: JSON username and password, 201 with ``access_token``, 401 on a wrong password),
``GET /auth/token`` (201 in all-admins mode, else 403), ``GET /api/v2/assets`` (``uri_pattern`` is a
case-insensitive ``ILIKE '%pattern%'``, so ``_`` matches any character; ``limit``/``offset`` paging;
``{"assets": [...], "total_entries": n}``) and ``POST /api/v2/assets/events`` (a strict body of ``asset_id``
and ``extra``: 422 on anything else, 404 for an unknown asset; ``from_rest_api: true`` added to ``extra``).
Every API call needs ``Authorization: Bearer <token>`` (401 otherwise). It records the events it took, and
can be told to expire its tokens or to stop answering (a hung api-server).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class FakeAirflow:
    users: dict[str, str] = field(default_factory=dict)  # username -> password; empty: all-admins mode
    assets: dict[int, str] = field(default_factory=dict)  # id -> uri (the name is the uri, as segrep's are)
    events: list[dict[str, Any]] = field(default_factory=list)
    tokens: set[str] = field(default_factory=set)
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path with query)
    hang: bool = False  # True: read each request, then never answer (until the server stops)
    released: threading.Event = field(default_factory=threading.Event)
    base_url: str = ""
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def add_asset(self, uri: str) -> int:
        asset_id = 1000 + len(self.assets)
        self.assets[asset_id] = uri
        return asset_id

    def expire_tokens(self) -> None:
        self.tokens.clear()

    def handle(self, method: str, target: str, headers: Any, raw: bytes) -> tuple[int, Any]:
        self.requests.append((method, target))
        url = urlsplit(target)
        if url.path == "/auth/token":
            return self._token(method, raw)
        if headers.get("Authorization", "").removeprefix("Bearer ") not in self.tokens:
            return 401, {"detail": "Not authenticated"}
        if method == "GET" and url.path == "/api/v2/assets":
            return 200, self._assets(parse_qs(url.query))
        if method == "POST" and url.path == "/api/v2/assets/events":
            return self._event(raw)
        return 404, {"detail": "Not Found"}

    def _token(self, method: str, raw: bytes) -> tuple[int, Any]:
        if method == "GET":
            if self.users:
                return 403, {"detail": "Login without credentials is only allowed in all-admins mode"}
        else:
            body = json.loads(raw or b"{}")
            if self.users.get(body.get("username")) != body.get("password"):
                return 401, {"detail": "Invalid credentials"}
        token = f"token-{next(self._ids)}"
        self.tokens.add(token)
        return 201, {"access_token": token}

    def _assets(self, query: dict[str, list[str]]) -> dict[str, Any]:
        pattern = query.get("uri_pattern", [""])[0]
        like = re.compile(".*" + "".join(_like(c) for c in pattern) + ".*", re.IGNORECASE | re.DOTALL)
        found = sorted((i, uri) for i, uri in self.assets.items() if like.fullmatch(uri))
        offset, limit = int(query.get("offset", ["0"])[0]), int(query.get("limit", ["50"])[0])
        page = found[offset : offset + limit]
        return {"assets": [_asset(i, uri) for i, uri in page], "total_entries": len(found)}

    def _event(self, raw: bytes) -> tuple[int, Any]:
        body = json.loads(raw)
        if set(body) - {"asset_id", "extra", "partition_key", "access_control"} or not isinstance(
            body.get("asset_id"), int
        ):
            return 422, {"detail": [{"type": "extra_forbidden or int_type", "input": body}]}
        if body["asset_id"] not in self.assets:
            return 404, {"detail": f"Asset with ID: `{body['asset_id']}` was not found"}
        event = {
            "id": next(self._ids),
            "asset_id": body["asset_id"],
            "uri": self.assets[body["asset_id"]],
            "extra": {**body.get("extra", {}), "from_rest_api": True},
            "source_map_index": -1,
            "created_dagruns": [],
            "timestamp": datetime.now(UTC).isoformat(),
        }
        self.events.append(event)
        return 200, event


def _like(char: str) -> str:
    return {"%": ".*", "_": "."}.get(char, re.escape(char))


def _asset(asset_id: int, uri: str) -> dict[str, Any]:
    now = datetime.now(UTC).isoformat()
    return {
        "id": asset_id,
        "name": uri,
        "uri": uri,
        "group": "segrep",
        "extra": {},
        "created_at": now,
        "updated_at": now,
        "scheduled_dags": [],
        "producing_tasks": [],
        "consuming_tasks": [],
        "aliases": [],
        "watchers": [],
        "last_asset_event": None,
    }


@contextmanager
def fake_airflow(**kwargs: Any) -> Iterator[FakeAirflow]:
    """The fake api-server on a free loopback port (``.base_url``), stopped when the block ends."""
    api = FakeAirflow(**kwargs)

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if api.hang:
                api.released.wait(30)  # set when the server stops
                return
            status, body = api.handle(self.command, self.path, self.headers, raw)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _serve

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the test asserts what it needs
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    api.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        api.released.set()
        server.shutdown()
        server.server_close()
