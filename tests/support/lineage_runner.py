"""A process that runs DAGs with ``dag.test`` on request, OpenLineage configured from its environment
(tests/dags/test_lineage.py starts one per module: one Airflow start-up for all its runs).

Why a process of its own: Airflow builds its listener manager once per process, from the plugins as they were
loaded; the provider's plugin registers its listener only if a transport was configured at that moment. Started
with ``AIRFLOW__OPENLINEAGE__TRANSPORT`` set, this process gets the listener exactly as a deployed worker does,
and ``dag.test`` runs each task through the task runner, which calls the listener's hooks after it.

Protocol: one JSON request per line on stdin, ``{"env": {name: value or null}, "dag_id": ..., "conf": {...}}``
(``env``: SEGREP_CONFIG and the like, set or, null, unset before the DAG folder is parsed); one JSON answer
per line on the original stdout, ``{"state": "success" | "failed", "run_id": ...}`` or ``{"error": ...}``.
Everything else the runs print or log goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _run(request: dict[str, Any]) -> dict[str, Any]:
    import pendulum

    from tests.support.airflow import load_dag

    for name, value in request.get("env", {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    run = load_dag(request["dag_id"]).test(logical_date=pendulum.now("UTC"), run_conf=request.get("conf"))
    return {"state": str(run.state), "run_id": run.run_id}


def main() -> None:
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # the runs' output must not mix with the answers
    for line in sys.stdin:
        try:
            answer = _run(json.loads(line))
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
