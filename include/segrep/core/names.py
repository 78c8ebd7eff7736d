"""The allow-list for every name that becomes part of a path or a catalog key.

Names reach file paths (``<site>/<table>/<partition>/<segment>.parquet``), so they are checked against a
strict pattern before anything is written: no separators, no dots, no traversal.
"""

from __future__ import annotations

import re

from segrep.core.errors import SegrepError

NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,62}")  # always used with fullmatch: no trailing newline
SEGMENT_ID_RE = re.compile(r"[0-9a-f]{32}")


def check_name(kind: str, value: object) -> str:
    """Return ``value`` if it is a valid name of this kind, else raise a SegrepError naming it."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise SegrepError(f"invalid {kind} name {value!r}: use 1-63 characters a-z, 0-9 and _, starting with a letter")
    return value


def check_segment_id(value: object) -> str:
    if not isinstance(value, str) or not SEGMENT_ID_RE.fullmatch(value):
        raise SegrepError(f"invalid segment id {value!r}: expected 32 lowercase hex digits")
    return value
