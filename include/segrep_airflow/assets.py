"""Airflow Assets for replicas: ``segrep://<site>/<table>`` is "<table> as held at <site>".

The replication DAG's ``commit`` and ``report`` tasks emit an event on it for each target site whose safe time
advanced (through the table's :func:`alias`, because which sites advanced is known only when the task runs),
so a DAG scheduled on ``replica_asset("dr", "orders")`` runs when dr's copy of orders is fresh.

Why this URI works: Airflow 3 accepts any scheme for an Asset; a scheme without a provider's normaliser is
kept as written (no warning, nothing registered). ``airflow`` is the only reserved scheme. The name is the
URI too, so ``Asset.ref(name=...)`` and the UI's asset list show the same string.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from segrep.core import hlc

if TYPE_CHECKING:
    from airflow.sdk import Asset, AssetAlias

    from segrep.replication.reports import RoundReport

SCHEME = "segrep"


def asset_uri(site: str, table: str) -> str:
    return f"{SCHEME}://{site}/{table}"


def replica_asset(site: str, table: str) -> Asset:
    """The Asset of ``table`` at ``site`` (what a consumer DAG schedules on)."""
    from airflow.sdk import Asset

    uri = asset_uri(site, table)
    return Asset(name=uri, uri=uri, group=SCHEME)


def alias(table: str) -> AssetAlias:
    """The alias the replication tasks of ``table`` emit through (one event per advanced site)."""
    from airflow.sdk import AssetAlias

    return AssetAlias(name=f"segrep_replicas_{table}", group=SCHEME)


def event_extra(report: RoundReport, site: str) -> dict[str, Any]:
    """What a consumer reads from the event: the new safe time (ISO and µs), what the round copied there."""
    target = report.targets.get(site)
    safe_us = report.safe_time_us[site]
    return {
        "table": report.table,
        "site": site,
        "safe_time": hlc.iso(safe_us),
        "safe_time_us": safe_us,
        "segments_copied": target.segments_copied if target else 0,
        "bytes_copied": target.bytes_copied if target else 0,
        "round_id": report.round_id,
        "round_end": hlc.iso(report.end_us),
    }


def emit(outlet_events: Any, report: RoundReport, sites: list[str]) -> list[dict[str, Any]]:
    """Add one event per site in ``sites`` to the running task's ``outlet_events`` (its alias outlet)."""
    extras = []
    accessor = outlet_events[alias(report.table)]
    for site in sites:
        if site not in report.safe_time_us:
            continue
        extra = event_extra(report, site)
        accessor.add(replica_asset(site, report.table), extra=extra)
        extras.append(extra)
    return extras
