"""Rebuild a site's segment lists from its files (DESIGN section 4: a site is self-describing).

Each segment file's footer carries its catalog entry. For every placement at the site, the segment rows are
replaced by what the files say, in chain order (a segment after its base), and the root is the head of the
chain: the segment no other segment builds on or includes (the catalog's own root when its file is among
the heads). Acks are not stored in files and are left as they are (a later round re-learns any that are
missing through SEGMENT_EXISTS).

A rebuild never makes a loss permanent unnoticed. Every segment the catalog lists at the site without a file
is reported (dry run or not): dropping it would lose its rows, and if it held tombstones bring deleted rows
back for the next round to spread. A file the catalog does not list that would become a chain head (a write
that never committed, a stray copy) or that holds versions past the table's clock (never committed anywhere)
is reported too. Either makes the rebuild refuse unless ``accept_loss`` says the loss is known and accepted.
A listed file whose bytes differ from the catalog's size and sha256, or a file that does not belong to a known
placement, makes it refuse in any case. The whole rebuild, its checks included, is one transaction.

The union rule (DESIGN section 13): a partition's history is the union of what every site holds. Before a
listed segment counts as lost, every other site is asked for its file (same path, the catalog's size and
sha256: ``catalog.holders``) and an intact copy is fetched back, verified; only what no reachable site holds
is lost, and the sites that could not be asked are named. A loss accepted at a placement is made honest in
the same transaction: the acks that say the placement holds a dropped segment go (and those of its own list
entry), its checkpoints go (the next commit writes them again from the acks), and the site's safe time moves
back before the oldest dropped row (its rows are no longer readable there), so the next plain round offers
the leader's copy again and status shows it pending.

Each file says the schema version it was written at (``segrep.schema``): a version the catalog does not have
(a catalog restored from before a schema change) is recorded from the files, and becomes the table's current
one when it is newer, so the segments' ``schema_version`` always names a version the catalog holds.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from segrep.catalog import Catalog
from segrep.catalog import leases as ls
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.holders import Holders, fetch
from segrep.catalog.schemas import record_version
from segrep.catalog.segments import segment_row
from segrep.catalog.site_identity import record_found
from segrep.core import hlc
from segrep.core.chain import Chain
from segrep.core.errors import CorruptSegmentError, RefusedError, SegrepError
from segrep.core.schema_versions import SchemaVersion, version_of_file
from segrep.storage.atomic import FileFacts
from segrep.storage.segment_meta import SegmentEntry
from segrep.storage.site import Site
from segrep.storage.stores import STORE_ERRORS

_LISTED_AT_MOST = 10  # items named in a refusal; the report lists them all
# a copy that cannot be fetched: the stores' errors and ours (a bad copy, a site that cannot be opened), and a
# footer whose entry cannot be decoded
_FETCH_ERRORS: tuple[type[Exception], ...] = (*STORE_ERRORS, SegrepError, ValueError, TypeError, KeyError)


@dataclass(frozen=True)
class LostSegment:
    """A segment the catalog lists at the site whose file is gone: its rows (and tombstones) go with it."""

    table: str
    partition_id: int
    segment_id: str
    row_count: int
    deleted_rows: int
    min_version: int
    max_version: int

    def describe(self) -> str:
        tombstones = f", {self.deleted_rows} tombstone(s)" if self.deleted_rows else ""
        return (
            f"{self.table} partition {self.partition_id} segment {self.segment_id} ({self.row_count} row(s)"
            f"{tombstones}, versions {self.min_version}..{self.max_version})"
        )


@dataclass(frozen=True)
class StrayFile:
    """A well-formed segment file the catalog does not list that the rebuild would put on a chain."""

    relpath: str
    segment_id: str
    base_segment_id: str | None
    row_count: int
    max_version: int
    why: str

    def describe(self) -> str:
        return (
            f"{self.relpath} (segment {self.segment_id} on base {self.base_segment_id or 'none'}, "
            f"{self.row_count} row(s), max version {self.max_version}: {self.why})"
        )


@dataclass(frozen=True)
class FetchedSegment:
    """A segment the catalog lists at the site whose file was gone there, fetched back from another site."""

    table: str
    partition_id: int
    segment_id: str
    row_count: int
    source: str  # the site whose intact copy was fetched

    def describe(self) -> str:
        return f"{self.table} partition {self.partition_id} segment {self.segment_id} ({self.row_count} row(s))"


@dataclass(frozen=True)
class RecoveredSchema:
    """A schema version the files were written at that the catalog does not hold, read from a file."""

    table: str
    table_id: int
    schema: SchemaVersion
    relpath: str  # the file it was read from

    def describe(self) -> str:
        columns = ", ".join(f"{c.field_id}:{c.name} {c.type}" for c in self.schema.columns)
        return f"table {self.table} schema version {self.schema.version} ({columns}), read from {self.relpath}"


@dataclass
class RebuildReport:
    site: str
    dry_run: bool
    accept_loss: bool = False
    placements: dict[int, tuple[int, str | None]] = field(default_factory=dict)  # id -> (segments, root)
    forks: dict[int, list[str]] = field(default_factory=dict)
    lost: list[LostSegment] = field(default_factory=list)
    strays: list[StrayFile] = field(default_factory=list)
    fetched: list[FetchedSegment] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)  # sites that could not be asked -> why
    schemas: list[RecoveredSchema] = field(default_factory=list)

    @property
    def refused(self) -> bool:
        """A rebuild (not a dry run) would refuse: a loss the flag has not accepted."""
        return bool(self.lost or self.strays) and not self.accept_loss

    def lines(self) -> list[str]:
        verb = "would rebuild" if self.dry_run else "rebuilt"
        if self.dry_run and self.refused:
            verb = "would refuse to rebuild (without --accept-loss)"
        out = [f"{verb} {len(self.placements)} placement(s) at site {self.site}"]
        for pid, (n, root) in sorted(self.placements.items()):
            out.append(f"  placement {pid}: {n} segment(s), root {root or 'NULL'}")
            for fork in self.forks.get(pid, []):
                out.append(f"    fork head {fork} (not on the chain; the leader procedure merges it)")
        got = "would fetch" if self.dry_run else "fetched"
        for x in self.fetched:
            out.append(f"  FETCHED: {x.describe()} had no file at site {self.site}: {got} from {x.source}")
        fate = "dropped" if self.accept_loss else "kept in the catalog"
        if self.dry_run:
            fate = "would be dropped" if self.accept_loss else "refused without --accept-loss"
        for lost in self.lost:
            out.append(f"  LOST: {lost.describe()} has no file at site {self.site} nor at any reachable site: {fate}")
        for name, why in sorted(self.unreachable.items()):
            out.append(f"  UNREACHABLE: site {name} could not be asked for missing files ({why})")
        taken = "taken from the file" if self.accept_loss else "refused without --accept-loss"
        for stray in self.strays:
            out.append(f"  NOT IN THE CATALOG: {stray.describe()}: {taken}")
        recorded = "would be recorded" if self.dry_run else "recorded"
        for schema in self.schemas:
            out.append(f"  SCHEMA: {schema.describe()}: {recorded}")
        return out

    def refusal(self) -> str:
        parts = []
        if self.lost:
            named = "; ".join(x.describe() for x in self.lost[:_LISTED_AT_MOST])
            parts.append(
                f"{len(self.lost)} catalog segment(s) have no file there nor at any reachable site (their rows "
                f"would be lost): {named}"
            )
        if self.unreachable:
            parts.append(f"site(s) {', '.join(sorted(self.unreachable))} could not be asked for them")
        if self.strays:
            named = "; ".join(x.describe() for x in self.strays[:_LISTED_AT_MOST])
            parts.append(f"{len(self.strays)} file(s) the catalog does not list would go on a chain: {named}")
        return (
            f"refusing to rebuild site {self.site}: " + "; ".join(parts) + "; restore the missing files from a "
            "healthy site (or remove the stray ones) and run again, or pass --accept-loss to drop what is missing "
            "and take the files as they are"
        )


@dataclass(frozen=True)
class _Found:
    entry: SegmentEntry
    relpath: str
    facts: FileFacts
    mtime_us: int


def rebuild_site(
    catalog: Catalog, site_name: str, *, dry_run: bool = False, accept_loss: bool = False
) -> RebuildReport:
    """Rebuild (or, dry run, report) the segment lists and roots of every placement at a site from its files.

    RefusedError, with nothing written, for a loss ``accept_loss`` has not accepted (see the module)."""
    transaction = catalog.read() if dry_run else catalog.write()
    with transaction as s:
        # Only a root whose marker names this site is rebuilt from: an empty mount point would drop it all.
        record_found(s, q.site_by_name(s, site_name), dry_run=True)
        report, plan = _plan(s, site_name, dry_run=dry_run, accept_loss=accept_loss)
        if dry_run:
            return report
        if report.refused:
            raise RefusedError(report.refusal())
        record_found(s, q.site_by_name(s, site_name))  # the marker now names this catalog
        for x in sorted(report.schemas, key=lambda x: (x.table_id, x.schema.version)):
            table = s.get(m.Table, x.table_id, with_for_update=True)
            if table is not None:
                newer = x.schema.version > table.schema_version
                next_id = max(c.field_id for c in x.schema.columns) + 1
                record_version(
                    s, table, x.schema, f"recovered from segment files at site {site_name}", next_id, current=newer
                )
        for step in plan:
            pl, items, root = step.placement, step.items, step.root
            if step.dropped:
                _forget(s, pl, step.dropped, step.unchained)
            s.execute(delete(m.Segment).where(m.Segment.placement_id == pl.placement_id))
            for it in items:
                s.add(segment_row(it.entry, pl.placement_id, it.relpath, it.facts, it.mtime_us))
            s.flush()
            pl.root_segment_id = root
            # The partition's clock must be past every row the files hold (a new catalog starts it at 0): a
            # later write stamped by a clock behind them would lose to rows it replaces.
            part = s.get(m.Partition, pl.partition_id, with_for_update=True)
            newest = max((it.entry.max_version for it in items), default=0)
            if part is not None and part.last_version < newest:
                part.last_version = newest
            # The rows were inserted again with new entry ids, which may be at or below the old settled
            # watermarks (SQLite reuses freed rowids): planning reads only entries above them, so a pending
            # segment would be skipped for good and safe time would pass it. Plan the partition afresh.
            q.reset_watermarks(s, pl.partition_id)
    return report


@dataclass(frozen=True)
class _Step:
    """What the rebuild writes for one placement: its list, its root, and the loss it makes honest."""

    placement: m.Placement
    items: list[_Found]
    root: str | None
    dropped: list[LostSegment]  # listed segments no site holds: dropped (accepted)
    unchained: list[m.Segment]  # held, but taken off the chain by the rewound root (a replica's, ``_whole_root``)


def _whole_root(known: dict[str, m.Segment], root: str | None, present: set[str]) -> tuple[str | None, list[m.Segment]]:
    """A replica whose chain lost a segment is rewound to the part of its chain that is whole: the root
    becomes the base of the oldest dropped segment on the walk from its catalog root (up to the newest major),
    or None if that base is not held either. The replica then serves a consistent prefix of the leader's
    history, and the leader's next offers fill the gap in order (a fast-forward on that root) instead of
    meeting a chain that cannot take them (OUT_OF_ORDER, then a major). Returns the root and the held segments
    it took off the chain (the replica no longer serves their rows: they are offered again)."""
    walk = Chain.of((q.to_ref(x) for x in known.values()), root).walk()
    new, cut = root, 0
    for n, ref in enumerate(walk):
        if ref.segment_id not in present:
            new, cut = ref.base_segment_id, n + 1
        if ref.is_major:
            break
    if new is not None and new not in present:
        new = None
    return new, [known[ref.segment_id] for ref in walk[:cut] if ref.segment_id in present]


def _plan(s: Session, site_name: str, *, dry_run: bool, accept_loss: bool) -> tuple[RebuildReport, list[_Step]]:
    """Read the catalog and the files; what the rebuild would write, and the report of it."""
    site_row = q.site_by_name(s, site_name)
    site = Site(site_row.name, site_row.uri)
    query = select(m.Placement).where(m.Placement.site_id == site_row.site_id, m.Placement.removed_us.is_(None))
    placements = {pl.partition_id: pl for pl in s.scalars(query if dry_run else query.with_for_update())}
    tables = {t.table_id: t.name for t in s.scalars(select(m.Table))}
    parts = {p.partition_id: p for p in s.scalars(select(m.Partition))}
    clocks: dict[int, int] = defaultdict(int)  # table id -> the newest version any of its partitions committed
    for p in parts.values():
        clocks[p.table_id] = max(clocks[p.table_id], p.last_version)
    listed: dict[int, dict[str, m.Segment]] = defaultdict(dict)
    if placements:
        ids = [pl.placement_id for pl in placements.values()]
        for seg in s.scalars(select(m.Segment).where(m.Segment.placement_id.in_(ids))):
            listed[seg.placement_id][seg.segment_id] = seg

    found, problems = _read_files(site, placements, parts, tables, listed)
    schemas, more = _unknown_schemas(s, site, found, parts, tables)
    problems += more
    if problems:
        raise RefusedError(f"cannot rebuild site {site_name}: " + "; ".join(problems[:_LISTED_AT_MOST]))

    report = RebuildReport(site=site_name, dry_run=dry_run, accept_loss=accept_loss, schemas=schemas)
    holders = Holders.besides(s, s.scalars(select(m.Site)).all(), site_name)
    problems = _fetch_missing(site, holders, placements, tables, parts, listed, found, report)
    if problems:
        raise RefusedError(f"cannot rebuild site {site_name}: " + "; ".join(problems[:_LISTED_AT_MOST]))
    report.unreachable = dict(holders.unreachable)
    plan = []
    for pl in sorted(placements.values(), key=lambda x: x.placement_id):
        part = parts[pl.partition_id]
        table = tables[part.table_id]
        items = found.get(pl.placement_id, [])
        known = listed.get(pl.placement_id, {})
        present = {it.entry.segment_id for it in items}
        dropped = [_lost(table, seg) for seg in known.values() if seg.segment_id not in present]
        report.lost += dropped
        heads = _heads([it.entry for it in items])
        for it in items:
            entry = it.entry
            if entry.segment_id in known:
                continue
            if entry.max_version > clocks[part.table_id]:
                why = f"versions past the table's clock {clocks[part.table_id]}: never committed"
            elif known and entry.segment_id in {h.segment_id for h in heads}:
                why = "a chain head the catalog never had"
            else:
                continue
            report.strays.append(
                StrayFile(it.relpath, entry.segment_id, entry.base_segment_id, entry.row_count, entry.max_version, why)
            )
        root = _root(heads, pl.root_segment_id)
        unchained: list[m.Segment] = []
        if dropped and part.leader_placement_id != pl.placement_id:
            rewound, unchained = _whole_root(known, pl.root_segment_id, present)
            if unchained or rewound != pl.root_segment_id:  # a dropped segment was on its walk
                root = rewound
        report.placements[pl.placement_id] = (len(items), root)
        forks = [h.segment_id for h in heads if h.segment_id != root]
        if forks and not unchained:
            report.forks[pl.placement_id] = forks
        plan.append(_Step(pl, _chain_order(items), root, dropped, unchained))
    report.lost.sort(key=lambda x: (x.table, x.partition_id, x.min_version, x.segment_id))
    return report, plan


def _read_files(
    site: Site,
    placements: dict[int, m.Placement],
    parts: dict[int, m.Partition],
    tables: dict[int, str],
    listed: dict[int, dict[str, m.Segment]],
) -> tuple[dict[int, list[_Found]], list[str]]:
    """Every segment file at the site by placement, and the problems that make a rebuild refuse in any case:
    unreadable footers, files that belong to no placement, listed files whose bytes are not the catalog's."""
    found: dict[int, list[_Found]] = defaultdict(list)
    problems: list[str] = []
    for relpath in site.list_segment_files():
        try:
            entry = SegmentEntry.from_meta(site.read_meta(relpath))
        except (CorruptSegmentError, ValueError, TypeError, KeyError) as exc:
            problems.append(f"{relpath}: unreadable segment metadata ({exc})")
            continue
        part = parts.get(entry.partition_id)
        pl = placements.get(entry.partition_id)
        expected = f"{entry.table}/{entry.partition_id}/{entry.segment_id}.parquet"
        if relpath != expected:
            problems.append(f"{relpath}: metadata says it is {expected}")
            continue
        if part is None or tables.get(part.table_id) != entry.table:
            problems.append(f"{relpath}: table {entry.table} has no partition {entry.partition_id} in the catalog")
            continue
        if pl is None:
            problems.append(f"{relpath}: site {site.name} holds no placement of partition {entry.partition_id}")
            continue
        facts = site.facts(relpath)
        seg = listed.get(pl.placement_id, {}).get(entry.segment_id)
        if seg is not None and FileFacts(seg.byte_size, seg.sha256) != facts:
            problems.append(
                f"{site.path(relpath)} is damaged: {facts.byte_size} bytes, sha256 {facts.sha256[:12]}... where the "
                f"catalog says {seg.byte_size} bytes, sha256 {seg.sha256[:12]}... (restore it from a healthy site, "
                "or remove it and rebuild with --accept-loss)"
            )
            continue
        found[pl.placement_id].append(_Found(entry, relpath, facts, _mtime_us(site, relpath)))
    return found, problems


def _unknown_schemas(
    s: Session, site: Site, found: dict[int, list[_Found]], parts: dict[int, m.Partition], tables: dict[int, str]
) -> tuple[list[RecoveredSchema], list[str]]:
    """The schema versions the files were written at that the catalog lacks, each read from one file's
    schema (a footer read, only for those), and the problems: a file whose schema does not say the version
    its entry names."""
    known = {(t, v) for t, v in s.execute(select(m.SchemaVersionRow.table_id, m.SchemaVersionRow.version))}
    out: dict[tuple[int, int], RecoveredSchema] = {}
    problems: list[str] = []
    for items in found.values():
        for it in items:
            table_id = parts[it.entry.partition_id].table_id
            key = (table_id, it.entry.schema_version)
            if key in known or key in out:
                continue
            try:
                version = version_of_file(site.read_schema(it.relpath))
            except SegrepError as exc:
                problems.append(f"{it.relpath}: {exc}")
                continue
            if version is None or version.version != it.entry.schema_version:
                problems.append(
                    f"{it.relpath}: its entry says schema version {it.entry.schema_version}, which the catalog does "
                    "not hold, and its schema does not carry that version"
                )
                continue
            out[key] = RecoveredSchema(tables[table_id], table_id, version, it.relpath)
    return list(out.values()), problems


def _mtime_us(site: Site, relpath: str) -> int:
    info = site.fs.get_file_info(site.path(relpath))
    return int(info.mtime_ns // 1000) if info.mtime_ns else 0


def _fetch_missing(
    site: Site,
    holders: Holders,
    placements: dict[int, m.Placement],
    tables: dict[int, str],
    parts: dict[int, m.Partition],
    listed: dict[int, dict[str, m.Segment]],
    found: dict[int, list[_Found]],
    report: RebuildReport,
) -> list[str]:
    """The union rule: each listed segment without a file here is looked for at every other site and, where
    one holds it intact, fetched back (a dry run only says from where) and counted as found. Returns the
    problems that make the rebuild refuse in any case (a copy that could not be fetched or read)."""
    problems: list[str] = []
    for pl in sorted(placements.values(), key=lambda x: x.placement_id):
        present = {it.entry.segment_id for it in found.get(pl.placement_id, [])}
        table = tables[parts[pl.partition_id].table_id]
        for seg in sorted(listed.get(pl.placement_id, {}).values(), key=lambda x: x.entry_id):
            if seg.segment_id in present:
                continue
            source = holders.find(seg.relpath, FileFacts(seg.byte_size, seg.sha256))
            if source is None:
                continue
            try:
                entry = SegmentEntry.from_meta(source.read_meta(seg.relpath))
                if (entry.table, entry.partition_id, entry.segment_id) != (table, seg.partition_id, seg.segment_id):
                    raise CorruptSegmentError(f"its metadata names segment {entry.segment_id} of {entry.table}")
                if report.dry_run:
                    facts, mtime = FileFacts(seg.byte_size, seg.sha256, seg.crc64nvme), 0
                else:
                    facts, mtime = fetch(source, site, seg), _mtime_us(site, seg.relpath)
            except _FETCH_ERRORS as exc:
                problems.append(f"{seg.relpath}: could not be fetched from site {source.name} ({exc})")
                continue
            found[pl.placement_id].append(_Found(entry, seg.relpath, facts, mtime))
            report.fetched.append(FetchedSegment(table, seg.partition_id, seg.segment_id, seg.row_count, source.name))
    return problems


def _forget(s: Session, pl: m.Placement, dropped: list[LostSegment], unchained: list[m.Segment]) -> None:
    """A loss accepted at a placement, made honest: it no longer holds the dropped segments (nor, on its
    chain, those its rewound root took off), so the acks that say it does go, and those of its own dropped
    list entries; its checkpoints go (the next commit writes them from the acks that remain; the watermarks
    are reset by the caller); and at a replica the site's safe time moves back before the oldest row it no
    longer serves."""
    ids = sorted({x.segment_id for x in dropped})
    ls.drop_acks(s, holders=pl.placement_id, segments=ids)
    ls.drop_acks(s, segments=ids + [x.segment_id for x in unchained], targets=pl.placement_id)
    s.execute(
        delete(m.Checkpoint)
        .where(m.Checkpoint.target_placement_id == pl.placement_id)
        .execution_options(synchronize_session=False)
    )
    part = s.get(m.Partition, pl.partition_id)
    if part is None or part.leader_placement_id == pl.placement_id:
        return  # at the leader the rows are gone from the table itself (named in the report)
    before = min([x.min_version for x in dropped] + [x.min_version for x in unchained]) - 1
    s.execute(
        update(m.SafeTime)
        .where(
            m.SafeTime.table_id == part.table_id,
            m.SafeTime.site_id == pl.site_id,
            m.SafeTime.safe_time_us > before,
        )
        .values(safe_time_us=before, updated_us=hlc.now_us())
        .execution_options(synchronize_session=False)
    )


def _lost(table: str, seg: m.Segment) -> LostSegment:
    return LostSegment(
        table, seg.partition_id, seg.segment_id, seg.row_count, seg.deleted_rows, seg.min_version, seg.max_version
    )


def _root(heads: list[SegmentEntry], catalog_root: str | None) -> str | None:
    """The catalog's root if its file is a head; else the newest head (by max version, then id)."""
    if any(h.segment_id == catalog_root for h in heads):
        return catalog_root
    newest = max(heads, key=lambda e: (e.max_version, e.segment_id), default=None)
    return newest.segment_id if newest is not None else None


def _heads(entries: list[SegmentEntry]) -> list[SegmentEntry]:
    """Segments that nothing else in the list builds on or includes: candidate roots."""
    covered = {e.base_segment_id for e in entries} | {i for e in entries for i in e.included_segment_ids}
    return [e for e in entries if e.segment_id not in covered]


def _chain_order(items: list[_Found]) -> list[_Found]:
    """Order segments so each comes after its base (Kahn's algorithm; ties by version, then id)."""
    by_id = {it.entry.segment_id: it for it in items}
    children: dict[str, list[str]] = defaultdict(list)
    ready: list[tuple[int, str]] = []
    for it in items:
        base = it.entry.base_segment_id
        if base is not None and base in by_id:
            children[base].append(it.entry.segment_id)
        else:
            heapq.heappush(ready, (it.entry.min_version, it.entry.segment_id))
    out = []
    while ready:
        _, sid = heapq.heappop(ready)
        out.append(by_id[sid])
        for child in children[sid]:
            heapq.heappush(ready, (by_id[child].entry.min_version, child))
    return out
