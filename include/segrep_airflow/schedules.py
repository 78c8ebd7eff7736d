"""The replication DAG's schedule from a table's policy: a timetable, or rounds on write with a fallback.

``schedule: on_write`` (DESIGN section 15) schedules the DAG on the table's writes asset (every committed
write emits an event on it: ``segrep.data.write_events``) *or* a slow fixed interval (Airflow 3's
``AssetOrTimeSchedule``), ``Policy.write_fallback_s``: an event that never arrives (Airflow was down when the
write committed, the writer had no API address) delays replication by at most that interval. The DAG keeps
``max_active_runs=1``: Airflow creates no asset-triggered run while one is queued or running, so the events of
a burst coalesce into the next run, and that run's plan step spaces it from the previous round
(:func:`spacing_s`, ``segrep.replication.spacing.wait_for_spacing``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import AssetOrTimeSchedule, DeltaDataIntervalTimetable

from segrep.config.policy import Policy
from segrep_airflow.assets import writes_asset
from segrep_airflow.common import timetable
from segrep_airflow.rounds import ASSET_TRIGGERED, run_kind


def replication_schedule(policy: Policy, table: str) -> Any:
    """The ``schedule=`` of ``table``'s replication DAG: its policy's timetable (None: manual only), or for
    ``on_write`` its writes asset or the fallback interval, whichever comes first."""
    if not policy.on_write:
        return timetable(policy.schedule)
    return AssetOrTimeSchedule(
        timetable=DeltaDataIntervalTimetable(timedelta(seconds=policy.write_fallback_s)),
        assets=writes_asset(table),
    )


def spacing_s(policy: Policy, run_type: object) -> int:
    """How far apart (seconds) this run's round must start from the previous round: the policy's
    ``min_interval`` for a run an asset event triggered, 0 for the others (a manual run starts when asked; the
    fallback's scheduled runs are minutes apart already)."""
    return policy.min_interval_s if policy.on_write and run_kind(run_type) == ASSET_TRIGGERED else 0
