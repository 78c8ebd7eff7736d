"""segrep's operator page for the Airflow UI: a FastAPI app the api-server mounts (``segrep_plugin.py``).

It reads segrep's catalog through the ``segrep`` package (never Airflow's metadata database), writes nothing,
and answers only users whom Airflow's auth manager lets read the segrep DAGs. ``docs/operator-page.md`` says
how to open it and what each number means.
"""
