"""A small client of Airflow's public REST API for the package, which never imports Airflow.

How it logs in is how ``segrep_airflow.run_note`` does: a token from the auth manager's ``/auth/token`` (POST
with a user and password, as the simple and FAB auth managers take them; GET without a user, the simple auth
manager's all-admins mode), sent as ``Authorization: Bearer``; a token that has expired (401) is replaced once.
Tokens are cached per process, api-server and login, so a process that writes often logs in once.

Where the api-server is comes from the environment: :data:`URL_ENV` (its base URL, e.g.
``http://airflow:8080``), :data:`USER_ENV` and :data:`PASSWORD_ENV`, and :data:`TIMEOUT_ENV` (the time all
the requests of one :class:`ApiSession` may take together, default :data:`BUDGET_S`): a caller that must not
wait on Airflow (a write) is delayed by that much at most. The password never reaches a message or a repr.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from segrep.config.locations import redact_uri
from segrep.core.errors import SegrepError

URL_ENV = "SEGREP_AIRFLOW_API_URL"
USER_ENV = "SEGREP_AIRFLOW_API_USER"
PASSWORD_ENV = "SEGREP_AIRFLOW_API_PASSWORD"
TIMEOUT_ENV = "SEGREP_AIRFLOW_API_TIMEOUT_S"
BUDGET_S = 5.0  # a healthy api-server answers in milliseconds
MAX_BUDGET_S = 300.0

# (api url, user, sha256 of the password) -> token, for this process: another password logs in anew
_tokens: dict[tuple[str, str | None, str], str] = {}


class ApiError(Exception):
    """Why a call could not be made or was refused (one line, no secret)."""


@dataclass(frozen=True)
class ApiAccess:
    """Where Airflow's api-server is, who to log in as, and the time budget of one session's requests."""

    base_url: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    budget_s: float = BUDGET_S

    @property
    def shown(self) -> str:
        """The address fit to print (credentials in it replaced)."""
        return redact_uri(self.base_url)


def api_access(env: Mapping[str, str] | None = None) -> ApiAccess | None:
    """The api-server from :data:`URL_ENV` (and :data:`USER_ENV`, :data:`PASSWORD_ENV`, :data:`TIMEOUT_ENV`);
    None if unset. SegrepError naming a budget that is not 0.1 to :data:`MAX_BUDGET_S` seconds."""
    env = os.environ if env is None else env
    url = env.get(URL_ENV, "").strip().rstrip("/")
    if not url:
        return None
    raw = env.get(TIMEOUT_ENV, "").strip()
    try:
        budget = float(raw) if raw else BUDGET_S
    except ValueError:
        budget = float("nan")
    if not 0.1 <= budget <= MAX_BUDGET_S:  # also NaN
        raise SegrepError(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds from 0.1 to {MAX_BUDGET_S:g}")
    return ApiAccess(url, env.get(USER_ENV) or None, env.get(PASSWORD_ENV) or None, budget)


class ApiSession:
    """Requests to one api-server, logged in, within one time budget (from when the session is made)."""

    def __init__(self, access: ApiAccess) -> None:
        self.access = access
        self.deadline = time.monotonic() + access.budget_s

    def call(self, method: str, path: str, *, query: dict[str, str] | None = None, body: Any = None) -> tuple[int, Any]:
        """(status, the JSON answer or its text) of an API call with the cached token; on 401 once more with a
        new one (tokens expire). ApiError when the api-server cannot be reached in time or refuses the login."""
        status, answer = self._request(method, path, query=query, body=body, token=self._token(fresh=False))
        if status == 401:
            status, answer = self._request(method, path, query=query, body=body, token=self._token(fresh=True))
        return status, answer

    def _token(self, *, fresh: bool) -> str:
        secret = hashlib.sha256((self.access.password or "").encode()).hexdigest()
        key = (self.access.base_url, self.access.user, secret)
        if not fresh and key in _tokens:
            return _tokens[key]
        _tokens.pop(key, None)
        if self.access.user:
            login = {"username": self.access.user, "password": self.access.password or ""}
            status, body = self._request("POST", "/auth/token", body=login)
        else:
            status, body = self._request("GET", "/auth/token")
        if status not in (200, 201) or not isinstance(body, dict) or "access_token" not in body:
            who = f"user {self.access.user!r}" if self.access.user else f"a login without credentials (no {USER_ENV})"
            raise ApiError(f"/auth/token answered {status} for {who}")
        _tokens[key] = str(body["access_token"])
        return _tokens[key]

    def _request(
        self, method: str, path: str, *, query: dict[str, str] | None = None, body: Any = None, token: str = ""
    ) -> tuple[int, Any]:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ApiError(f"no answer within {self.access.budget_s:g} s ({TIMEOUT_ENV})")
        url = self.access.base_url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            request = urllib.request.Request(url, data=data, headers=headers, method=method)
            with urllib.request.urlopen(request, timeout=left) as response:
                return response.status, _decoded(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, _decoded(exc.read())
        except urllib.error.URLError as exc:
            raise ApiError(f"cannot reach it ({exc.reason})") from None
        except (OSError, http.client.HTTPException, ValueError) as exc:  # a timeout, a reset, a bad URL
            raise ApiError(f"cannot reach it ({type(exc).__name__}: {exc})") from None


def snippet(answer: Any) -> str:
    """The start of an answer, for a message."""
    return answer[:300] if isinstance(answer, str) else json.dumps(answer)[:300]


def _decoded(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw[:300].decode(errors="replace")
