"""A real alert callback for the watchdog tests: what Slack or e-mail would be told, appended to a file.

``SEGREP_ALERT_CALLBACK=tests.support.alerts:record`` (or the Airflow Variable) names it; the file is
``$SEGREP_TEST_ALERT_FILE``, one JSON document per call."""

from __future__ import annotations

import json
import os
from typing import Any

FILE_ENV = "SEGREP_TEST_ALERT_FILE"


def record(context: Any) -> None:
    """Append what the task's context says: which task failed, its exception's message and breaches."""
    error = context.get("exception")
    breaches = [
        {"table": b.table, "site": b.site, "lag_s": b.lag_s, "rpo_s": b.rpo_s, "reasons": list(b.reasons)}
        for b in getattr(error, "breaches", [])
    ]
    doc = {
        "dag_id": context["ti"].dag_id,
        "task_id": context["ti"].task_id,
        "error": type(error).__name__,
        "message": str(error),
        "breaches": breaches,
    }
    with open(os.environ[FILE_ENV], "a", encoding="utf-8") as out:
        out.write(json.dumps(doc) + "\n")
