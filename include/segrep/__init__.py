"""segrep: segment-based replication of partitioned analytical tables between sites.

Never imports Airflow: DAGs, plugins and Spark jobs depend on this package, not the reverse.
"""

__version__ = "0.1.0"
