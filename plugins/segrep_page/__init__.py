"""segrep's operator page for the Airflow UI: a FastAPI app the api-server mounts (``segrep_plugin.py``).

It reads segrep's catalog through the ``segrep`` package and, for the state of the replication DAGs only,
Airflow's metadata database (``airflow_state``); it writes nothing, and answers only users whom Airflow's
auth manager lets read the segrep DAGs (and, on ``/metrics``, the scraper token). ``docs/operator-page.md``
says how to open it and what each number means.
"""
