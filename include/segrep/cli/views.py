"""Read-only views of the catalog for people: table overview, table description, segment chains, and
``segrep status`` (with each table's RPO from the definitions, which the catalog does not keep)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from segrep.catalog import Catalog
from segrep.catalog import link_slots as lk
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.leadership import leadership
from segrep.catalog.publications import PublicationState, publication_states
from segrep.catalog.schemas import SchemaHistoryEntry, schema_history
from segrep.cli.format import (
    ACTIVITY_HEADER,
    LINK_HEADER,
    STATUS_HEADER,
    activity_table,
    format_rows,
    link_table,
    status_table,
)
from segrep.config.definitions import Definitions, Policy
from segrep.config.links import LinkState
from segrep.core import hlc
from segrep.core.chain import is_reference_weak, is_referenced, visible_segments
from segrep.core.errors import NotFoundError
from segrep.publish.outcome import safe_time_text
from segrep.replication.conflicts import recent_conflicts
from segrep.replication.status import TargetState, status_rows
from segrep.split.progress import progress_text, split_progress


def _range(info: q.TableInfo, begin: object, end: object) -> str:
    lo = "-inf" if begin is None else str(info.decode_key(begin))
    hi = "+inf" if end is None else str(info.decode_key(end))
    return f"[{lo}, {hi})"


def table_overview(catalog: Catalog) -> list[list[object]]:
    """One row per table: key, partitions, leader and replica sites, segments, rows visible at the leaders."""
    out: list[list[object]] = []
    with catalog.read() as s:
        sites = q.sites_by_id(s)
        for row in s.scalars(select(m.Table).order_by(m.Table.name)):
            info = q.TableInfo.of(s, row)
            parts = q.serving_partitions(s, info)
            placements = q.active_placements(s, [p.partition_id for p in parts])
            leader_ids = {p.leader_placement_id for p in parts}
            leaders = sorted({sites[pl.site_id].name for pl in placements if pl.placement_id in leader_ids})
            replicas = sorted({sites[pl.site_id].name for pl in placements if pl.placement_id not in leader_ids})
            seg_lists = q.segments_of(s, sorted(leader_ids - {None}))  # type: ignore[arg-type]
            rows_at_leader = 0
            for pl in placements:
                if pl.placement_id in leader_ids:
                    segs = seg_lists.get(pl.placement_id, [])
                    visible = {r.segment_id for r in visible_segments(q.chain_of(pl, segs))}
                    rows_at_leader += sum(x.row_count - x.deleted_rows for x in segs if x.segment_id in visible)
            out.append(
                [
                    row.name,
                    ",".join(info.primary_key),
                    len(parts),
                    ",".join(leaders),
                    ",".join(replicas) or "-",
                    q.segment_count(s, row.table_id),
                    f"<={rows_at_leader}",  # an upper bound: updates and deletes fold on read
                ]
            )
    return out


def describe_table(catalog: Catalog, table: str) -> str:
    with catalog.read() as s:
        info = q.table_info(s, table)
        sites = q.sites_by_id(s)
        parts = q.partitions_of(s, info)
        placements = q.active_placements(s, [p.partition_id for p in parts])
        seg_lists = q.segments_of(s, [pl.placement_id for pl in placements])
        history = schema_history(s, info.table_id)
    current = next((e.schema for e in history if e.version == info.row.schema_version), None)
    ids = {c.name: c.field_id for c in current.columns} if current is not None else {}
    lines = [
        f"table {info.name}  (schema v{info.row.schema_version}, fingerprint {info.row.schema_fingerprint})",
        "",
    ]
    lines.append(
        format_rows(
            ["column", "type", "field id", "key"],
            [
                [name, typ, ids.get(name, "?"), "pk" if name in info.primary_key else ""]
                for name, typ in info.row.columns.items()
            ],
        )
    )
    lines += ["", f"primary key ({', '.join(info.primary_key)}), partitioned by {info.partition_key}"]
    lines += ["", *schema_history_lines(history), ""]
    lines += ["\n".join(map(str, leadership(catalog, table))), ""]
    rows = []
    for part in parts:
        for pl in (x for x in placements if x.partition_id == part.partition_id):
            segs = seg_lists.get(pl.placement_id, [])
            rows.append(
                [
                    part.partition_id,
                    _range(info, part.begin_key, part.end_key),
                    part.state,
                    part.epoch,
                    sites[pl.site_id].name,
                    pl.placement_id,
                    "leader" if pl.placement_id == part.leader_placement_id else "follower",
                    pl.state,
                    len(segs),
                    pl.root_segment_id,
                ]
            )
    lines.append(
        format_rows(
            ["partition", "range", "state", "epoch", "site", "placement", "role", "p.state", "segments", "root"],
            rows,
        )
    )
    return "\n".join(lines)


def schema_history_lines(history: list[SchemaHistoryEntry]) -> list[str]:
    """The table's schema versions, oldest first: number, when, the change, and the columns with field ids
    (a default is what rows written before its column existed read as)."""
    out = ["schema history (version, made, change; columns as field id:name type)"]
    for entry in history:
        out.append(f"  v{entry.version}  {hlc.iso(entry.created_us)}  {entry.change}")
        cols = [
            f"{c.field_id}:{c.name} {c.type}" + (f" default {c.default!r}" if c.default is not None else "")
            for c in entry.schema.columns
        ]
        out.append("      " + ", ".join(cols))
    return out


def segment_listing(catalog: Catalog, table: str, site: str | None, partition_id: int | None) -> str:
    with catalog.read() as s:
        info = q.table_info(s, table)
        sites = q.sites_by_id(s)
        site_row = q.site_by_name(s, site) if site else None
        parts = [p for p in q.partitions_of(s, info) if partition_id is None or p.partition_id == partition_id]
        if partition_id is not None and not parts:
            raise NotFoundError(f"table {table} has no partition {partition_id}")
        every = q.active_placements(s, [p.partition_id for p in parts])
        placements = [pl for pl in every if site_row is None or pl.site_id == site_row.site_id]
        seg_lists = q.segments_of(s, [pl.placement_id for pl in every])
        acks = q.acks_of(s, [pl.placement_id for pl in placements])
        pl_site = {
            pl.placement_id: sites[pl.site_id].name for pl in s.scalars(select(m.Placement))
        }  # acks name placements that may since have been removed
    # provenance: the sites whose placement of the partition lists each segment (it was applied there)
    applied: dict[tuple[int, str], set[str]] = {}
    for pl in every:
        for seg in seg_lists.get(pl.placement_id, []):
            applied.setdefault((pl.partition_id, seg.segment_id), set()).add(sites[pl.site_id].name)
    blocks = []
    for pl in placements:
        part = next(p for p in parts if p.partition_id == pl.partition_id)
        segs = seg_lists.get(pl.placement_id, [])
        chain = q.chain_of(pl, segs)
        role = "leader" if pl.placement_id == part.leader_placement_id else "follower"
        header = (
            f"partition {part.partition_id} {_range(info, part.begin_key, part.end_key)} @ {sites[pl.site_id].name}: "
            f"placement {pl.placement_id} ({role}, {pl.state}), root {pl.root_segment_id or 'NULL'}"
        )
        rows = []
        for seg in segs:
            ref = q.to_ref(seg)
            if not is_referenced(chain, ref.segment_id):
                ref_kind = "fork"
            elif is_reference_weak(chain, ref.segment_id):
                ref_kind = "weak"
            else:
                ref_kind = "strong"
            acked = sorted(f"{pl_site.get(t, '?')}#{t}" for t in acks.get((pl.placement_id, seg.segment_id), ()))
            rows.append(
                [
                    seg.segment_id,
                    seg.base_segment_id,
                    "major" if seg.is_major else "minor",
                    ref_kind,
                    seg.row_count,
                    seg.deleted_rows,
                    seg.byte_size,
                    f"{seg.min_version}..{seg.max_version}",
                    seg.epoch,
                    sites[seg.origin_site_id].name if seg.origin_site_id in sites else seg.origin_site_id,
                    ",".join(sorted(applied.get((pl.partition_id, seg.segment_id), ()))),
                    ",".join(acked) or "-",
                ]
            )
        header_row = ["segment", "base", "kind", "ref", "rows", "deletes", "bytes", "versions", "epoch"]
        table_text = format_rows([*header_row, "origin", "held at", "acked by"], rows)
        blocks.append(f"{header}\n{table_text}")
    return "\n\n".join(blocks) if blocks else f"no placements of {table} match"


# -- segrep status ------------------------------------------------------------------------------------------------


def rpo_cell(state: TargetState) -> str:
    """The objective and whether the lag meets it: ``15m ok``, ``15m BREACHED`` (a never-replicated target
    counts from its start), ``15m ?`` (a lag that cannot be known, nothing lacking), ``-`` (no objective)."""
    if state.rpo_s is None:
        return "-"
    verdict = "BREACHED" if state.rpo_breached else ("?" if state.lag_s is None else "ok")
    return f"{_duration(state.rpo_s)} {verdict}"


def _duration(seconds: int) -> str:
    if seconds == 0:
        return "0s"
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def status_objectives(defs: Definitions | None) -> dict[str, int | None]:
    """Each table's RPO from the definitions (the catalog keeps no policy); none without a definitions file."""
    return {} if defs is None else {name: t.policy.rpo_s for name, t in defs.tables.items()}


def schedule_doc(policy: Policy) -> dict[str, object]:
    """A table's replication schedule for ``segrep status --json``: with ``on_write``, its spacing and the
    fallback interval that replicates a write whose event was lost."""
    if not policy.on_write:
        return {"schedule": policy.schedule}
    return {"schedule": policy.schedule, "min_interval_s": policy.min_interval_s, "fallback_s": policy.write_fallback_s}


def on_write_line(name: str, policy: Policy) -> str:
    return (
        f"  {name}: a round after each write, rounds at least {_duration(policy.min_interval_s)} apart; "
        f"every {_duration(policy.write_fallback_s)} if an event is lost"
    )


# -- links (definitions only: the catalog keeps none) -------------------------------------------------------------


def link_states(defs: Definitions | None, now: datetime, sites: tuple[str, ...] | None = None) -> list[LinkState]:
    """Each defined link as of ``now``; with ``sites``, only the links between two of them (a table's)."""
    if defs is None:
        return []
    return [x.state_at(now) for x in defs.links if sites is None or {x.source, x.target} <= set(sites)]


def link_lines(states: list[LinkState]) -> list[str]:
    """The links block of ``site list`` and ``status``: nothing when no link is defined."""
    if not states:
        return []
    return ["links (caps from the definitions; windows in UTC):", format_rows(LINK_HEADER, link_table(states))]


def link_activity(catalog: Catalog, sites: tuple[str, ...] | None = None) -> list[tuple[str, lk.LinkState]]:
    """Each link with live slots now, as ``source -> target`` and what the catalog's slots say (the cap in
    force, the rate allowed and measured, holders and who waits why); with ``sites``, a table's links only."""
    with catalog.read() as s:
        names = {r.site_id: r.name for r in s.execute(select(m.Site.site_id, m.Site.name))}
        states = lk.link_states(s, hlc.now_us())
    out = []
    for st in states:
        source, target = names.get(st.link.source_site_id, "?"), names.get(st.link.target_site_id, "?")
        if sites is None or {source, target} <= set(sites):
            out.append((f"{source} -> {target}", st))
    return out


def activity_doc(pair: str, st: lk.LinkState) -> dict[str, object]:
    """A link's live state for ``status --json``."""

    def slot(v: lk.SlotView) -> dict[str, object]:
        return {
            "what": str(v.what),
            "share_bytes_per_s": v.share,
            "rate_bytes_per_s": v.rate,
            "sent_bytes": v.sent_bytes,
        }

    return {
        "link": pair,
        "max_bytes_per_second": st.limits.cap_bytes_per_s,
        "max_concurrent_copies": st.limits.max_concurrent,
        "allowed_bytes_per_s": st.rate,
        "sending_bytes_per_s": st.sending,
        "holders": [slot(v) for v in st.holders],
        "waiting": [{**slot(v), "why": why} for v, why in st.waiting],
    }


def status_output(
    catalog: Catalog, defs: Definitions | None, table: str | None, *, as_json: bool, now: datetime | None = None
) -> str:
    """``segrep status``: leadership, one row per table and replica site (with the RPO column, BREACHED when
    the lag is past the table's objective), the tables replicated on write, the splits under way and the links
    (the cap in force at ``now``, default the current time); or the same as one JSON document (with every
    table's schedule)."""
    rows = status_rows(catalog, table, rpo=status_objectives(defs))
    tables = {} if defs is None else {n: t for n, t in sorted(defs.tables.items()) if table in (None, n)}
    splits = split_progress(catalog, table)
    leaders = leadership(catalog, table)
    conflicts = recent_conflicts(catalog, table)
    table_sites = defs.tables[table].sites if defs is not None and table in defs.tables else None
    links = link_states(defs, now or datetime.now(UTC), table_sites)
    activity = link_activity(catalog, table_sites)
    with catalog.read() as s:
        published = publication_states(s, table)
    if as_json:
        replication = [{**r.to_dict(), "note": r.note(), "last_round": r.last_round_text()} for r in rows]
        doc = {
            "replication": replication,
            "schedules": {name: schedule_doc(t.policy) for name, t in tables.items()},
            "splits": [sp.to_dict() for sp in splits],
            "leadership": [x.to_dict() for x in leaders],
            "conflicts": [c.to_dict() for c in conflicts],
            "links": [x.to_dict() for x in links],
            "link_activity": [activity_doc(pair, st) for pair, st in activity],
            "open_tables": [x.to_dict() for x in published],
        }
        return json.dumps(doc, indent=2, sort_keys=True)
    header = [*STATUS_HEADER[:4], "rpo", *STATUS_HEADER[4:]]
    lines = ["\n".join(map(str, leaders))]
    if rows:
        cells = [[*row[:4], rpo_cell(r), *row[4:]] for r, row in zip(rows, status_table(rows), strict=True)]
        lines.append(format_rows(header, cells))
    else:
        lines.append("no replicas")
    on_write = [on_write_line(name, t.policy) for name, t in tables.items() if t.policy.on_write]
    if on_write:
        lines += ["rounds on write (schedule: on_write):", *on_write]
    if splits:
        lines.append(progress_text(splits))
    if conflicts:
        lines.append("conflicts in the last 24 h (active-active: rows overwritten by a concurrent write elsewhere):")
        for c in conflicts:
            keys = "; ".join(json.dumps(k) for k in c.sample)
            lines.append(f"  {c.table}: {c.rows:,} row(s) written at {c.site} overwritten by {c.by} (e.g. {keys})")
    lines += link_lines(links)
    if activity:
        lines += ["links in use (slots held now; rates measured each second, smoothed):"]
        lines.append(format_rows(ACTIVITY_HEADER, activity_table(activity)))
    if published:
        lines += ["open tables (Iceberg catalog `segrep` in the catalog database; <site>.<table>):"]
        lines.append(format_rows(OPEN_TABLES_HEADER, [open_table_row(x) for x in published]))
    return "\n".join(lines)


OPEN_TABLES_HEADER = ["table", "site", "last publication", "snapshot", "shows safe time", "detail"]


def open_table_row(x: PublicationState) -> list[Any]:
    """A failed or waiting publication says so; the snapshot readers still see is shown beside it."""
    safe = "-" if x.safe_time_us is None else safe_time_text(x.safe_time_us)
    when = hlc.iso(x.updated_us)
    status = x.status.upper() if x.status != "published" else "published"
    return [x.table, x.site, f"{status} at {when}", x.snapshot_id or "-", safe, x.detail or "-"]
