"""The definitions file's problems, as one Airflow import error of this file (it builds no DAG).

The DAG files build the DAGs of every valid table and leave out a table whose definition is invalid (a
schedule Airflow cannot build, a policy out of bounds...), so one bad table never takes the other tables'
DAGs down. Airflow records import errors per file: this file's only job is to fail its import with one message
naming each table left out and its problem, or the definitions file's own error if it cannot be used at all
(then no DAG file builds anything). It reads the definitions file only: no catalog, no network.
"""

from __future__ import annotations

from segrep.core.errors import ConfigError
from segrep_airflow.common import definitions_problems

_problems = definitions_problems()
if _problems:
    raise ConfigError(_problems)
