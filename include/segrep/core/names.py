"""The allow-list for every name that becomes part of a path or a catalog key.

Names reach file paths (``<site>/<table>/<partition>/<segment>.parquet``), so they are checked against a
strict pattern before anything is written: no separators, no dots, no traversal.
"""

from __future__ import annotations

import re

from segrep.core.errors import SegrepError

NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,62}")  # always used with fullmatch: no trailing newline
SEGMENT_ID_RE = re.compile(r"[0-9a-f]{32}")

# The longest path segrep writes under a site's root: a segment file that bootstrap's replace mode moved
# aside, ``.replaced/<microseconds>/<table>/<partition id>/<segment id>.parquet`` (a rollback file's
# ``.rollback/<table>/<partition>/<failover>-<placement>.parquet`` is shorter), with a 63-character table
# name, a 32-bit partition id and 19-digit (64-bit) numbers. An object store's key is the site's prefix, a
# slash and this path, so the prefix must leave it room (config.locations refuses one that does not).
LONGEST_SEGMENT_RELPATH = f"{'t' * 63}/{2**31 - 1}/{'0' * 32}.parquet"
LONGEST_RELPATH = f".replaced/{2**63 - 1}/{LONGEST_SEGMENT_RELPATH}"


def check_name(kind: str, value: object) -> str:
    """Return ``value`` if it is a valid name of this kind, else raise a SegrepError naming it."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise SegrepError(f"invalid {kind} name {value!r}: use 1-63 characters a-z, 0-9 and _, starting with a letter")
    return value


def check_segment_id(value: object) -> str:
    if not isinstance(value, str) or not SEGMENT_ID_RE.fullmatch(value):
        raise SegrepError(f"invalid segment id {value!r}: expected 32 lowercase hex digits")
    return value
