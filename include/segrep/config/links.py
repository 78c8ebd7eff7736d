"""Links between sites (DESIGN section 17): the byte-rate cap, its time windows and the copy concurrency that
every copier crossing a pair of sites shares.

A ``links:`` entry names a pair both ways (``between: [a, b]``) or one direction (``from: a``, ``to: b``), its
``max_bytes_per_second`` (bytes, a size such as ``20MB`` or ``200 MiB``, or ``unlimited``) and optionally
``max_concurrent_copies`` and ``windows``: a weekly timetable in UTC, like rclone's ``--bwlimit`` one. A window
is ``{days, from, to, max_bytes_per_second}``; ``days`` (the days it starts on: ``mon`` .. ``sun``,
``weekdays``, ``weekends``, ``daily``; default every day) and times ``"HH:MM"`` (``to`` may be ``"24:00"``). A window
whose ``to`` comes before its ``from`` runs past midnight into the next day (``fri 20:00-08:00`` ends on
Saturday at 08:00). Outside every window the entry's own ``max_bytes_per_second`` holds. Windows of one link
may not overlap, across midnight included, so a moment has exactly one cap; two entries for the same
direction are refused for the same reason.

This module reads and answers questions about the definitions; the budget and the leases that enforce them
across copiers live with the copiers. Links are not stored in the catalog: each copier reads them from the
definitions file, as the DAGs read the policies.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from segrep.config.entries import expect_mapping, no_unknown_keys
from segrep.core.errors import SegrepError
from segrep.core.human import human_rate, parse_bytes

__all__ = ["CapInForce", "LinkDef", "LinkState", "Window", "parse_links", "pool_name"]

DAY_S = 86400
WEEK_S = 7 * DAY_S
MAX_BYTES_PER_SECOND = 2**40  # about 1.1 TB/s: more is a typo, not a WAN
MAX_CONCURRENT_COPIES = 10_000
UNLIMITED = "unlimited"
DAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")  # datetime.weekday() order
_FULL_DAY_NAMES = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
WEEKDAYS = frozenset(range(5))
WEEKENDS = frozenset({5, 6})
EVERY_DAY = frozenset(range(7))
_DAY_GROUPS = {"weekdays": WEEKDAYS, "weekends": WEEKENDS, "daily": EVERY_DAY}
_TIME_RE = re.compile(r"(\d{1,2}):(\d{2})")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LINK_KEYS = {"between", "from", "to", "max_bytes_per_second", "max_concurrent_copies", "windows"}
_WINDOW_KEYS = {"days", "from", "to", "max_bytes_per_second"}
POOL_PREFIX = "segrep_link_"


def pool_name(source: str, target: str) -> str:
    """The Airflow pool of copy tasks from ``source`` to ``target`` (``segrep_link_primary_dr``); named here
    so that ``parse_links`` can refuse two directions whose names would be the same pool."""
    return f"{POOL_PREFIX}{source}_{target}"


@dataclass(frozen=True)
class Window:
    """A weekly time window in UTC with its own cap: it starts on each of ``days`` at ``start_s`` and ends at
    ``end_s`` the same day, or the next day when ``end_s <= start_s`` (it runs past midnight)."""

    days: frozenset[int]  # 0 = Monday .. 6 = Sunday
    start_s: int  # seconds after midnight, 0 .. 86399
    end_s: int  # 1 .. 86400 (24:00)
    max_bytes_per_second: int | None  # None: unlimited

    @property
    def spans(self) -> tuple[tuple[int, int], ...]:
        """The window as ``[start, end)`` seconds of the week from Monday 00:00; a span past Sunday midnight
        is split in two (its tail starts the week)."""
        out: list[tuple[int, int]] = []
        for day in sorted(self.days):
            start = day * DAY_S + self.start_s
            end = day * DAY_S + self.end_s + (DAY_S if self.end_s <= self.start_s else 0)
            if end > WEEK_S:
                out += [(start, WEEK_S), (0, end - WEEK_S)]
            else:
                out.append((start, end))
        return tuple(sorted(out))

    def describe(self) -> str:
        """``weekdays 08:00-20:00``, ``sat,sun 00:00-24:00``, ``every day 20:00-08:00``."""
        return f"{_days_text(self.days)} {_clock(self.start_s)}-{_clock(self.end_s)}"


@dataclass(frozen=True)
class CapInForce:
    """The cap on a link at a moment and where it comes from: a window, or the entry's own default."""

    bytes_per_second: int | None  # None: unlimited
    window: Window | None = None

    @property
    def source(self) -> str:
        return "default" if self.window is None else f"window {self.window.describe()}"


@dataclass(frozen=True)
class LinkState:
    """A link as seen at ``at``: the cap in force, and when it changes next and to what (status, site list)."""

    link: LinkDef
    at: datetime
    cap: CapInForce
    next_change: datetime | None
    next_cap: int | None

    def next_change_text(self) -> str:
        """``Mon 2026-11-30 20:00 UTC to 200.0 MB/s``, or ``-`` when the cap never changes."""
        if self.next_change is None:
            return "-"
        return f"{self.next_change.strftime('%a %Y-%m-%d %H:%M')} UTC to {human_rate(self.next_cap)}"

    def to_dict(self) -> dict[str, object]:
        return {
            "source": self.link.source,
            "target": self.link.target,
            "both_ways": self.link.both_ways,
            "max_bytes_per_second": self.cap.bytes_per_second,
            "cap_from": self.cap.source,
            "max_concurrent_copies": self.link.max_concurrent_copies,
            "next_change": None if self.next_change is None else self.next_change.isoformat(),
            "next_change_us": None if self.next_change is None else _epoch_us(self.next_change),
            "next_max_bytes_per_second": self.next_cap,
            "windows": [
                {
                    "days": [DAY_NAMES[d] for d in sorted(w.days)],
                    "from": _clock(w.start_s),
                    "to": _clock(w.end_s),
                    "max_bytes_per_second": w.max_bytes_per_second,
                }
                for w in self.link.windows
            ],
            "default_max_bytes_per_second": self.link.max_bytes_per_second,
        }


@dataclass(frozen=True)
class LinkDef:
    """One ``links:`` entry: ``source`` to ``target`` (and back when ``both_ways``)."""

    source: str
    target: str
    both_ways: bool
    max_bytes_per_second: int | None  # outside every window; None: unlimited
    windows: tuple[Window, ...] = ()
    max_concurrent_copies: int | None = None  # None: no limit

    @property
    def pair(self) -> str:
        return f"{self.source} {'<->' if self.both_ways else '->'} {self.target}"

    @property
    def directions(self) -> tuple[tuple[str, str], ...]:
        forward = (self.source, self.target)
        return (forward, (self.target, self.source)) if self.both_ways else (forward,)

    def summary(self) -> str:
        """The whole entry on one line, as ``segrep apply`` confirms it: ``a <-> b: 200.0 MB/s outside its
        windows; weekdays 08:00-20:00 20.0 MB/s; at most 4 concurrent copies``."""
        parts = [f"{human_rate(self.max_bytes_per_second)}{' outside its windows' if self.windows else ''}"]
        parts += [f"{w.describe()} {human_rate(w.max_bytes_per_second)}" for w in self.windows]
        if self.max_concurrent_copies is not None:
            parts.append(f"at most {self.max_concurrent_copies} concurrent copies")
        return f"{self.pair}: {'; '.join(parts)}"

    def applies_to(self, source: str, target: str) -> bool:
        """Whether copies from ``source`` to ``target`` cross this link."""
        return (source, target) in self.directions

    def in_force(self, when: datetime) -> CapInForce:
        """The cap at ``when`` (a naive time is UTC) and the window it comes from, if any."""
        at = _week_us(when)
        for window in self.windows:
            if any(a * 1_000_000 <= at < b * 1_000_000 for a, b in window.spans):
                return CapInForce(window.max_bytes_per_second, window)
        return CapInForce(self.max_bytes_per_second)

    def cap_at(self, when: datetime) -> int | None:
        """Bytes per second allowed at ``when``; None: unlimited."""
        return self.in_force(when).bytes_per_second

    def next_change_after(self, when: datetime) -> datetime | None:
        """The first moment after ``when`` at which the cap changes (UTC), so a copier knows when to read it
        again; None when it never changes (no windows, or all at the default's rate)."""
        now = self.cap_at(when)
        at = _utc(when)
        week_start = (at - timedelta(days=at.weekday())).replace(hour=0, minute=0, second=0, microsecond=0)
        edges = sorted({edge for w in self.windows for span in w.spans for edge in span})
        for week in range(2):  # the timetable repeats weekly: a change comes within a week or never
            for edge in edges:
                t = week_start + timedelta(seconds=week * WEEK_S + edge)
                if t > at and self.cap_at(t) != now:
                    return t
        return None

    def state_at(self, when: datetime) -> LinkState:
        change = self.next_change_after(when)
        return LinkState(
            link=self,
            at=_utc(when),
            cap=self.in_force(when),
            next_change=change,
            next_cap=None if change is None else self.cap_at(change),
        )


def parse_links(raw: Any, sites: Collection[str]) -> tuple[LinkDef, ...]:
    """The ``links:`` list of the definitions file; SegrepError naming the entry (``links[i] (a -> b)``) and
    the problem: unknown sites, a site linked to itself, rates that are not positive, malformed or empty or
    overlapping windows, unknown keys, or two entries for one direction."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise SegrepError("links: expected a list of entries (between: [a, b], or from: a and to: b)")
    links: list[LinkDef] = []
    owner: dict[tuple[str, str], str] = {}
    pools: dict[str, tuple[str, str]] = {}
    for i, entry in enumerate(raw):
        link = _parse_link(entry, f"links[{i}]", sites)
        where = f"links[{i}] ({link.pair})"
        for direction in link.directions:
            if direction in owner:
                raise SegrepError(
                    f"{where}: the direction {direction[0]} -> {direction[1]} already has a link, {owner[direction]}; "
                    "give each direction one entry"
                )
            owner[direction] = where
            pool = pool_name(*direction)
            if pool in pools:  # site names may hold '_': a_b -> c and a -> b_c would share one Airflow pool
                other = pools[pool]
                raise SegrepError(
                    f"{where}: the directions {other[0]} -> {other[1]} and {direction[0]} -> {direction[1]} would "
                    f"share the Airflow pool {pool}; rename one of these sites"
                )
            pools[pool] = direction
        links.append(link)
    return tuple(links)


def _parse_link(raw: Any, where: str, sites: Collection[str]) -> LinkDef:
    body = expect_mapping(raw, where)
    pair = body.get("between")
    if isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair):
        where = f"{where} ({pair[0]} <-> {pair[1]})"  # named as early as it can be, for every message after
    elif "between" not in body and isinstance(body.get("from"), str) and isinstance(body.get("to"), str):
        where = f"{where} ({body['from']} -> {body['to']})"
    no_unknown_keys(body, _LINK_KEYS, where)
    source, target, both_ways = _ends(body, where, sites)
    if "max_bytes_per_second" not in body:
        raise SegrepError(f"{where}: give max_bytes_per_second (a rate such as 20MB, or {UNLIMITED})")
    default = _rate(body["max_bytes_per_second"], f"{where} max_bytes_per_second")
    copies = body.get("max_concurrent_copies")
    if copies is not None and (
        isinstance(copies, bool) or not isinstance(copies, int) or not 1 <= copies <= MAX_CONCURRENT_COPIES
    ):
        raise SegrepError(
            f"{where} max_concurrent_copies: expected a whole number from 1 to {MAX_CONCURRENT_COPIES}; got {copies!r}"
        )
    raw_windows = body.get("windows")
    if raw_windows is not None and not isinstance(raw_windows, list):
        raise SegrepError(f"{where} windows: expected a list of windows (days, from, to, max_bytes_per_second)")
    windows = tuple(_window(w, f"{where} windows[{j}]") for j, w in enumerate(raw_windows or []))
    _refuse_overlaps(windows, where)
    return LinkDef(source, target, both_ways, default, windows, copies)


def _ends(body: Mapping[str, Any], where: str, sites: Collection[str]) -> tuple[str, str, bool]:
    """The entry's sites: ``between: [a, b]`` (both ways) or ``from: a`` and ``to: b`` (one way)."""
    if "between" in body:
        if "from" in body or "to" in body:
            raise SegrepError(f"{where}: give either 'between' (both ways) or 'from' and 'to' (one way), not both")
        pair = body["between"]
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(x, str) for x in pair):
            raise SegrepError(f"{where}: 'between' must be a list of two site names; got {pair!r}")
        ends: tuple[str, str, bool] = (pair[0], pair[1], True)
    elif "from" in body and "to" in body:
        source, target = body["from"], body["to"]
        if not isinstance(source, str) or not isinstance(target, str):
            raise SegrepError(f"{where}: 'from' and 'to' must be site names; got {source!r} and {target!r}")
        ends = (source, target, False)
    else:
        raise SegrepError(f"{where}: give 'between: [a, b]' (both ways) or 'from: a' and 'to: b' (one way)")
    for name in ends[:2]:
        if name not in sites:
            raise SegrepError(f"{where}: {name!r} is not a defined site; defined: {', '.join(sorted(sites))}")
    if ends[0] == ends[1]:
        raise SegrepError(f"{where}: links site {ends[0]} to itself; a link joins two different sites")
    return ends


def _window(raw: Any, where: str) -> Window:
    body = expect_mapping(raw, where)
    no_unknown_keys(body, _WINDOW_KEYS, where)
    for key in ("from", "to", "max_bytes_per_second"):
        if key not in body:
            raise SegrepError(f"{where}: give {key!r}")
    start = _time(body["from"], f"{where} from", end=False)
    end = _time(body["to"], f"{where} to", end=True)
    if start == end:
        raise SegrepError(
            f"{where}: from and to are both {_clock(start)}: an empty window (a whole day is from 00:00 to 24:00)"
        )
    days = _days(body.get("days"), f"{where} days")
    return Window(days, start, end, _rate(body["max_bytes_per_second"], f"{where} max_bytes_per_second"))


def _rate(value: Any, where: str) -> int | None:
    """Bytes per second from a whole number, a size such as ``20MB`` or ``200 MiB`` (``/s`` may follow), or
    None for ``unlimited``; at least one byte per second (a zero cap would stall every copy: stop the table's
    DAGs instead)."""
    if isinstance(value, str) and value.strip().lower() == UNLIMITED:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        rate = value
    elif isinstance(value, str):
        text = value.strip()
        try:
            rate = parse_bytes(text.removesuffix("/s"))
        except SegrepError as exc:
            raise SegrepError(f"{where}: {exc}, or {UNLIMITED}") from None
    else:
        raise SegrepError(f"{where}: expected bytes per second (a number, or a size such as 20MB), or {UNLIMITED}")
    if not 1 <= rate <= MAX_BYTES_PER_SECOND:
        raise SegrepError(
            f"{where}: {value!r} is out of range: a rate must be at least 1 byte per second and at most "
            f"{MAX_BYTES_PER_SECOND} (write {UNLIMITED} for no cap)"
        )
    return rate


def _time(value: Any, where: str, *, end: bool) -> int:
    """Seconds after midnight from ``"HH:MM"`` (``"24:00"`` only as an end)."""
    if isinstance(value, int) and not isinstance(value, bool):
        raise SegrepError(
            f'{where}: expected a time in quotes such as "08:00"; got {value!r} (YAML reads an unquoted 20:00 '
            "as the number 1200)"
        )
    m = _TIME_RE.fullmatch(value.strip()) if isinstance(value, str) else None
    hours, minutes = (int(m.group(1)), int(m.group(2))) if m else (-1, -1)
    if not (0 <= hours <= 23 and 0 <= minutes <= 59) and not (end and (hours, minutes) == (24, 0)):
        latest = "24:00" if end else "23:59"
        raise SegrepError(f'{where}: expected a time "HH:MM" from 00:00 to {latest} (UTC); got {value!r}')
    return hours * 3600 + minutes * 60


def _days(value: Any, where: str) -> frozenset[int]:
    """The days a window starts on: a name (``mon``, ``monday``), ``weekdays``, ``weekends`` or ``daily``, or
    a list of them; every day when absent."""
    if value is None:
        return EVERY_DAY
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names:
        raise SegrepError(f"{where}: expected a day, weekdays or weekends, or a list of days; got {value!r}")
    days: set[int] = set()
    for name in names:
        key = name.strip().lower() if isinstance(name, str) else None
        if key in _DAY_GROUPS:
            days |= _DAY_GROUPS[key]
        elif key in DAY_NAMES or key in _FULL_DAY_NAMES:
            days.add(DAY_NAMES.index(key) if key in DAY_NAMES else _FULL_DAY_NAMES.index(key))
        else:
            raise SegrepError(
                f"{where}: {name!r} is not a day: use {', '.join(DAY_NAMES)}, weekdays, weekends or daily"
            )
    return frozenset(days)


def _refuse_overlaps(windows: tuple[Window, ...], where: str) -> None:
    """Two windows of a link may not share a moment: which cap would hold there would be a guess."""
    for i, first in enumerate(windows):
        for j in range(i + 1, len(windows)):
            second = windows[j]
            for a1, b1 in first.spans:
                for a2, b2 in second.spans:
                    if a1 < b2 and a2 < b1:
                        at = max(a1, a2)
                        raise SegrepError(
                            f"{where}: windows[{i}] ({first.describe()}) and windows[{j}] ({second.describe()}) "
                            f"overlap from {DAY_NAMES[at // DAY_S]} {_clock(at % DAY_S)}; a moment may be in one "
                            "window only"
                        )


def _days_text(days: frozenset[int]) -> str:
    for name, group in (("every day", EVERY_DAY), ("weekdays", WEEKDAYS), ("weekends", WEEKENDS)):
        if days == group:
            return name
    return ",".join(DAY_NAMES[d] for d in sorted(days))


def _clock(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}"


def _utc(when: datetime) -> datetime:
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _epoch_us(when: datetime) -> int:
    """Microseconds since the epoch, as the catalog and ``status --json`` give times."""
    return (_utc(when) - _EPOCH) // timedelta(microseconds=1)


def _week_us(when: datetime) -> int:
    """Microseconds since the Monday 00:00 UTC before ``when``."""
    at = _utc(when)
    seconds = at.weekday() * DAY_S + at.hour * 3600 + at.minute * 60 + at.second
    return seconds * 1_000_000 + at.microsecond
