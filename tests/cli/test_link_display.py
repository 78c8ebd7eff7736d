"""Links as `segrep site list`, `segrep status` (text and JSON) and `segrep apply` show them (issue 36 item 1):
per link the pair, the cap in force (human units) and where it comes from, the copy limit and the next change."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from segrep.cli.views import link_states, status_output
from segrep.config.links import LinkState
from segrep.core.human import human_rate
from tests.support.cli import cli
from tests.support.env import LINKS_YAML, ORDERS_YAML, Env

FRIDAY_NOON = datetime(2026, 11, 27, 12, tzinfo=UTC)
TITLE = "links (caps from the definitions; windows in UTC):"


@pytest.fixture
def linked_env(env: Env) -> Env:
    """``env`` (SQLite and PostgreSQL) whose definitions file also has LINKS_YAML's two links."""
    env.config.write_text(LINKS_YAML)
    return env


def link_line(state: LinkState) -> list[str]:
    """The cells of a link's row as the command prints them, split on the two-space column gaps."""
    cap = human_rate(state.cap.bytes_per_second)
    copies = "-" if state.link.max_concurrent_copies is None else str(state.link.max_concurrent_copies)
    return [state.link.pair, cap, state.cap.source, copies, state.next_change_text()]


def rows_after(out: str, title: str) -> list[list[str]]:
    """The rows of the table under ``title`` (up to the next line that is not a row), cells split on gaps."""
    lines = out.splitlines()
    start = lines.index(title) + 2
    rows = []
    for line in lines[start:]:
        if not line.strip() or line.endswith(":"):
            break
        rows.append([c.strip() for c in line.split("  ") if c.strip()])
    return rows


def expected_rows(env: Env, run: Callable[[], str]) -> tuple[str, list[list[str]], list[list[str]]]:
    """``run()``'s output and the rows the links would show at a moment just before and just after it (a window
    edge may pass while it runs)."""
    before = [link_line(s) for s in link_states(env.defs, datetime.now(UTC))]
    out = run()
    after = [link_line(s) for s in link_states(env.defs, datetime.now(UTC))]
    return out, before, after


def test_site_list_shows_each_link(linked_env: Env) -> None:
    def run() -> str:
        code, out, err = cli(linked_env, "site", "list")
        assert code == 0, err
        return out

    out, before, after = expected_rows(linked_env, run)
    assert out.splitlines()[0].startswith("site ")
    header = out.splitlines()[out.splitlines().index(TITLE) + 1]
    assert header.split("  ")[0] == "link" and [c.strip() for c in header.split("  ") if c.strip()] == [
        "link",
        "cap now",
        "in force by",
        "max copies",
        "next change",
    ]
    rows = rows_after(out, TITLE)
    assert rows in (before, after), out
    assert rows[1] == ["dr -> edge", "5.2 MB/s", "default", "-", "-"]


def test_status_shows_the_links_of_the_tables_sites(linked_env: Env) -> None:
    def run(*args: str) -> Callable[[], str]:
        def go() -> str:
            code, out, err = cli(linked_env, "status", *args)
            assert code == 0, err
            return out

        return go

    title = TITLE
    out, before, after = expected_rows(linked_env, run())
    assert rows_after(out, title) in (before, after), out
    out, before, after = expected_rows(linked_env, run("orders"))  # orders: primary and dr only
    assert rows_after(out, title) in (before[:1], after[:1]), out
    assert "dr -> edge" not in out


def test_status_json_has_each_link(linked_env: Env) -> None:
    code, out, err = cli(linked_env, "status", "--json")
    assert code == 0, err
    both, one_way = json.loads(out)["links"]
    assert one_way == {
        "source": "dr",
        "target": "edge",
        "both_ways": False,
        "max_bytes_per_second": 5 * 1024**2,
        "cap_from": "default",
        "max_concurrent_copies": None,
        "next_change": None,
        "next_change_us": None,
        "next_max_bytes_per_second": None,
        "windows": [],
        "default_max_bytes_per_second": 5 * 1024**2,
    }
    assert both["both_ways"] is True and both["max_concurrent_copies"] == 4
    assert both["default_max_bytes_per_second"] == 200_000_000
    assert both["windows"] == [
        {
            "days": ["mon", "tue", "wed", "thu", "fri"],
            "from": "08:00",
            "to": "20:00",
            "max_bytes_per_second": 20_000_000,
        },
        {"days": ["sat", "sun"], "from": "00:00", "to": "24:00", "max_bytes_per_second": None},
    ]
    assert both["next_change"] is not None  # the timetable changes within a week, whenever the test runs
    assert datetime.fromisoformat(both["next_change"]) > datetime.now(UTC)


def test_status_at_a_fixed_moment(linked_env: Env) -> None:
    """Friday noon UTC: the weekday window holds 20 MB/s until 20:00, then the default 200 MB/s."""
    out = status_output(linked_env.catalog, linked_env.defs, None, as_json=False, now=FRIDAY_NOON)
    assert rows_after(out, TITLE) == [
        [
            "primary <-> dr",
            "20.0 MB/s",
            "window weekdays 08:00-20:00",
            "4",
            "Fri 2026-11-27 20:00 UTC to 200.0 MB/s",
        ],
        ["dr -> edge", "5.2 MB/s", "default", "-", "-"],
    ]
    doc = json.loads(status_output(linked_env.catalog, linked_env.defs, None, as_json=True, now=FRIDAY_NOON))
    assert doc["links"][0]["cap_from"] == "window weekdays 08:00-20:00"
    assert doc["links"][0]["max_bytes_per_second"] == 20_000_000
    assert doc["links"][0]["next_change"] == "2026-11-27T20:00:00+00:00"
    assert doc["links"][0]["next_change_us"] == int(datetime(2026, 11, 27, 20, tzinfo=UTC).timestamp()) * 10**6
    assert doc["links"][0]["next_max_bytes_per_second"] == 200_000_000
    saturday = status_output(linked_env.catalog, linked_env.defs, None, as_json=False, now=datetime(2026, 11, 28))
    assert rows_after(saturday, TITLE)[0] == [
        "primary <-> dr",
        "unlimited",
        "window weekends 00:00-24:00",
        "4",
        "Mon 2026-11-30 00:00 UTC to 200.0 MB/s",
    ]


def test_apply_prints_each_link(linked_env: Env) -> None:
    expected = [
        "link    primary <-> dr: 200.0 MB/s outside its windows; weekdays 08:00-20:00 20.0 MB/s; "
        "weekends 00:00-24:00 unlimited; at most 4 concurrent copies",
        "link    dr -> edge: 5.2 MB/s",
    ]
    for args in (["apply", "--dry-run"], ["apply"]):
        code, out, err = cli(linked_env, *args)
        assert code == 0, err
        assert [x for x in out.splitlines() if x.startswith("link ")] == expected, out
        assert "nothing to change" in out


def test_without_links_nothing_is_added(env: Env) -> None:
    assert env.config.read_text() == ORDERS_YAML
    for args in (["site", "list"], ["status"], ["apply", "--dry-run"]):
        code, out, err = cli(env, *args)
        assert code == 0, err
        assert TITLE not in out and not [x for x in out.splitlines() if x.startswith("link ")], out
    code, out, _ = cli(env, "status", "--json")
    assert json.loads(out)["links"] == []
