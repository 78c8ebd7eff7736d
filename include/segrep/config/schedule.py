"""Schedules of the definitions file, parsed once, the way the DAGs build their timetables.

A schedule is a fixed interval (``10m``: a DeltaDataIntervalTimetable), a cron expression or one of Airflow's
presets (a CronDataIntervalTimetable, UTC), or null (manual runs only); a table's replication ``schedule`` may
also be ``on_write`` (a round after committed writes: the DAG is scheduled on the table's writes asset, see
``segrep_airflow.schedules``), which no other schedule can be. ``segrep apply`` and the DAG files
both go through :func:`parse_schedule`, so a schedule apply accepts is one the DAGs can build and that
fires: a value Airflow would reject at import, or a cron expression that never matches a date (``0 0 31 2 *``),
is refused here with the value named instead of making the table's DAGs vanish or stall.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from croniter import (  # croniter ships no type information: see pyproject.toml [tool.mypy]
    CroniterBadCronError,
    CroniterBadDateError,
    CroniterError,
    croniter,
)

from segrep.core.errors import SegrepError

# Airflow's own preset table (airflow.sdk.definitions.timetables._cron.CRON_PRESETS, kept in sync with
# airflow.utils.dates.cron_presets); segrep cannot import Airflow, so it is copied here and checked by a test.
CRON_PRESETS: dict[str, str] = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@quarterly": "0 0 1 */3 *",
    "@yearly": "0 0 1 1 *",
}
ON_WRITE = "on_write"  # rounds on write (DESIGN section 15): only for the replication schedule
MAX_INTERVAL_S = 365 * 86400  # a longer fixed interval is a typo, not a replication schedule
_INTERVAL_RE = re.compile(r"(\d{1,12})\s*([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_CRON_FIELDS = 5  # minute hour day-of-month month day-of-week; croniter's 6th (seconds) and 7th (year) are not cron
_CRON_START = datetime(2000, 1, 1, tzinfo=UTC)  # any instant: a 5-field expression that fires once fires forever
_HELP = (
    "use a fixed interval such as 30s, 10m, 2h, 1d, 1w (at most 365d), "
    f"a 5-field cron expression, one of {', '.join(CRON_PRESETS)}, or null for manual runs "
    f"(the replication schedule also takes {ON_WRITE})"
)


@dataclass(frozen=True)
class Schedule:
    """A valid schedule: exactly one of ``interval_s`` (a fixed interval), ``cron`` (presets expanded) and
    ``on_write``."""

    text: str
    interval_s: int | None = None
    cron: str | None = None
    on_write: bool = False


def parse_schedule(value: object, *, on_write: bool = False) -> Schedule | None:
    """The schedule ``value`` of a policy (None: manual only); raise SegrepError naming a value the DAGs could
    not build or that would never run. ``on_write``: the value may be ``on_write`` (the replication schedule)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise SegrepError(f"schedule {value!r} is not a schedule: {_HELP}")
    text = value.strip()
    if text == ON_WRITE:
        if not on_write:
            raise SegrepError(f"schedule {value!r} is only for a table's replication `schedule` (rounds on write)")
        return Schedule(text=text, on_write=True)
    interval = _INTERVAL_RE.fullmatch(text)
    if interval:
        seconds = int(interval.group(1)) * _UNITS[interval.group(2)]
        if not 0 < seconds <= MAX_INTERVAL_S:
            raise SegrepError(f"schedule {value!r}: a fixed interval must be more than 0s and at most 365d")
        return Schedule(text=text, interval_s=seconds)
    if text.startswith("@"):
        if text not in CRON_PRESETS:
            raise SegrepError(f"schedule {value!r} is not a known preset: {_HELP}")
        return Schedule(text=text, cron=CRON_PRESETS[text])
    fields = text.split()
    if len(fields) != _CRON_FIELDS:
        raise SegrepError(f"schedule {value!r} is not a schedule: {_HELP}")
    cron = " ".join(fields)
    try:
        croniter(cron, _CRON_START).get_next(datetime)
    except CroniterBadDateError:
        raise SegrepError(f"schedule {value!r} never fires: no date matches it") from None
    except (CroniterBadCronError, CroniterError, ValueError, TypeError, KeyError, IndexError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SegrepError(f"schedule {value!r} is not a valid cron expression ({reason}): {_HELP}") from None
    return Schedule(text=text, cron=cron)
