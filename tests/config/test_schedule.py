"""Tests of segrep.config.schedule.parse_schedule: the one parser for policy schedules (apply and the DAGs).

It must accept exactly what the DAG files can build into a timetable that fires, and refuse everything else
with a SegrepError naming the value (issue 11 item 5).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segrep.config.schedule import CRON_PRESETS, MAX_INTERVAL_S, Schedule, parse_schedule
from segrep.core.errors import SegrepError

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10m", Schedule(text="10m", interval_s=600)),
        (" 2 h ", Schedule(text="2 h", interval_s=7200)),
        ("365d", Schedule(text="365d", interval_s=MAX_INTERVAL_S)),
        ("@hourly", Schedule(text="@hourly", cron="0 * * * *")),
        ("@quarterly", Schedule(text="@quarterly", cron="0 0 1 */3 *")),
        ("*/5 * * * *", Schedule(text="*/5 * * * *", cron="*/5 * * * *")),
        ("0  0 29 2 *", Schedule(text="0  0 29 2 *", cron="0 0 29 2 *")),  # fires every leap year
        ("0 0 L * *", Schedule(text="0 0 L * *", cron="0 0 L * *")),
    ],
)
def test_valid_schedules(text: str, expected: Schedule) -> None:
    assert parse_schedule(text) == expected


def test_null_is_manual() -> None:
    assert parse_schedule(None) is None


def test_on_write_only_where_the_caller_allows_it() -> None:
    """``on_write`` is a replication schedule only: the maintenance and verify schedules refuse it by name."""
    assert parse_schedule(" on_write ", on_write=True) == Schedule(text="on_write", on_write=True)
    assert parse_schedule("10m", on_write=True) == Schedule(text="10m", interval_s=600)
    with pytest.raises(SegrepError, match=r"schedule 'on_write' is only for a table's replication `schedule`"):
        parse_schedule("on_write")
    with pytest.raises(SegrepError, match="is not a schedule"):
        parse_schedule("on_write_", on_write=True)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("every hour", "is not a schedule"),
        ("0m", "more than 0s"),
        ("-5m", "is not a schedule"),
        ("10x", "is not a schedule"),
        ("366d", "at most 365d"),
        ("9999999999999999w", "is not a schedule"),
        ("@fortnightly", "not a known preset"),
        ("@once", "not a known preset"),
        ("61 * * * *", "not a valid cron expression"),
        ("*/0 * * * *", "not a valid cron expression"),
        ("H * * * *", "not a valid cron expression"),
        ("bogus", "is not a schedule"),
        ("0 * * * * *", "is not a schedule"),  # croniter's seconds field: not a cron expression Airflow documents
        ("0 0 31 2 *", "never fires"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
        ("", "is not a schedule"),
        (5, "is not a schedule"),
        (True, "is not a schedule"),
        (["@daily"], "is not a schedule"),
    ],
)
def test_bad_schedules_are_refused_by_value(value: object, fragment: str) -> None:
    with pytest.raises(SegrepError) as info:
        parse_schedule(value)
    assert repr(value) in str(info.value)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_presets_are_airflows() -> None:
    """The copied preset table is Airflow's own (segrep cannot import Airflow; this test can)."""
    from airflow.sdk.definitions.timetables._cron import CRON_PRESETS as SDK_PRESETS
    from airflow.utils.dates import cron_presets

    assert CRON_PRESETS == SDK_PRESETS == cron_presets


@settings(max_examples=60)
@given(number=st.integers(min_value=-10, max_value=10**7), unit=st.sampled_from(sorted(UNITS)))
def test_fixed_intervals_are_bounded(number: int, unit: str) -> None:
    text = f"{number}{unit}"
    seconds = number * UNITS[unit]
    if 0 < seconds <= MAX_INTERVAL_S:
        assert parse_schedule(text) == Schedule(text=text, interval_s=seconds)
    else:
        with pytest.raises(SegrepError, match="schedule"):
            parse_schedule(text)


FIELD = st.one_of(
    st.just("*"),
    st.integers(min_value=0, max_value=70).map(str),
    st.tuples(st.integers(0, 70), st.integers(0, 70)).map(lambda t: f"{t[0]}-{t[1]}"),
    st.integers(0, 70).map(lambda n: f"*/{n}"),
    st.sampled_from(["L", "?", "jan", "mon", "5#3", "x", ""]),
)


@settings(max_examples=150)
@given(fields=st.lists(FIELD, min_size=4, max_size=6))
def test_cron_expressions_agree_with_airflow(fields: list[str]) -> None:
    """Whatever parse_schedule accepts, Airflow's cron timetable builds and it has a next run; whatever Airflow
    cannot build or that never fires, parse_schedule refuses with a SegrepError (never another exception)."""
    import pendulum
    from airflow.sdk import CronDataIntervalTimetable
    from airflow.timetables.base import TimeRestriction
    from airflow.timetables.interval import CronDataIntervalTimetable as CoreTimetable

    text = " ".join(fields)
    try:
        parsed = parse_schedule(text)
    except SegrepError:
        parsed = None
    airflow_ok = len(text.split()) == 5
    if airflow_ok:
        try:
            CronDataIntervalTimetable(text, timezone="UTC")
            core = CoreTimetable(text, "UTC")
            core.validate()
            restriction = TimeRestriction(earliest=pendulum.datetime(2026, 1, 1, tz="UTC"), latest=None, catchup=True)
            airflow_ok = core.next_dagrun_info(last_automated_data_interval=None, restriction=restriction) is not None
        except Exception:  # any failure to build or to find a run: the DAG would break or stall
            airflow_ok = False
    assert (parsed is not None) == airflow_ok, text
    if parsed is not None:
        assert parsed.cron == " ".join(text.split()) and parsed.interval_s is None
