"""A DAG run's note set from one of its tasks, through Airflow's public REST API (the failover DAG's loss).

Why the REST API: Airflow 3.3's Task SDK can read its run's note but has no call to set it, and a task never
writes Airflow's metadata database. The public API can: ``PATCH /api/v2/dags/{dag_id}/dagRuns/{run_id}``
with ``update_mask=note``, authorised by a token from the auth manager's ``/auth/token``.

Where the API is: the Airflow connection :data:`CONN_ID` (type http): host (with scheme) and port of the
api-server; login and password of a user allowed to edit the DAG's runs (POST ``/auth/token``, as the simple
and FAB auth managers take them), or no login for the simple auth manager's all-admins mode (GET
``/auth/token``). ``make airflow`` defines it. Without it the note is not set, and the task log says so and
how to fix it; the loss report is in the task log either way. The password never reaches a log or an error.
The calls go through the package's REST client (``segrep.data.airflow_api``), which writes also use.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import quote

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from segrep.data.airflow_api import ApiAccess, ApiError, ApiSession, snippet

CONN_ID = "segrep_airflow_api"
NOTE_LIMIT = 1000  # Airflow's dag_run_note.content column
TIMEOUT_S = 10.0  # all the calls of one note


class NoteOutcome(StrEnum):
    SET = "set"
    NO_CONNECTION = "no connection"
    FAILED = "failed"


@dataclass(frozen=True)
class NoteResult:
    outcome: NoteOutcome
    detail: str


def api_access() -> ApiAccess | None:
    """The :data:`CONN_ID` connection as the package's ``ApiAccess`` (None if it is not defined)."""
    try:
        conn = BaseHook.get_connection(CONN_ID)
    except AirflowNotFoundException:
        return None
    host = conn.host or "localhost"
    if "://" not in host:
        host = f"{'https' if conn.conn_type == 'https' else 'http'}://{host}"
    base = f"{host}:{conn.port}" if conn.port else host
    return ApiAccess(base.rstrip("/"), conn.login or None, conn.password or None, budget_s=TIMEOUT_S)


def note_text(report: str, limit: int = NOTE_LIMIT) -> str:
    """The report cut at a line boundary to fit a note, saying what was left out and where it is."""
    if len(report) <= limit:
        return report
    lines = report.splitlines()
    kept: list[str] = []
    for i, line in enumerate(lines):
        more = f"... {len(lines) - i} more line(s): see the assess task's log"
        if len("\n".join([*kept, line, more])) > limit:
            return "\n".join([*kept, more])
        kept.append(line)
    return "\n".join(kept)


def set_run_note(access: ApiAccess | None, dag_id: str, run_id: str, note: str) -> NoteResult:
    """Set the note of run ``run_id`` of ``dag_id``; never raises (a note is a convenience, the log has all)."""
    if access is None:
        return NoteResult(
            NoteOutcome.NO_CONNECTION,
            f"the run's note was not set: no Airflow connection {CONN_ID!r} (http: the api-server's URL, and a "
            "login allowed to edit this DAG's runs); see docs/airflow.md",
        )
    path = f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}"
    try:
        status, answer = ApiSession(access).call(
            "PATCH", path, query={"update_mask": "note"}, body={"note": note_text(note)}
        )
    except ApiError as exc:
        return NoteResult(
            NoteOutcome.FAILED, f"the run's note was not set: {access.shown}: {exc} (connection {CONN_ID!r})"
        )
    if status != 200:
        return NoteResult(
            NoteOutcome.FAILED, f"the run's note was not set: PATCH {path} answered {status}: {snippet(answer)}"
        )
    return NoteResult(NoteOutcome.SET, f"the loss report is the note of run {run_id}")
