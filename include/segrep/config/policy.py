"""A table's replication policy: schedules, retries, thresholds and retention, each bounded.

``schedule: on_write`` (DESIGN section 15) runs a round after committed writes instead of on a clock: rounds
start at most one per ``min_interval`` (a burst of writes gives few rounds), and a slow time schedule
(:attr:`Policy.write_fallback_s`) stays underneath, so a write whose event was lost still replicates.

Every value is checked here, when the definitions file is loaded (``segrep apply`` and the DAG files alike),
with the parser the DAGs use for schedules: a value the DAGs cannot build (a schedule Airflow rejects, a
``retry_delay_s`` that overflows ``timedelta``) or one that silently never runs (``end_date`` before
``start_date``) is refused by name instead of taking the table's DAGs down at import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from segrep.config.schedule import ON_WRITE, parse_schedule
from segrep.core.errors import SegrepError

DAY_S = 86400
BACKOFF_CAP_S = 3600  # retries back off exponentially up to one hour (Airflow's max_retry_delay, segrep's back-off)
MAX_DURATION_S = 3650 * DAY_S  # ten years: past that a duration is a typo, and µs arithmetic stays far from 2**63
MAX_BYTES = 2**50  # 1 PiB
EARLIEST_DATE = date(1970, 1, 1)  # catalog times are µs since the epoch
LATEST_DATE = date(2999, 12, 31)
_DURATION_RE = re.compile(r"(\d{1,12})\s*([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": DAY_S, "w": 7 * DAY_S}

# (lowest, highest, what a value means) of every integer field; durations (``*_s``) also take "30s", "12h".
_BOUNDS: dict[str, tuple[int, int, str]] = {
    "max_incoming_segments": (1, 10_000, "segments in flight to one receiver"),
    "spark_copy_threshold_bytes": (1, MAX_BYTES, "bytes"),
    "verify_spark_threshold_bytes": (1, MAX_BYTES, "bytes"),
    "one_task_round_max_bytes": (0, MAX_BYTES, "bytes (0: every round takes the mapped tasks)"),
    "in_process_merge_max_rows": (0, 10**12, "rows"),
    "in_process_merge_max_bytes": (0, MAX_BYTES, "bytes"),
    "retries": (0, 100, "retries"),
    "retry_delay_s": (0, BACKOFF_CAP_S, "seconds (the back-off is capped at one hour)"),
    "compact_min_segments": (1, 1_000_000, "segments"),
    "compact_min_bytes": (1, MAX_BYTES, "bytes"),
    "tombstone_grace_s": (0, MAX_DURATION_S, "seconds (at most 3650d)"),
    "max_retention_s": (0, MAX_DURATION_S, "seconds (at most 3650d)"),
    "orphan_grace_s": (0, MAX_DURATION_S, "seconds (at most 3650d)"),
}


# rounds on write: the least time between the starts of two rounds (the plan step waits out the rest). Longer
# spacings are a fixed-interval schedule's job: the wait holds a worker slot.
MIN_INTERVAL_MAX_S = 3600
# the time schedule under ``on_write`` (a lost event delays replication by at most this): 5 minutes, or half
# the RPO when that is shorter, but at least a minute (idle runs cost the scheduler) and ``min_interval``
WRITE_FALLBACK_S = 300
WRITE_FALLBACK_FLOOR_S = 60

ON_RETURN = ("rollback", "merge")
# where merges run: "auto" by the in_process_merge_* thresholds, or always on one engine
MERGE_ENGINES = ("auto", "spark", "in_process")
PUBLISH_FORMATS = ("iceberg",)
# durations that may be absent (null: off), by their key in the definitions file -> the Policy field
_OPTIONAL_DURATIONS = {"rpo": "rpo_s", "feeder_fallback": "feeder_fallback_s"}
# durations named without their unit in the file -> (the Policy field, lowest, highest seconds)
_DURATIONS = {"min_interval": ("min_interval_s", 0, MIN_INTERVAL_MAX_S)}


@dataclass(frozen=True)
class Policy:
    """How a table replicates: schedule and the thresholds rounds, compaction and GC obey."""

    # cron expression or preset, a fixed interval such as "10m", or "on_write"; see schedule.py
    schedule: str | None = "@hourly"
    start_date: date | datetime = date(2026, 1, 1)  # a date means midnight UTC
    end_date: date | datetime | None = None  # no scheduled runs after this (backfills still work before it)
    maintenance_schedule: str | None = "@daily"  # compaction and GC (the maintenance DAG)
    verify_schedule: str | None = "@daily"  # rows and files compared with the leader's (the verify DAG)
    max_incoming_segments: int = 8
    spark_copy_threshold_bytes: int = 256 * 1024 * 1024
    # a partition whose leader and replica files together reach this many bytes is digested on Spark by verify
    verify_spark_threshold_bytes: int = 256 * 1024 * 1024
    # A round that copies at most this many bytes (and whose merges, if any, run in process) runs whole in one
    # Airflow task; a bigger one maps its fast-forward per target and merges on Spark (DESIGN section 15)
    one_task_round_max_bytes: int = 256 * 1024 * 1024
    # A merge manifest (round forks, compaction and cut majors, split rewrites) whose input files hold at most
    # this many rows and bytes runs in the segrep process with pyarrow instead of as a Spark application
    # (``spark.merge_runner``; defaults from bench/merge_crossover.py, docs/benchmarks.md). ``merge_engine``:
    # "auto" decides by them; "spark" or "in_process" always uses that engine (SEGREP_MERGE_ENGINE overrides).
    in_process_merge_max_rows: int = 1_000_000
    in_process_merge_max_bytes: int = 64 * 1024 * 1024  # ~12 x the input in memory (bench/merge_crossover.py)
    merge_engine: str = "auto"
    # "iceberg": each site's copy is published as an Iceberg table at its safe time (DESIGN section 18,
    # ``segrep.publish``); None: not published
    publish: str | None = None
    retries: int = 3
    retry_delay_s: int = 30
    compact_min_segments: int = 10
    compact_min_bytes: int = 512 * 1024 * 1024
    tombstone_grace_s: int = 7 * DAY_S
    max_retention_s: int = 7 * DAY_S
    orphan_grace_s: int = DAY_S
    # What a failed-over leader's un-replicated segments become when its site returns (DESIGN section 11):
    # "rollback" sets their rows aside in a rollback area at that site, "merge" pushes them to the new leader.
    on_return: str = "rollback"
    # The recovery-point objective: a run whose target ends further behind than this fails its report task,
    # and status and the operator's page mark it (None: no objective).
    rpo_s: int | None = None
    # A cascaded replica (``from: <feeder>``) whose feeder has been unreachable this long is fed by the
    # leader instead until the feeder returns (DESIGN section 12); None: never (it waits for its feeder).
    feeder_fallback_s: int | None = None
    # With ``schedule: on_write``: rounds start at least this far apart (0: back to back).
    min_interval_s: int = 10

    @property
    def on_write(self) -> bool:
        """Rounds run after committed writes (each write emits the table's Airflow asset event)."""
        return self.schedule == ON_WRITE

    @property
    def write_fallback_s(self) -> int:
        """The time schedule kept under ``on_write``: the longest a lost write event delays replication."""
        fallback = WRITE_FALLBACK_S if self.rpo_s is None else min(WRITE_FALLBACK_S, self.rpo_s // 2)
        return max(fallback, WRITE_FALLBACK_FLOOR_S, self.min_interval_s)


# the keys a policy mapping may have in the definitions file
_RENAMED = {**_OPTIONAL_DURATIONS, **{key: spec[0] for key, spec in _DURATIONS.items()}}
POLICY_KEYS = frozenset(set(Policy.__dataclass_fields__) - set(_RENAMED.values()) | set(_RENAMED))


def _optional_duration(value: Any, where: str) -> int | None:
    """A duration such as ``15m`` (at least one second), or null for off."""
    return None if value is None else _duration(value, where, 1, MAX_DURATION_S, "or null")


def _duration(value: Any, where: str, low: int, high: int, alternative: str = "") -> int:
    """Seconds from an integer or a duration such as ``15m``, ``low`` to ``high``."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        shape = f"a duration like 30s, 15m, 12h, 7d{', ' + alternative if alternative else ''}"
        raise SegrepError(f"{where}: expected {shape}; got {value!r}")
    seconds = value if isinstance(value, int) else parse_duration_s(value, where, MAX_DURATION_S)
    if not low <= seconds <= high:
        raise SegrepError(f"{where}: {value!r} is out of range: {low} to {high} seconds")
    return seconds


def parse_policy(body: dict[str, Any], where: str) -> Policy:
    """The policy from its mapping in the definitions file (unknown keys already refused); ``where`` names it."""
    values: dict[str, Any] = {}
    for key, value in body.items():
        if key in ("schedule", "maintenance_schedule", "verify_schedule"):
            try:
                parse_schedule(value, on_write=key == "schedule")
            except SegrepError as exc:  # "schedule '10x' is not...": the other schedules say which one it is
                raise SegrepError(f"{where}{'' if key == 'schedule' else ' ' + key}: {exc}") from None
            values[key] = value.strip() if isinstance(value, str) else None
        elif key in ("on_return", "merge_engine"):
            allowed = ON_RETURN if key == "on_return" else MERGE_ENGINES
            if value not in allowed:
                raise SegrepError(f"{where} {key}: expected one of {', '.join(allowed)}; got {value!r}")
            values[key] = value
        elif key == "publish":
            if value is not None and value not in PUBLISH_FORMATS:
                raise SegrepError(
                    f"{where} publish: expected one of {', '.join(PUBLISH_FORMATS)} or null; got {value!r}"
                )
            values[key] = value
        elif key in _OPTIONAL_DURATIONS:
            values[_OPTIONAL_DURATIONS[key]] = _optional_duration(value, f"{where} {key}")
        elif key in _DURATIONS:
            field_name, low, high = _DURATIONS[key]
            values[field_name] = _duration(value, f"{where} {key}", low, high)
        elif key in ("start_date", "end_date"):
            values[key] = None if value is None and key == "end_date" else _date(value, f"{where} {key}")
        else:
            values[key] = _integer(key, value, f"{where} {key}")
    policy = Policy(**values)
    if "min_interval" in body and not policy.on_write:
        raise SegrepError(
            f"{where} min_interval: only applies to `schedule: {ON_WRITE}` (the schedule is {policy.schedule!r}); "
            "remove it or set the schedule to on_write"
        )
    if policy.end_date is not None and utc(policy.end_date) < utc(policy.start_date):
        raise SegrepError(
            f"{where}: end_date {policy.end_date} is before start_date {policy.start_date}: the table would never run"
        )
    if policy.tombstone_grace_s < policy.max_retention_s:
        raise SegrepError(
            f"{where}: tombstone_grace_s must be at least max_retention_s, or a replica away for the "
            "whole retention could resurrect deleted rows"
        )
    return policy


def utc(when: date | datetime) -> datetime:
    """A policy date as an aware UTC date-time (a date is midnight UTC, a date-time without a zone is UTC)."""
    if not isinstance(when, datetime):
        return datetime(when.year, when.month, when.day, tzinfo=UTC)
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _integer(key: str, value: Any, where: str) -> int:
    low, high, unit = _BOUNDS[key]
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif key.endswith("_s") and isinstance(value, str):
        m = _DURATION_RE.fullmatch(value.strip())
        number = int(m.group(1)) * _UNITS[m.group(2)] if m else None
    if number is None:
        shape = "seconds or a duration like 30s, 15m, 12h, 7d, 2w" if key.endswith("_s") else "an integer"
        raise SegrepError(f"{where}: expected {shape}; got {value!r}")
    if not low <= number <= high:
        raise SegrepError(f"{where}: {value!r} is out of range: {low} to {high} {unit}")
    return number


def _date(value: Any, where: str) -> date | datetime:
    """A date (midnight UTC) or an ISO-8601 date-time (UTC unless it names a zone), 1970 to 2999."""
    when: date | datetime | None = value if isinstance(value, date) else None
    if isinstance(value, str):
        text = value.strip()
        try:
            when = datetime.fromisoformat(text) if "T" in text or " " in text else date.fromisoformat(text)
        except ValueError:
            when = None
    if when is None:
        raise SegrepError(f"{where}: expected a date YYYY-MM-DD or a date-time YYYY-MM-DDTHH:MM:SS, got {value!r}")
    try:
        in_range = EARLIEST_DATE <= utc(when).date() <= LATEST_DATE
    except OverflowError:  # a zone offset pushing year 1 or 9999 out of range
        in_range = False
    if not in_range:
        raise SegrepError(f"{where}: {value!r} is out of range: {EARLIEST_DATE} to {LATEST_DATE}")
    return when


def parse_duration_s(value: str, where: str, high: int = MAX_DURATION_S) -> int:
    """Seconds from ``30``, ``30s``, ``15m``, ``12h``, ``7d`` or ``2w`` (0 to ``high``); SegrepError naming
    ``where`` otherwise (the policy's durations read the same way)."""
    text = value.strip()
    number = int(text) if text.isdigit() and len(text) <= 12 else None
    if number is None and (m := _DURATION_RE.fullmatch(text)):
        number = int(m.group(1)) * _UNITS[m.group(2)]
    if number is None:
        raise SegrepError(f"{where}: expected seconds or a duration like 30s, 15m, 12h, 7d, 2w; got {value!r}")
    if not 0 <= number <= high:
        raise SegrepError(f"{where}: {value!r} is out of range: 0 to {high} seconds")
    return number
