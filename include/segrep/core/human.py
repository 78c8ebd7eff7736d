"""Numbers for people, as every report of a round prints them: sizes in powers of 1000 (as S3 and most
dashboards show them), durations in the two largest units, times as ISO or a dash when there is none; and
sizes as people write them (``20MB``, ``200 MiB``), read back into bytes."""

from __future__ import annotations

import re
from decimal import Decimal

from segrep.core import hlc
from segrep.core.errors import SegrepError

# Decimal units as human_bytes prints them (kB and KB alike), binary ones as IEC names them. Case matters:
# "Mb" is megabits to a network engineer, and a rate off by a factor of 8 must be refused, not guessed.
SIZE_UNITS = {
    "B": 1,
    "kB": 1000,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
}
_SIZE_RE = re.compile(r"(\d{1,15}(?:\.\d{1,9})?)\s*([A-Za-z]*)")


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


def human_rate(bytes_per_second: int | None) -> str:
    """20.0 MB/s; ``unlimited`` for None (no cap)."""
    return "unlimited" if bytes_per_second is None else f"{human_bytes(bytes_per_second)}/s"


def parse_bytes(text: str) -> int:
    """Whole bytes from ``512``, ``20MB``, ``200 MiB`` or ``1.5 GB`` (a fraction of a byte is dropped); SegrepError
    quoting ``text`` otherwise."""
    m = _SIZE_RE.fullmatch(text.strip())
    unit = (m.group(2) or "B") if m else ""
    if m is None or unit not in SIZE_UNITS:
        raise SegrepError(
            f"{text!r} is not a size: write a number of bytes or a number and a unit, as in 20MB or 200 MiB "
            f"(units {', '.join(SIZE_UNITS)}; a lowercase b would be bits)"
        )
    return int(Decimal(m.group(1)) * SIZE_UNITS[unit])
