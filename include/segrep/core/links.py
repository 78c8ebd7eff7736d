"""What crosses a link between two sites, and how much of a short budget each kind gets (DESIGN section 17).

When a link's cap is short, its holders share it by weight: a round (what the RPO depends on) weighs 8, a
failback or catch-up 4, a bootstrap 2, a repair, scrub or verify 1. Weights rather than strict priority: with
strict priority, rounds that always have something to copy would hold a bootstrap at zero for ever; with
weights each class has a floor (a bootstrap alone beside a round still gets 2/10 of the cap) while the round
takes most of it, and a class alone on the link takes all of it.
"""

from __future__ import annotations

from enum import StrEnum


class CopyPriority(StrEnum):
    """Why bytes cross a link; the catalog stores it as a string (``link_slots.what``)."""

    ROUND = "round"
    FAILBACK = "failback"
    CATCHUP = "catchup"
    BOOTSTRAP = "bootstrap"
    REPAIR = "repair"
    SCRUB = "scrub"
    VERIFY = "verify"
    REQUESTS = "requests"  # not bytes: a process's share of a site's request rate (``catalog.request_slots``)

    @property
    def weight(self) -> int:
        """Its share of a short cap relative to the others' (the module docstring says why weights)."""
        return _WEIGHTS[self]


_WEIGHTS = {
    CopyPriority.ROUND: 8,
    CopyPriority.FAILBACK: 4,
    CopyPriority.CATCHUP: 4,
    CopyPriority.BOOTSTRAP: 2,
    CopyPriority.REPAIR: 1,
    CopyPriority.SCRUB: 1,
    CopyPriority.VERIFY: 1,
    CopyPriority.REQUESTS: 1,  # alone on its pseudo-link: every holder gets the same share
}
