"""Telling Airflow that a write committed: one event on the table's writes asset, through Airflow's REST API.

A table with ``schedule: on_write`` has its replication DAG scheduled on the asset :func:`writes_uri`
(``segrep_airflow.assets.writes_asset`` builds it from this same function, so both sides agree). Writers run
anywhere (``segrep write``, an application calling ``write_batch``) and the package never imports Airflow,
so the event goes through the api-server's public API (:mod:`segrep.data.airflow_api`): the asset's id looked
up once by its URI (``GET /api/v2/assets?uri_pattern=``, then cached for the process), then ``POST
/api/v2/assets/events`` with ``asset_id`` and ``extra``.

Best effort by design: the write is committed before this runs and nothing here raises. All the requests of
one event share the session's time budget, so an api-server that is down (refused at once) or hung delays a
write by that much at most; the outcome (sent, not configured, failed and why) is returned for the caller to
show, naming the table and the API address, never the password. A lost event delays replication by at most
the DAG's fallback schedule (``Policy.write_fallback_s``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from segrep.core.errors import SegrepError
from segrep.data.airflow_api import URL_ENV, ApiError, ApiSession, api_access, snippet

# A scheme of its own: ``segrep://<site>/<table>`` (the replica assets) can never equal a writes URI, whatever
# the sites are named. Airflow stores a URI with an empty path with "/", so that is the form used here.
WRITES_SCHEME = "segrep-writes"
_PAGE = 100  # assets per lookup page (uri_pattern is a substring match: other tables' URIs may match too)
_MAX_PAGES = 20

_asset_ids: dict[tuple[str, str], int] = {}  # (api url, asset uri) -> asset id, for this process


def writes_uri(table: str) -> str:
    """The URI (and name) of the Airflow asset "writes committed to ``table``"."""
    return f"{WRITES_SCHEME}://{table}/"


class EventOutcome(StrEnum):
    SENT = "sent"
    NOT_CONFIGURED = "not configured"
    FAILED = "failed"


@dataclass(frozen=True)
class WriteEvent:
    """What became of a write's asset event; ``detail`` is one line for people."""

    outcome: EventOutcome
    uri: str
    detail: str
    event_id: int | None = None

    @property
    def sent(self) -> bool:
        return self.outcome is EventOutcome.SENT


def announce(table: str, extra: dict[str, Any], fallback_s: int, env: Mapping[str, str] | None = None) -> WriteEvent:
    """Send one event on ``table``'s writes asset with ``extra`` to the api-server the environment names
    (``airflow_api.api_access``); never raises. ``fallback_s``: the DAG's fallback schedule, named in the
    message when the event is not sent."""
    uri = writes_uri(table)
    late = f"its replication DAG runs at the fallback schedule instead (within {fallback_s} s)"
    try:
        access = api_access(env)
    except SegrepError as exc:
        return WriteEvent(EventOutcome.FAILED, uri, f"write to {table} committed; Airflow was not told: {exc}; {late}")
    if access is None:
        return WriteEvent(
            EventOutcome.NOT_CONFIGURED,
            uri,
            f"write to {table} committed; Airflow was not told ({URL_ENV} is not set): {late}",
        )
    try:
        event_id = _post_event(ApiSession(access), uri, extra)
    except (ApiError, KeyError, TypeError, ValueError) as exc:  # also an answer not shaped as Airflow's
        why = str(exc) if isinstance(exc, ApiError) else f"unexpected answer ({type(exc).__name__}: {exc})"
        return WriteEvent(
            EventOutcome.FAILED,
            uri,
            f"write to {table} committed, but its asset event {uri} was not sent to Airflow at {access.shown}: "
            f"{why}; {late}",
        )
    return WriteEvent(EventOutcome.SENT, uri, f"asset event {event_id} on {uri} sent to {access.shown}", event_id)


def _post_event(api: ApiSession, uri: str, extra: dict[str, Any]) -> int:
    body = {"asset_id": _asset_id(api, uri, fresh=False), "extra": extra}
    status, answer = api.call("POST", "/api/v2/assets/events", body=body)
    if status == 404:  # the cached id is gone (the asset was removed and made again): look it up anew
        body["asset_id"] = _asset_id(api, uri, fresh=True)
        status, answer = api.call("POST", "/api/v2/assets/events", body=body)
    if status not in (200, 201) or not isinstance(answer, dict):
        raise ApiError(f"POST /api/v2/assets/events answered {status}: {snippet(answer)}")
    return int(answer["id"])


def _asset_id(api: ApiSession, uri: str, *, fresh: bool) -> int:
    """The id Airflow gave the asset ``uri`` (cached): ``uri_pattern`` matches substrings (ILIKE, ``_`` any
    character), so the pages are searched for the URI itself."""
    key = (api.access.base_url, uri)
    if not fresh and key in _asset_ids:
        return _asset_ids[key]
    _asset_ids.pop(key, None)
    for page in range(_MAX_PAGES):
        query = {"uri_pattern": uri, "limit": str(_PAGE), "offset": str(page * _PAGE)}
        status, answer = api.call("GET", "/api/v2/assets", query=query)
        if status != 200 or not isinstance(answer, dict):
            raise ApiError(f"GET /api/v2/assets answered {status}: {snippet(answer)}")
        assets = answer.get("assets") or []
        found = next((a for a in assets if a.get("uri") == uri), None)
        if found is not None:
            _asset_ids[key] = int(found["id"])
            return _asset_ids[key]
        if len(assets) < _PAGE:
            break
    raise ApiError(
        f"Airflow has no asset {uri}: the table's replication DAG is not deployed with `schedule: on_write` "
        "yet (or not parsed)"
    )
