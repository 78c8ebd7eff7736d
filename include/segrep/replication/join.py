"""Bringing a bootstrapped replica up to date: rounds to that site until it holds everything and has joined.

After ``segrep bootstrap`` a site is JOINING; JOIN_FINALIZE happens in the commit of the first round that
leaves it nothing pending. A few rounds may be needed while writes keep arriving; each is an ordinary round
limited to the joining site.
"""

from __future__ import annotations

from segrep.catalog import Catalog
from segrep.catalog.link_lease import LinkLimits
from segrep.config.definitions import Definitions
from segrep.core.errors import NotFoundError
from segrep.core.links import CopyPriority
from segrep.replication.orchestrator import run_round
from segrep.replication.reports import RoundReport
from segrep.replication.status import TargetState, status_rows
from segrep.spark import launch
from segrep.spark.launch import Submit

CATCH_UP_ROUNDS = 5


def target_state(catalog: Catalog, table: str, site: str) -> TargetState:
    """The replication state of one replica site of a table."""
    state = next((r for r in status_rows(catalog, table) if r.target == site), None)
    if state is None:
        raise NotFoundError(f"site {site!r} holds no replica of {table}")
    return state


def catch_up(
    catalog: Catalog,
    defs: Definitions,
    table: str,
    site: str,
    *,
    submit: Submit = launch.submit,
    max_rounds: int = CATCH_UP_ROUNDS,
    links: LinkLimits | None = None,
) -> list[RoundReport]:
    """Run rounds to ``site`` until it is caught up (nothing pending, joined), at most ``max_rounds``; on a
    capped link (``links``) their copies go at a catch-up's share, a bootstrap's to a replica still joining."""
    reports = []
    for _ in range(max_rounds):
        reports.append(
            run_round(catalog, defs, table, target=site, submit=submit, links=links, priority=CopyPriority.CATCHUP)
        )
        if target_state(catalog, table, site).caught_up:
            break
    return reports
