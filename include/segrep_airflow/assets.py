"""Airflow Assets for replicas: ``segrep://<site>/<table>`` is "<table> as held at <site>"; and for writes:
``segrep-writes://<table>/`` is "writes committed to <table>" (:func:`writes_asset`).

The replication DAG's ``commit`` and ``report`` tasks emit an event on it for each target site whose safe time
advanced (through the table's :func:`alias`, because which sites advanced is known only when the task runs),
so a DAG scheduled on ``replica_asset("dr", "orders")`` runs when dr's copy of orders is fresh.

Why this URI works: Airflow 3 accepts any scheme for an Asset; a scheme without a provider's normaliser is
kept as written (no warning, nothing registered). ``airflow`` is the only reserved scheme. The name is the
URI too, so ``Asset.ref(name=...)`` and the UI's asset list show the same string.

The writes asset is what a table with ``schedule: on_write`` has its replication DAG scheduled on
(``segrep_airflow.schedules``). Its URI comes from the package (``segrep.data.write_events.writes_uri``),
which posts its events through the REST API after ``segrep write`` or ``write_batch``; a writer running in an
Airflow task declares the asset as the task's outlet and adds the event itself (:func:`emit_write`). A scheme
of its own, so no site name can make a replica asset equal a writes asset.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from segrep.core import hlc
from segrep.data.write_events import writes_uri

if TYPE_CHECKING:
    from airflow.sdk import Asset, AssetAlias

    from segrep.catalog import Catalog
    from segrep.core.schema_versions import SchemaVersion
    from segrep.data.writer import WriteResult
    from segrep.replication.reports import RoundReport

SCHEME = "segrep"


def asset_uri(site: str, table: str) -> str:
    return f"{SCHEME}://{site}/{table}"


def replica_asset(site: str, table: str) -> Asset:
    """The Asset of ``table`` at ``site`` (what a consumer DAG schedules on)."""
    from airflow.sdk import Asset

    uri = asset_uri(site, table)
    return Asset(name=uri, uri=uri, group=SCHEME)


def writes_asset(table: str) -> Asset:
    """The Asset "writes committed to ``table``" (what an on_write table's replication DAG is scheduled on)."""
    from airflow.sdk import Asset

    uri = writes_uri(table)
    return Asset(name=uri, uri=uri, group=SCHEME)


def emit_write(outlet_events: Any, result: WriteResult) -> dict[str, Any] | None:
    """For a writer running in an Airflow task (``outlets=[writes_asset(table)]``, ``write_batch`` without
    ``defs`` so no REST call is made too): the task's event on the table's writes asset, carrying what the
    REST path would (``segrep.data.writer.write_event_extra``). None when the write committed nothing."""
    from segrep.data.writer import write_event_extra

    if result.committed_us is None:
        return None
    extra = write_event_extra(result)
    outlet_events[writes_asset(result.table)].extra = extra
    return extra


def alias(table: str) -> AssetAlias:
    """The alias the replication tasks of ``table`` emit through (one event per advanced site)."""
    from airflow.sdk import AssetAlias

    return AssetAlias(name=f"segrep_replicas_{table}", group=SCHEME)


def table_schema(catalog: Catalog, table: str) -> SchemaVersion:
    """The table's current schema version: the columns a consumer of its events reads the copies with (older
    segments are projected to it by field id)."""
    from segrep.catalog.queries import table_info

    with catalog.read() as s:
        return table_info(s, table).versions.target


def schema_extra(schema: SchemaVersion) -> dict[str, Any]:
    """``schema_version`` and ``columns`` (each: ``id``, the field id that never changes, ``name``, ``type``,
    and ``default`` where the definitions give one)."""
    return {"schema_version": schema.version, "columns": [c.to_dict() for c in schema.columns]}


def event_extra(report: RoundReport, site: str, schema: SchemaVersion | None = None) -> dict[str, Any]:
    """What a consumer reads from the event: the new safe time (ISO and µs), what the round copied there, and
    (``schema``) the table's current schema version and columns."""
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
        **({} if schema is None else schema_extra(schema)),
    }


def emit(
    outlet_events: Any, report: RoundReport, sites: list[str], schema: SchemaVersion | None = None
) -> list[dict[str, Any]]:
    """Add one event per site in ``sites`` to the running task's ``outlet_events`` (its alias outlet), each
    with the table's current ``schema`` (:func:`table_schema`)."""
    extras = []
    accessor = outlet_events[alias(report.table)]
    for site in sites:
        if site not in report.safe_time_us:
            continue
        extra = event_extra(report, site, schema)
        accessor.add(replica_asset(site, report.table), extra=extra)
        extras.append(extra)
    return extras
