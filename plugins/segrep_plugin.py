"""segrep's Airflow plugin: the replication page, mounted by the api-server at ``/segrep`` and shown in the
navigation ("Replication") and as a tab on every DAG's page (the segrep DAGs' table is picked out).

Airflow 3.1+ plugin interface: ``fastapi_apps`` (the app, mounted under ``url_prefix``) and ``external_views``
(``href`` opened in the UI's frame; ``{DAG_ID}`` is filled in on a DAG's page) and ``fastapi_root_middlewares``
(``requests_guard``: a trigger with an unknown form key, or a backfill on Airflow's SQLite, is refused before
a run exists). Building the app reads nothing:
the catalog is opened at the first request. The code is the ``segrep_page`` package beside this file
(``.airflowignore`` keeps Airflow from loading its modules as plugins one by one).
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from segrep_page.app import PREFIX, create_app
from segrep_page.requests_guard import RequestGuard


class SegrepPlugin(AirflowPlugin):
    name = "segrep"
    fastapi_apps: list[Any] = [  # noqa: RUF012 (AirflowPlugin declares these as lists)
        {"app": create_app(), "url_prefix": PREFIX, "name": "segrep replication"}
    ]
    fastapi_root_middlewares: list[Any] = [  # noqa: RUF012
        {"middleware": RequestGuard, "args": [], "kwargs": {}, "name": "segrep: refusals before a run exists"}
    ]
    external_views: list[Any] = [  # noqa: RUF012
        {
            "name": "Replication",
            "href": f"{PREFIX}/",
            "url_route": "segrep",
            "destination": "nav",
            "nav_top_level": True,  # its own entry in the left navigation, not inside a menu
        },
        {
            "name": "Replication",
            "href": f"{PREFIX}/?dag_id={{DAG_ID}}",
            "url_route": "segrep-dag",
            "destination": "dag",
        },
    ]
