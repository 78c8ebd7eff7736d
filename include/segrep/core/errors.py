"""Errors a user can act on. The CLI prints them as one line and exits with code 2."""

from __future__ import annotations


class SegrepError(Exception):
    """Bad input or a refused operation; the message names the problem. Nothing was written."""


class ConfigError(SegrepError):
    """The definitions file is malformed or inconsistent."""


class NotFoundError(SegrepError):
    """An unknown site, table, partition or placement."""


class SchemaMismatchError(SegrepError):
    """A batch whose columns or types do not match the table."""


class RefusedError(SegrepError):
    """A change that would lose data or break the chain, refused on purpose."""


class ConflictError(Exception):
    """A concurrent writer moved the chain first; the caller retries. Not a user error."""


class CorruptSegmentError(SegrepError):
    """A segment file whose size or sha256 does not match what the catalog recorded."""


class SplitIncompleteError(SegrepError):
    """SPLIT_FINALIZE refused: some child still lacks segments of the parent up to the pass's cut."""


class WritesPausedError(SegrepError):
    """Writes to a table are paused while its leadership moves (a planned switchover): retry shortly."""


class SiteUnidentifiedError(SegrepError, OSError):
    """A site root that is missing, has no identity marker, or has one naming another site or catalog
    (``storage.identity``). An OSError too: every path that treats an unreachable store as that site's failure
    (and never the whole operation's) treats this one alike; rounds report it as DOWN."""
