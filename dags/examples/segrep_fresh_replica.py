"""
### Example: a DAG that runs when `dr`'s copy of `orders` is fresh

Every replication run of `orders` emits an asset event on `segrep://dr/orders` when dr's safe time advanced
(the `commit` and `report` tasks of `segrep_replicate_orders`). This DAG is scheduled on that asset, so it
runs after each such round and reads, from the event, up to when dr is complete: every row the leader
committed before `safe_time` can be read at dr (`segrep read orders --site dr --as-of <safe_time_us>`).

The event's `extra`: `table`, `site`, `safe_time` (ISO-8601), `safe_time_us` (µs since the epoch),
`segments_copied`, `bytes_copied`, `round_id`, `round_end`. Copy this file, change the site and table
(`replica_asset(site, table)` builds `Asset(name=uri, uri="segrep://<site>/<table>")`), and do the real
work in the task. It is built only when the definitions replicate orders to dr. It is paused at creation,
like every DAG: unpause it to let it run.
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import dag, task

from segrep_airflow.assets import replica_asset
from segrep_airflow.common import dag_definitions

SITE, TABLE = "dr", "orders"
FRESH = replica_asset(SITE, TABLE)


@dag(
    dag_id="segrep_example_fresh_replica",
    description="Example consumer: runs when dr's copy of orders advanced (asset segrep://dr/orders)",
    doc_md=__doc__,
    schedule=FRESH,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["segrep", "example"],
)
def segrep_example_fresh_replica() -> None:
    @task
    def use_fresh_copy(triggering_asset_events: Any = None) -> list[dict[str, Any]]:
        """Log (and return) what each triggering event says: dr holds orders up to its safe time."""
        seen = []
        for event in (triggering_asset_events or {}).get(FRESH, []):
            extra = dict(event.extra or {})
            print(
                f"{extra.get('table')} at {extra.get('site')} is complete up to {extra.get('safe_time')} "
                f"(round {extra.get('round_id')}: {extra.get('segments_copied')} segment(s), "
                f"{extra.get('bytes_copied')} bytes copied)",
                flush=True,
            )
            seen.append(extra)
        return seen

    use_fresh_copy()


_defs = dag_definitions()  # built only where the definitions replicate orders to dr (nothing to wait for otherwise)
if _defs is not None and TABLE in _defs.tables and SITE in _defs.tables[TABLE].replicas:
    segrep_example_fresh_replica()
