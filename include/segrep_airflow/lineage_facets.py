"""segrep's runs as OpenLineage: which copies of a table a run read and wrote, and what it did to them.

A copy of a table is the dataset ``segrep://<site>/<table>`` (namespace ``segrep://<site>``, name ``<table>``),
the same string as its Airflow asset (``assets.asset_uri``), so a lineage UI and Airflow's asset list name it
alike. The facets say what the run did, in the units segrep reports:

- ``segrepCopy`` (an output's facet): what a round copied to that copy, and its new safe time; with the
  standard ``outputStatistics`` (bytes, files);
- ``segrepRounds``, ``segrepFailover``, ``segrepBootstrap``, ``segrepSplit`` (run facets): the rounds, the
  leader move and its loss (the RPO of a failover, exact), the bootstrap's decisions, the split pass;
- on every copy a round, a bootstrap, a failover or a split pass read and wrote (dataset facets): the table's
  current columns as the standard ``schema`` facet (name, type) and ``segrepSchema``: the version number and
  each column's field id.

Imported only when OpenLineage is configured (``segrep_airflow.lineage`` checks first): the client and the
provider's classes are not loaded by a task that sends nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import attrs
from airflow.providers.openlineage.extractors import OperatorLineage
from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.facet_v2 import (
    DatasetFacet,
    OutputDatasetFacet,
    RunFacet,
    output_statistics_output_dataset,
    schema_dataset,
)

from segrep.core import hlc
from segrep_airflow.assets import SCHEME

if TYPE_CHECKING:
    from segrep.core.schema_versions import SchemaVersion
    from segrep.failover.promote import FailoverReport
    from segrep.maintenance.bootstrap import BootstrapReport
    from segrep.replication.reports import RoundReport
    from segrep.spark.manifest import Manifest
    from segrep.spark.results import CommitSummary

Lineage: TypeAlias = "OperatorLineage[Any, Any]"  # the provider's record of a task's datasets and facets
# Custom facets name their schema by URI; nothing fetches it (docs/airflow.md, "Lineage", lists the fields).
SCHEMA = "urn:segrep:openlineage:facets:1#/$defs/"


@attrs.define
class SegrepCopyFacet(OutputDatasetFacet):
    """What the run's rounds did to one copy: bytes and segment files copied there (``bytesFrom``: per site
    they came from), its safe time after them (every row the leader committed before it is readable there),
    its status in the last round, the rounds."""

    bytesCopied: int = 0
    segmentsCopied: int = 0
    bytesFrom: dict[str, int] = attrs.field(factory=dict)
    safeTimeUs: int | None = None
    safeTime: str | None = None
    status: str = ""
    roundIds: list[int] = attrs.field(factory=list)

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA + "SegrepCopyFacet"


@attrs.define
class SegrepSchemaFacet(DatasetFacet):
    """The table's schema version the copy is read at (older segments are projected to it by field id), and
    each column's field id (kept across renames; the standard ``schema`` facet has no place for it)."""

    version: int = 1
    fieldIds: dict[str, int] = attrs.field(factory=dict)

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA + "SegrepSchemaFacet"


def schema_facets(schema: SchemaVersion | None) -> dict[str, DatasetFacet]:
    """A copy's dataset facets for the table's current schema: the standard ``schema`` and ``segrepSchema``."""
    if schema is None:
        return {}
    fields = [schema_dataset.SchemaDatasetFacetFields(name=c.name, type=c.type) for c in schema.columns]
    return {
        "schema": schema_dataset.SchemaDatasetFacet(fields=fields),
        "segrepSchema": SegrepSchemaFacet(
            version=schema.version, fieldIds={c.name: c.field_id for c in schema.columns}
        ),
    }


@attrs.define
class SegrepRoundsFacet(RunFacet):
    """The rounds the run ran: per round its table, id, end (µs and ISO), status, Spark applications."""

    rounds: list[dict[str, Any]] = attrs.field(factory=list)

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA + "SegrepRoundsFacet"


@attrs.define
class SegrepFailoverFacet(RunFacet):
    """A leader move (or, ``dryRun``, its assessment): what it gives up, in total and per table (``tables``:
    from and to which site, why, partitions moved, segments, rows and bytes lost, their version range)."""

    kind: str = ""
    dryRun: bool = True
    cut: str = ""
    toSite: str = ""
    lostSegments: int = 0
    lostRows: int = 0
    lostBytes: int = 0
    tables: list[dict[str, Any]] = attrs.field(factory=list)
    cutUs: int | None = None

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA + "SegrepFailoverFacet"


@attrs.define
class SegrepBootstrapFacet(RunFacet):
    """A bootstrap's decision tree at a site: the mode, what it did, the placements now fed by rounds."""

    table: str = ""
    site: str = ""
    mode: str = ""
    actions: list[str] = attrs.field(factory=list)
    joiningPlacements: list[int] = attrs.field(factory=list)

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA + "SegrepBootstrapFacet"


@attrs.define
class SegrepSplitFacet(RunFacet):
    """One pass of a split (copy or unload): what it planned, what its merge job's results committed, the bytes
    it read per site."""

    splitId: int = 0
    table: str = ""
    phase: str = ""
    rewrites: int = 0
    merges: int = 0
    itemsCommitted: int = 0
    rowsIn: int = 0
    rowsMerged: int = 0
    bytesRead: dict[str, int] = attrs.field(factory=dict)

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA + "SegrepSplitFacet"


def namespace(site: str) -> str:
    return f"{SCHEME}://{site}"


def read(sites: Iterable[str], table: str, schema: SchemaVersion | None = None) -> list[InputDataset]:
    return [
        InputDataset(namespace=namespace(site), name=table, facets=schema_facets(schema)) for site in sorted(set(sites))
    ]


def written(
    site: str,
    table: str,
    facets: Mapping[str, OutputDatasetFacet] | None = None,
    schema: SchemaVersion | None = None,
) -> OutputDataset:
    return OutputDataset(
        namespace=namespace(site), name=table, outputFacets=dict(facets or {}), facets=schema_facets(schema)
    )


def merged(earlier: Lineage, later: Lineage) -> Lineage:
    """Both records of one task (a task that ran several steps, e.g. a round per table): a dataset named twice
    is kept once, as the later record has it; the rounds of both are listed; other run facets: the later's."""

    def union(a: list[Any], b: list[Any]) -> list[Any]:
        keep = {(d.namespace, d.name): d for d in [*a, *b]}
        return list(keep.values())

    facets = {**earlier.run_facets, **later.run_facets}
    before, after = earlier.run_facets.get("segrepRounds"), later.run_facets.get("segrepRounds")
    if before is not None and after is not None:
        facets["segrepRounds"] = SegrepRoundsFacet(rounds=[*before.rounds, *after.rounds])
    return OperatorLineage(
        inputs=union(earlier.inputs, later.inputs),
        outputs=union(earlier.outputs, later.outputs),
        run_facets=facets,
    )


def rounds_lineage(
    reports: Sequence[RoundReport],
    leaders: Mapping[str, Collection[str]],
    schemas: Mapping[str, SchemaVersion] | None = None,
) -> Lineage:
    """Rounds (one, or a catch-up's several, or one per table): each table's copies at its ``leaders`` (and at
    any other site a copy came from: a feeder in a cascade) read, every target's copy written with what the
    rounds copied there, summed, and its last safe time; every copy with its table's current schema
    (``schemas``, by table)."""
    known = schemas or {}
    copies: dict[tuple[str, str], SegrepCopyFacet] = {}
    sources: dict[str, set[str]] = {r.table: set(leaders.get(r.table, ())) for r in reports}
    for r in reports:
        for site, target in sorted(r.targets.items()):
            copy = copies.setdefault((r.table, site), SegrepCopyFacet())
            copy.bytesCopied += target.bytes_copied
            copy.segmentsCopied += target.segments_copied
            for source, n in target.bytes_from.items():
                copy.bytesFrom[source] = copy.bytesFrom.get(source, 0) + n
                sources[r.table].add(source)
            if site in r.safe_time_us:
                copy.safeTimeUs = r.safe_time_us[site]
                copy.safeTime = hlc.iso(copy.safeTimeUs)
            copy.status = str(target.status)
            copy.roundIds.append(r.round_id)
    outputs = []
    for (table, site), copy in copies.items():
        stats = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
            size=copy.bytesCopied, fileCount=copy.segmentsCopied
        )
        outputs.append(written(site, table, {"segrepCopy": copy, "outputStatistics": stats}, known.get(table)))
    rounds = [
        {
            "table": r.table,
            "roundId": r.round_id,
            "endUs": r.end_us,
            "end": hlc.iso(r.end_us),
            "status": str(r.status),
            "sparkApps": r.spark_apps,
        }
        for r in reports
    ]
    return OperatorLineage(
        inputs=[d for table, sites in sorted(sources.items()) for d in read(sites, table, known.get(table))],
        outputs=outputs,
        run_facets={"segrepRounds": SegrepRoundsFacet(rounds=rounds)},
    )


def failover_lineage(report: FailoverReport, schemas: Mapping[str, SchemaVersion] | None = None) -> Lineage:
    """A leader move: each table's old leader's copy read; its new leader's copy written (none in a dry run,
    which moves nothing), each with its table's current schema (``schemas``, by table); the loss as the run's
    ``segrepFailover`` facet."""
    known = schemas or {}
    tables: list[dict[str, Any]] = []
    for move in report.moves:
        a = move.assessment
        total = a.total_loss()
        tables.append(
            {
                "table": a.table,
                "fromSite": a.from_site,
                "toSite": a.to_site,
                "reason": a.reason,
                "partitionsMoved": move.partitions_moved,
                "failoverId": move.failover_id,
                "onReturn": move.on_return,
                "lostSegments": a.segments_lost,
                "lostRows": a.rows_lost,
                "lostBytes": a.bytes_lost,
                "lostRowsAtMost": bool(total and total.rows_at_most),
                "lostVersionsUs": [total.min_version, total.max_version] if total else None,
            }
        )
    facet = SegrepFailoverFacet(
        kind=str(report.kind),
        dryRun=report.dry_run,
        cut=str(report.cut),
        toSite=report.to_site,
        lostSegments=sum(t["lostSegments"] for t in tables),
        lostRows=sum(t["lostRows"] for t in tables),
        lostBytes=sum(t["lostBytes"] for t in tables),
        tables=tables,
        cutUs=report.cut_us,
    )
    moves = [m.assessment for m in report.moves]
    return OperatorLineage(
        inputs=[d for a in moves for d in read([a.from_site], a.table, known.get(a.table))],
        outputs=[] if report.dry_run else [written(a.to_site, a.table, schema=known.get(a.table)) for a in moves],
        run_facets={"segrepFailover": facet},
    )


def bootstrap_lineage(
    report: BootstrapReport, leaders: Collection[str], schema: SchemaVersion | None = None
) -> Lineage:
    """A bootstrap: the leaders' copies read (adopted files are checked against them), the site's written;
    both with the table's current ``schema``."""
    facet = SegrepBootstrapFacet(
        table=report.table,
        site=report.site,
        mode=report.mode,
        actions=list(report.actions),
        joiningPlacements=list(report.joining),
    )
    return OperatorLineage(
        inputs=read(leaders, report.table, schema),
        outputs=[written(report.site, report.table, schema=schema)],
        run_facets={"segrepBootstrap": facet},
    )


def split_lineage(
    plan: Mapping[str, Any], manifest: Manifest | None, summary: CommitSummary, schema: SchemaVersion | None = None
) -> Lineage:
    """A split pass: the copies its merge job read segments from (the parent's leader in the copy pass, every
    parent replica in the unload pass), the copies it wrote the children at (the children's leaders); all with
    the table's current ``schema`` (older segments are read projected to it, the children written at it)."""
    items = manifest.items if manifest is not None else []
    bytes_read: dict[str, int] = {}
    for item in items:
        for f in item.incoming:
            bytes_read[f.site] = bytes_read.get(f.site, 0) + f.byte_size
    table = str(plan["table"])
    facet = SegrepSplitFacet(
        splitId=int(plan["split_id"]),
        table=table,
        phase=str(plan["phase"]),
        rewrites=int(plan.get("rewrites", 0)),
        merges=int(plan.get("merges", 0)),
        itemsCommitted=summary.committed,
        rowsIn=summary.rows_in,
        rowsMerged=summary.rows_merged,
        bytesRead=bytes_read,
    )
    return OperatorLineage(
        inputs=read(bytes_read, table, schema),
        outputs=[written(site, table, schema=schema) for site in sorted({item.leader_site for item in items})],
        run_facets={"segrepSplit": facet},
    )
