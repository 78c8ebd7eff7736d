"""The definitions' ``links:`` as the limits a copier's link slots are held to (DESIGN section 17).

``config.links`` says what each link allows at a given time (its windows); a ``LinkLease`` asks again at every
beat, so a window that begins or ends reaches copies already holding a slot within two beats, and a copier
without one asks at its next file. A pair of sites with no link entry gets None: no slot is taken and its
copies are not paced.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime

from segrep.catalog.link_lease import LinkLimits
from segrep.catalog.link_slots import Limits
from segrep.config.definitions import Definitions


def _utc_now() -> datetime:
    return datetime.now(UTC)


def definitions_limits(defs: Definitions, clock: Callable[[], datetime] = _utc_now) -> LinkLimits:
    """The limits of each direction now, from ``defs``' link entries (None where none applies)."""

    def limits(source: str, target: str) -> Limits | None:
        link = defs.link(source, target)
        if link is None:
            return None
        return Limits(cap_bytes_per_s=link.cap_at(clock()), max_concurrent=link.max_concurrent_copies)

    return limits


def limits_or_definitions(links: LinkLimits | None, defs: Definitions) -> LinkLimits:
    """``links`` when a caller gave some (tests, benches), else the definitions' own."""
    return links if links is not None else definitions_limits(defs)


# The site a process runs at (a verify's scrub reads other sites' files across the links to it)
READER_SITE_ENV = "SEGREP_READER_SITE"


def reader_site(defs: Definitions, explicit: str | None = None) -> str | None:
    """The site this process reads from: ``explicit``, else ``$SEGREP_READER_SITE``, else None (unknown: its
    reads take no link slot). An unknown site name is a SegrepError naming it."""
    name = explicit or os.environ.get(READER_SITE_ENV, "").strip() or None
    if name is not None:
        defs.site(name)
    return name
