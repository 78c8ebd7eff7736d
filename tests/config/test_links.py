"""Links in the definitions file (issue 36 item 1, DESIGN section 17): every form an entry takes, the cap in force
at the edges of its windows, when it changes next (against a minute-by-minute scan), and every bad entry
refused by `segrep apply` (and the other commands) as one line naming it, with nothing written."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from segrep.config.definitions import Definitions, load_definitions
from segrep.config.links import LinkDef
from segrep.core.errors import ConfigError
from tests.support.badinput import assert_user_error, unchanged
from tests.support.cli import cli
from tests.support.env import LINKS_YAML, ORDERS_YAML, Env, shared_env

MB = 1000**2
MIB = 1024**2
FRI = datetime(2026, 11, 27, tzinfo=UTC)  # a Friday, midnight UTC
SAT, SUN, MON = (FRI + timedelta(days=n) for n in (1, 2, 3))


def at(day: datetime, hh: int, mm: int = 0, ss: int = 0, us: int = 0) -> datetime:
    return day.replace(hour=hh, minute=mm, second=ss, microsecond=us)


def links_doc(*entries: Any) -> dict[str, Any]:
    doc: dict[str, Any] = copy.deepcopy(yaml.safe_load(ORDERS_YAML))
    doc["links"] = list(entries)
    return doc


def write_doc(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def load_links(tmp_path: Path, *entries: Any) -> Definitions:
    return load_definitions(write_doc(tmp_path / "links.yaml", links_doc(*entries)))


def one_link(tmp_path: Path, **entry: Any) -> LinkDef:
    (link,) = load_links(tmp_path, {"between": ["primary", "dr"], **entry}).links
    return link


def window(days: Any = None, start: str = "08:00", end: str = "20:00", rate: Any = "20MB") -> dict[str, Any]:
    out: dict[str, Any] = {"from": start, "to": end, "max_bytes_per_second": rate}
    return out if days is None else {"days": days, **out}


# -- the forms an entry takes -----------------------------------------------------------------------------------


def test_the_links_file_reads_both_ways_and_one_way_entries(tmp_path: Path) -> None:
    (tmp_path / "segrep.yaml").write_text(LINKS_YAML)
    defs = load_definitions(tmp_path / "segrep.yaml")
    both, one_way = defs.links
    assert (both.source, both.target, both.both_ways, both.pair) == ("primary", "dr", True, "primary <-> dr")
    assert both.max_bytes_per_second == 200 * MB and both.max_concurrent_copies == 4
    assert [(w.max_bytes_per_second, w.describe()) for w in both.windows] == [
        (20 * MB, "weekdays 08:00-20:00"),
        (None, "weekends 00:00-24:00"),
    ]
    assert (one_way.pair, one_way.max_bytes_per_second, one_way.windows, one_way.max_concurrent_copies) == (
        "dr -> edge",
        5 * MIB,
        (),
        None,
    )
    assert defs.link("primary", "dr") is both and defs.link("dr", "primary") is both
    assert defs.link("dr", "edge") is one_way and defs.link("edge", "dr") is None
    assert defs.link("primary", "edge") is None
    assert both.applies_to("dr", "primary") and not one_way.applies_to("edge", "dr")


def test_no_links_is_an_empty_tuple(tmp_path: Path) -> None:
    assert load_definitions(write_doc(tmp_path / "a.yaml", yaml.safe_load(ORDERS_YAML))).links == ()
    doc = links_doc()
    doc["links"] = None
    assert load_definitions(write_doc(tmp_path / "b.yaml", doc)).links == ()


@pytest.mark.parametrize(
    ("rate", "expected"),
    [
        (1, 1),
        (20_000_000, 20 * MB),
        ("20MB", 20 * MB),
        ("20 MB", 20 * MB),
        ("200 MiB", 200 * MIB),
        ("1.5GB", 1_500_000_000),
        ("64kB", 64_000),
        ("64 KB", 64_000),
        ("2 KiB", 2048),
        ("1 TiB", 1024**4),
        ("20MB/s", 20 * MB),
        ("512", 512),
        ("unlimited", None),
        (" Unlimited ", None),
    ],
)
def test_rates_take_bytes_sizes_and_unlimited(tmp_path: Path, rate: Any, expected: int | None) -> None:
    link = one_link(tmp_path, max_bytes_per_second=rate, windows=[window(rate=rate)])
    assert link.max_bytes_per_second == expected and link.windows[0].max_bytes_per_second == expected


@pytest.mark.parametrize(
    ("days", "expected"),
    [
        (None, {0, 1, 2, 3, 4, 5, 6}),
        ("daily", {0, 1, 2, 3, 4, 5, 6}),
        ("weekdays", {0, 1, 2, 3, 4}),
        ("weekends", {5, 6}),
        ("sat", {5}),
        (["mon", "Friday", "SUN"], {0, 4, 6}),
        (["weekends", "mon"], {0, 5, 6}),
    ],
)
def test_window_days(tmp_path: Path, days: Any, expected: set[int]) -> None:
    (w,) = one_link(tmp_path, max_bytes_per_second="1GB", windows=[window(days)]).windows
    assert w.days == frozenset(expected)


def test_a_window_may_run_past_midnight_or_to_24_00(tmp_path: Path) -> None:
    link = one_link(
        tmp_path,
        max_bytes_per_second="1GB",
        windows=[window("fri", "20:00", "08:00", "10MB"), window("mon", "00:00", "24:00", "30MB")],
    )
    night, monday = link.windows
    assert night.describe() == "fri 20:00-08:00" and monday.describe() == "mon 00:00-24:00"
    assert link.cap_at(at(FRI, 20)) == 10 * MB and link.cap_at(at(SAT, 7, 59, 59)) == 10 * MB
    assert link.cap_at(at(SAT, 8)) == 1_000_000_000 and link.cap_at(at(FRI, 19, 59, 59)) == 1_000_000_000


# -- the cap in force at the edges ------------------------------------------------------------------------------


@pytest.fixture
def office_hours(tmp_path: Path) -> LinkDef:
    """LINKS_YAML's primary <-> dr: 20 MB/s weekdays 08:00-20:00, unlimited weekends, 200 MB/s otherwise."""
    (tmp_path / "segrep.yaml").write_text(LINKS_YAML)
    return load_definitions(tmp_path / "segrep.yaml").links[0]


@pytest.mark.parametrize(
    ("when", "cap", "source"),
    [
        (at(FRI, 7, 59, 59, 999_999), 200 * MB, "default"),
        (at(FRI, 8), 20 * MB, "window weekdays 08:00-20:00"),
        (at(FRI, 12), 20 * MB, "window weekdays 08:00-20:00"),
        (at(FRI, 19, 59, 59), 20 * MB, "window weekdays 08:00-20:00"),
        (at(FRI, 20), 200 * MB, "default"),
        (at(FRI, 23, 59, 59, 999_999), 200 * MB, "default"),
        (at(SAT, 0), None, "window weekends 00:00-24:00"),
        (at(SAT, 8), None, "window weekends 00:00-24:00"),
        (at(SUN, 23, 59, 59), None, "window weekends 00:00-24:00"),
        (at(MON, 0), 200 * MB, "default"),
        (at(MON, 8), 20 * MB, "window weekdays 08:00-20:00"),
    ],
)
def test_cap_at_the_edges_of_the_windows(office_hours: LinkDef, when: datetime, cap: int | None, source: str) -> None:
    assert office_hours.cap_at(when) == cap
    assert office_hours.in_force(when).source == source


def test_times_are_utc(office_hours: LinkDef) -> None:
    """A naive time is UTC; an aware one is converted (09:00 at UTC+2 is 07:00 UTC: before the window)."""
    assert office_hours.cap_at(datetime(2026, 11, 27, 8)) == 20 * MB
    assert office_hours.cap_at(datetime(2026, 11, 27, 9, tzinfo=timezone(timedelta(hours=2)))) == 200 * MB
    assert office_hours.cap_at(datetime(2026, 11, 27, 21, tzinfo=timezone(timedelta(hours=-3)))) is None  # Sat 00:00


def test_a_window_wrapping_from_sunday_into_monday(tmp_path: Path) -> None:
    link = one_link(tmp_path, max_bytes_per_second="1GB", windows=[window("sun", "22:00", "02:00", "1MB")])
    assert link.cap_at(at(SUN, 21, 59)) == 10**9 and link.cap_at(at(SUN, 22)) == MB
    assert link.cap_at(at(MON, 1, 59, 59)) == MB and link.cap_at(at(MON, 2)) == 10**9
    assert link.next_change_after(at(SUN, 23)) == at(MON, 2)


# -- when the cap changes next --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("when", "change"),
    [
        (at(FRI, 7), at(FRI, 8)),
        (at(FRI, 7, 59, 59, 999_999), at(FRI, 8)),
        (at(FRI, 8), at(FRI, 20)),  # strictly after: at 08:00 the window has begun
        (at(FRI, 19, 59, 59), at(FRI, 20)),
        (at(FRI, 20), at(SAT, 0)),
        (at(SAT, 12), at(MON, 0)),
        (at(SUN, 23, 59, 59), at(MON, 0)),
        (at(MON, 0), at(MON, 8)),
    ],
)
def test_next_change_after(office_hours: LinkDef, when: datetime, change: datetime) -> None:
    assert office_hours.next_change_after(when) == change
    state = office_hours.state_at(when)
    assert state.next_change == change and state.next_cap == office_hours.cap_at(change)


def test_a_cap_that_never_changes_has_no_next_change(tmp_path: Path) -> None:
    assert one_link(tmp_path, max_bytes_per_second="5MB").next_change_after(at(FRI, 12)) is None
    same = one_link(tmp_path, max_bytes_per_second="5MB", windows=[window("weekdays", rate=5 * MB)])
    assert same.next_change_after(at(FRI, 12)) is None and same.state_at(at(FRI, 12)).next_change_text() == "-"


def test_back_to_back_windows_at_one_rate_are_one_stretch(tmp_path: Path) -> None:
    link = one_link(
        tmp_path,
        max_bytes_per_second="5MB",
        windows=[window(None, "08:00", "12:00", "1MB"), window(None, "12:00", "20:00", "1MB")],
    )
    assert link.next_change_after(at(FRI, 9)) == at(FRI, 20)
    assert link.in_force(at(FRI, 12)).source == "window every day 12:00-20:00"


TIMETABLES: list[list[dict[str, Any]]] = [
    [window("weekdays", "08:00", "20:00", "20MB"), window("weekends", "00:00", "24:00", "unlimited")],
    [window("fri", "20:00", "08:00", "1MB"), window(["mon", "wed"], "13:30", "13:31", "2MB")],
    [window("sun", "22:00", "02:00", "1MB"), window("mon", "02:00", "03:00", "1MB"), window("tue", "23:59", "00:01")],
    [window(None, "00:00", "24:00", "3MB")],
    [window(None, "06:15", "06:45", "200MB")],
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    table=st.sampled_from(range(len(TIMETABLES))),
    when=st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2027, 12, 31), timezones=st.just(UTC)),
)
def test_next_change_matches_a_minute_by_minute_scan(tmp_path: Path, table: int, when: datetime) -> None:
    """Windows start and end on whole minutes: the first minute after ``when`` at which ``cap_at`` differs is
    the change (eight days of minutes: the timetable repeats weekly), and the cap holds until then."""
    link = one_link(tmp_path, max_bytes_per_second="200MB", windows=TIMETABLES[table])
    now = link.cap_at(when)
    minute = when.replace(second=0, microsecond=0) + timedelta(minutes=1)
    expected = next(
        (minute + timedelta(minutes=n) for n in range(8 * 1440) if link.cap_at(minute + timedelta(minutes=n)) != now),
        None,
    )
    assert link.next_change_after(when) == expected
    if expected is not None:
        assert link.cap_at(expected - timedelta(microseconds=1)) == now


# -- bad entries, through the command line ----------------------------------------------------------------------

OK_LINK: dict[str, Any] = {"between": ["primary", "dr"], "max_bytes_per_second": "200MB"}


def entry(**changes: Any) -> dict[str, Any]:
    out = {**OK_LINK, **changes}
    return {k: v for k, v in out.items() if v is not None}


def with_windows(*windows: Any) -> dict[str, Any]:
    return entry(windows=list(windows))


# (id, the links list, what the one line must name)
BAD_LINKS: list[tuple[str, Any, tuple[str, ...]]] = [
    ("not-a-list", {"between": ["primary", "dr"]}, ("links", "expected a list")),
    ("entry-not-mapping", ["primary <-> dr"], ("links[0]", "expected a mapping")),
    ("unknown-site", [entry(between=["primary", "moon"])], ("links[0]", "'moon' is not a defined site")),
    ("unknown-from", [entry(between=None, **{"from": "mars", "to": "dr"})], ("links[0]", "'mars'", "not a defined")),
    ("to-itself", [entry(between=["dr", "dr"])], ("links[0]", "site dr to itself")),
    ("from-to-itself", [entry(between=None, **{"from": "edge", "to": "edge"})], ("links[0]", "edge to itself")),
    ("between-three", [entry(between=["primary", "dr", "edge"])], ("links[0]", "'between'", "two site names")),
    ("between-and-from", [entry(**{"from": "primary", "to": "dr"})], ("links[0]", "not both")),
    ("from-without-to", [entry(between=None, **{"from": "primary"})], ("links[0]", "'from: a' and 'to: b'")),
    ("no-sites", [{"max_bytes_per_second": "1MB"}], ("links[0]", "between")),
    ("no-rate", [entry(max_bytes_per_second=None)], ("links[0] (primary <-> dr)", "give max_bytes_per_second")),
    ("rate-zero", [entry(max_bytes_per_second=0)], ("links[0] (primary <-> dr) max_bytes_per_second", "at least 1")),
    ("rate-negative", [entry(max_bytes_per_second=-5)], ("max_bytes_per_second", "-5", "out of range")),
    ("rate-zero-size", [entry(max_bytes_per_second="0MB")], ("max_bytes_per_second", "'0MB'", "out of range")),
    ("rate-negative-size", [entry(max_bytes_per_second="-20MB")], ("max_bytes_per_second", "'-20MB'", "not a size")),
    ("rate-bits", [entry(max_bytes_per_second="100Mb")], ("max_bytes_per_second", "'100Mb'", "bits")),
    ("rate-words", [entry(max_bytes_per_second="fast")], ("max_bytes_per_second", "'fast'", "unlimited")),
    ("rate-bool", [entry(max_bytes_per_second=True)], ("max_bytes_per_second", "bytes per second")),
    ("rate-float", [entry(max_bytes_per_second=1.5)], ("max_bytes_per_second", "bytes per second")),
    ("rate-huge", [entry(max_bytes_per_second="5 PB")], ("max_bytes_per_second", "'5 PB'")),
    ("rate-over-bound", [entry(max_bytes_per_second=2**41)], ("max_bytes_per_second", "out of range")),
    ("copies-zero", [entry(max_concurrent_copies=0)], ("max_concurrent_copies", "got 0")),
    ("copies-negative", [entry(max_concurrent_copies=-2)], ("max_concurrent_copies", "got -2")),
    ("copies-text", [entry(max_concurrent_copies="4")], ("max_concurrent_copies", "'4'")),
    ("copies-bool", [entry(max_concurrent_copies=True)], ("max_concurrent_copies", "True")),
    ("unknown-key", [entry(bandwidth="1MB")], ("links[0] (primary <-> dr)", "unknown key(s) bandwidth")),
    ("windows-not-list", [entry(windows={"from": "08:00"})], ("windows", "expected a list")),
    ("window-not-mapping", [with_windows("08:00-20:00")], ("windows[0]", "expected a mapping")),
    ("window-unknown-key", [with_windows({**window(), "zone": "CET"})], ("windows[0]", "unknown key(s) zone")),
    ("window-no-to", [with_windows({"from": "08:00", "max_bytes_per_second": "1MB"})], ("windows[0]", "'to'")),
    ("window-no-rate", [with_windows({"from": "08:00", "to": "09:00"})], ("windows[0]", "max_bytes_per_second")),
    ("window-rate-zero", [with_windows(window(rate=0))], ("windows[0] max_bytes_per_second", "out of range")),
    ("window-rate-neg", [with_windows(window(rate=-1))], ("windows[0] max_bytes_per_second", "out of range")),
    ("time-words", [with_windows(window(start="8am"))], ("windows[0] from", "'8am'", "HH:MM")),
    ("time-25", [with_windows(window(end="25:00"))], ("windows[0] to", "'25:00'")),
    ("time-minute-60", [with_windows(window(start="08:60"))], ("windows[0] from", "'08:60'")),
    ("time-seconds", [with_windows(window(start="08:00:30"))], ("windows[0] from", "'08:00:30'")),
    ("from-24", [with_windows(window(start="24:00", end="02:00"))], ("windows[0] from", "'24:00'", "23:59")),
    ("time-unquoted", [with_windows(window(end=1200))], ("windows[0] to", "1200", "in quotes")),  # to: 20:00
    ("time-null", [with_windows(window(start=None))], ("windows[0] from", "None")),
    ("empty-window", [with_windows(window(start="08:00", end="08:00"))], ("windows[0]", "both 08:00", "empty")),
    ("day-unknown", [with_windows(window(days="funday"))], ("windows[0] days", "'funday'", "not a day")),
    ("days-empty", [with_windows(window(days=[]))], ("windows[0] days", "[]")),
    ("days-number", [with_windows(window(days=[1]))], ("windows[0] days", "1 is not a day")),
    (
        "overlap-same-day",
        [with_windows(window("weekdays", "08:00", "20:00"), window("fri", "19:00", "21:00", "1MB"))],
        ("windows[0] (weekdays 08:00-20:00) and windows[1] (fri 19:00-21:00) overlap from fri 19:00",),
    ),
    (
        "overlap-across-midnight",
        [with_windows(window("fri", "22:00", "02:00"), window("sat", "01:00", "03:00", "1MB"))],
        ("windows[0] (fri 22:00-02:00)", "windows[1] (sat 01:00-03:00)", "overlap from sat 01:00"),
    ),
    (
        "overlap-sunday-into-monday",
        [with_windows(window("sun", "23:00", "01:00"), window("weekdays", "00:30", "06:00", "1MB"))],
        ("overlap from mon 00:30",),
    ),
    (
        "overlap-whole-days",
        [with_windows(window(None, "00:00", "24:00"), window("sat", "12:00", "13:00", "1MB"))],
        ("overlap from sat 12:00",),
    ),
    (
        "duplicate-direction",
        [OK_LINK, entry(between=None, **{"from": "dr", "to": "primary"})],
        ("links[1] (dr -> primary)", "dr -> primary already has a link, links[0] (primary <-> dr)"),
    ),
    (
        "duplicate-reversed",
        [OK_LINK, entry(between=["dr", "primary"])],
        ("links[1] (dr <-> primary)", "already has a link, links[0]"),
    ),
    (
        "duplicate-one-way",
        [entry(between=None, **{"from": "dr", "to": "edge"}), entry(between=None, **{"from": "dr", "to": "edge"})],
        ("links[1] (dr -> edge)", "dr -> edge already has a link"),
    ),
]


def bad_links_file(env: Env, links: Any) -> Path:
    doc = links_doc()
    doc["links"] = links
    return write_doc(env.config.with_name("bad_links.yaml"), doc)


@pytest.fixture(scope="module", params=["sqlite"])
def refusing_env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """One environment for every refused link (each proves it changed nothing)."""
    yield from shared_env(request, tmp_path_factory, ORDERS_YAML)


@pytest.mark.parametrize(("links", "needles"), [c[1:] for c in BAD_LINKS], ids=[c[0] for c in BAD_LINKS])
def test_apply_refuses_a_bad_link(refusing_env: Env, links: Any, needles: tuple[str, ...]) -> None:
    sqlite_env = refusing_env
    path = bad_links_file(sqlite_env, links)
    for args in (["apply", "--dry-run"], ["apply"]):
        with unchanged(sqlite_env):
            code, out, err = cli(sqlite_env, *args, config=path)
        assert_user_error(code, out, err, str(path), *needles)
    with pytest.raises(ConfigError):  # the DAG files' load too: links are the file's, not one table's
        load_definitions(path, isolate_tables=True)


def test_every_command_that_reads_the_definitions_refuses_a_bad_link(env: Env) -> None:
    path = bad_links_file(env, [entry(between=["primary", "moon"])])
    for args in (["status"], ["site", "list"], ["table", "list"], ["apply"]):
        with unchanged(env):
            code, out, err = cli(env, *args, config=path)
        assert_user_error(code, out, err, str(path), "links[0]", "'moon' is not a defined site")


def test_valid_links_apply_and_write_nothing_of_theirs(env: Env) -> None:
    """Links are the definitions' alone: applying a file that adds them changes no catalog row."""
    path = env.config.with_name("links.yaml")
    path.write_text(LINKS_YAML)
    with unchanged(env):
        code, out, err = cli(env, "apply", "--dry-run", config=path)
    assert code == 0, err
    with unchanged(env):
        code, out, err = cli(env, "apply", config=path)
    assert code == 0 and "nothing to change" in out, (out, err)
