"""Numbers for people, as every report of a round prints them: sizes in powers of 1000 (as S3 and most
dashboards show them), durations in the two largest units, times as ISO or a dash when there is none."""

from __future__ import annotations

from segrep.core import hlc


def human_bytes(n: int) -> str:
    """4.7 MB, 512 B."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def human_seconds(s: float) -> str:
    """0.8 s, 42 s, 15 min 3 s, 2 h 5 min, 3 d 4 h."""
    if s < 10:
        return f"{s:.1f} s"
    whole = round(s)
    if whole < 60:
        return f"{whole} s"
    for size, unit, sub_size, sub_unit in ((86400, "d", 3600, "h"), (3600, "h", 60, "min"), (60, "min", 1, "s")):
        if whole >= size:
            rest = (whole % size) // sub_size
            return f"{whole // size} {unit}" + (f" {rest} {sub_unit}" if rest else "")
    raise AssertionError("unreachable")


def iso_or_dash(us: int | None) -> str:
    return "-" if us is None else hlc.iso(us)
