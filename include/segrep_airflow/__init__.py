"""Airflow glue for segrep's DAGs (the only package that imports Airflow; ``segrep`` itself never does)."""
