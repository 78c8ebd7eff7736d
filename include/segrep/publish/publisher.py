"""Publishing a site's copy of a table as an Iceberg snapshot (DESIGN section 18).

For each site: the files ``segrep read --site`` reads (``data.reader.placement_files``: each partition's
visible segments, restricted to the placement's key range, with a split's unloading parent and an
active-active site's own writes), the rows it hides (``hidden_rows``), and the site's safe time. A snapshot
is committed when any of those changed since the site's current one: when only files were added, it carries
the previous snapshot's manifests and adds one for the new files and one for the positions they hide (only
the new files are read); otherwise (a compaction's major, a failover's cut, a split, a fork merged away) a
clean snapshot lists every file afresh. The commit is the catalog's conditional update of the table's
metadata location: a publication killed before it leaves the previous snapshot current.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog as IcebergCatalog
from pyiceberg.exceptions import CommitFailedException, NamespaceAlreadyExistsError, NoSuchTableError
from pyiceberg.manifest import DataFile, ManifestContent, ManifestFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import (
    AddSchemaUpdate,
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    RemoveSnapshotsUpdate,
    SetCurrentSchemaUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    TableUpdate,
)
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.publications import abandoned, forget, record, recorded_token
from segrep.catalog.schemas import schema_versions
from segrep.catalog.site_identity import open_site
from segrep.config.definitions import Definitions
from segrep.config.iceberg_catalog import IcebergCatalogDef
from segrep.core import faults, keys
from segrep.core import schema as sch
from segrep.core.collector import collector_paused
from segrep.core.errors import NotFoundError, SegrepError, SiteUnidentifiedError
from segrep.core.schema_versions import SchemaVersion
from segrep.data.reader import PlacementFiles, placement_files_in, read_in_threads
from segrep.publish import filled_copies as fill
from segrep.publish import iceberg_files as files
from segrep.publish import iceberg_types as types
from segrep.publish import winners_index
from segrep.publish.hidden_rows import FILE_COL, POS_COL, KeyRange, out_of_range, positions, resolve
from segrep.publish.metadata_gc import collect_unreferenced
from segrep.publish.outcome import (
    UNKNOWN_SAFE_TIME,
    Publication,
    PublishStatus,
    SitePublication,
    SnapshotKind,
)
from segrep.publish.policy import enabled
from segrep.publish.site_catalog import SiteLocation, identifier, namespace, site_catalog, site_location
from segrep.publish.winners_index import IndexFiles

log = logging.getLogger(__name__)

# the safe time of a site leading every partition it holds (replication.safetime.leader_safe_time)
LeaderSafeTime = Callable[[Catalog, str, str], "int | None"]
# how a snapshot lists the files (2: filled copies, filled_copies), in every state token and fingerprint: a
# change of it publishes every site once afresh
_LAYOUT = 2
_PREFIX = "segrep."
KEEP_SNAPSHOTS = 5  # older snapshots are expired: their files may be compacted away and collected
# an incremental snapshot carrying this many manifests is consolidated instead: the largest data manifest kept,
# one manifest of the other data files and one delete file of every hidden position, written from the metadata
# alone (no segment file is read)
MAX_CARRIED_MANIFESTS = 16
TABLE_PROPERTIES = {
    "format-version": "2",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "5",
}


@dataclass(frozen=True)
class _SiteState:
    """What the catalog says the site serves now. Files are named by their path under the site's root: a
    split's children hold files of the same segment id in their own partition directories."""

    info: q.TableInfo
    placements: list[PlacementFiles]
    safe_time_us: int | None  # None: a leader's, not computed here (the previous snapshot's is kept)
    round_id: int | None
    epoch: int
    structure: str  # the placements and their key ranges
    fingerprint: str  # the structure, every file and the schema version
    leads_all: bool = False  # the site leads every partition it holds: its safe time is a leader's

    def files(self) -> dict[str, tuple[PlacementFiles, m.Segment]]:
        out: dict[str, tuple[PlacementFiles, m.Segment]] = {}
        for pf in self.placements:
            for seg in pf.segments:
                out.setdefault(seg.relpath, (pf, seg))
        return out


def publish_table(
    catalog: Catalog,
    defs: Definitions,
    table: str,
    sites: Sequence[str] | None = None,
    *,
    leader_safe_time: LeaderSafeTime | None = None,
) -> Publication:
    """Publish every site of ``table`` (or those named) whose state moved; a table whose policy does not say
    ``publish: iceberg`` is not published (an empty result). ``leader_safe_time``: the safe time of a site
    leading every partition it holds, as rounds bound a leader (``replication.safetime.leader_safe_time``;
    ``replication.publication.publish`` passes it); without it such a site keeps its previous snapshot's safe
    time (a write published at once claims no more than the last round did).

    In order: the state tokens (a site whose token is the recorded one is UNCHANGED, nothing more read); the
    Iceberg table of every other site, loaded (``_Handle`` says why first); a leader's safe time; then every
    site's state in one session (the table's rows read once for all), and each site published in turn.
    Python's cyclic collector is held off meanwhile (``core.collector``: it took 45 % of the publication of a
    long history)."""
    if not enabled(defs, table):
        return Publication(table)
    with collector_paused():
        return _publish_sites(catalog, defs, table, sites, leader_safe_time)


def _publish_sites(
    catalog: Catalog,
    defs: Definitions,
    table: str,
    sites: Sequence[str] | None,
    leader_safe_time: LeaderSafeTime | None,
) -> Publication:
    started = time.perf_counter()
    choice = defs.iceberg_catalog
    with catalog.read() as s:
        info = q.table_info(s, table)
        holders = {r.name: r for r in _sites_of(s, info)}
        gone = [r for r in abandoned(s, info.table_id) if sites is None or r.name in sites]
        for row in [*gone, *holders.values()]:
            s.expunge(row)
        chosen = sorted(holders) if sites is None else [x for x in sites if x in holders]
        rows = _TableRows.read(s, info)
        looked = {site: _prepare(s, catalog, rows, site, read_state=False) for site in chosen}
    moving = [site for site, p in looked.items() if p.unchanged is None and p.rows is not None]
    handles = {site: _open(catalog, holders[site], table, choice) for site in moving}
    opened = [site for site in moving if isinstance(handles[site], _Handle)]
    # a leader's safe time is read before its files: they then hold every write it claims
    leader_safe = {
        site: leader_safe_time(catalog, table, site) if leader_safe_time and rows.leads_all(looked[site]) else None
        for site in opened
    }
    with catalog.read() as s:
        rows = _TableRows.read(s, q.table_info(s, table))
        prepared = {site: _prepare(s, catalog, rows, site) for site in opened}
    out: list[SitePublication] = []
    for site in chosen:
        first, handle = looked[site], handles.get(site)
        if first.unchanged is not None or first.rows is None or handle is None:
            out.append(first.unchanged or SitePublication(site, PublishStatus.WAITING, detail=first.waiting))
        elif not isinstance(handle, _Handle):  # the site is down or its table cannot be loaded: recorded
            out.append(_recorded(catalog, first, handle))
        else:
            out.append(_publish_prepared(catalog, prepared[site], handle, leader_safe[site], leader_safe_time, choice))
    # each site's figure: its own publication and an even part of what was read for all of them
    share = max(0.0, time.perf_counter() - started - sum(x.seconds for x in out)) / max(1, len(out))
    retired = tuple(_retire(catalog, info.table_id, table, row, choice) for row in gone)
    return Publication(table, tuple(replace(x, seconds=round(x.seconds + share, 3)) for x in out) + retired)


def _retire(
    catalog: Catalog, table_id: int, table: str, site: m.Site, choice: IcebergCatalogDef | None
) -> SitePublication:
    """Unregister the Iceberg table of a site that holds ``table`` no more: segrep no longer keeps it current,
    and an engine reading it would get the rows of whenever it was last published. Its files stay (as the
    removed replica's segment files do). FAILED (retried next time) if the catalog cannot be reached."""
    try:
        with contextlib.suppress(NoSuchTableError):
            site_catalog(catalog, site.name, site.uri, choice).drop_table(identifier(site.name, table))
        forget(catalog, table_id, site.site_id)
    except Exception as exc:  # as a publication: never fails the round or apply it follows
        log.warning("unregistering %s at %s failed", table, site.name, exc_info=True)
        detail = f"not unregistered (the site holds the table no more): {type(exc).__name__}: {exc}"
        with contextlib.suppress(SegrepError, SQLAlchemyError):  # status shows it, with the snapshot still there
            record(catalog, table_id, site.site_id, str(PublishStatus.FAILED), detail)
        return SitePublication(site.name, PublishStatus.FAILED, detail=detail)
    detail = "the site holds no partition of the table: its Iceberg table is unregistered (its files stay)"
    return SitePublication(site.name, PublishStatus.RETIRED, detail=detail)


def _sites_of(s: Any, info: q.TableInfo) -> list[m.Site]:
    parts = q.serving_partitions(s, info)
    placements = q.active_placements(s, [p.partition_id for p in parts])
    by_id = q.sites_by_id(s)
    return [by_id[pl.site_id] for pl in placements]


@dataclass(frozen=True)
class _TableRows:
    """What every site's state token shares: the table's partitions and placements (all of them: another
    site's fork bounds a leader), its segments' and acks' aggregates, its schema versions and newest round."""

    info: q.TableInfo
    parts: list[m.Partition]
    placements: list[m.Placement]
    shared: list[Any]  # the token's table-wide part
    versions: dict[int, SchemaVersion]
    round_id: int | None

    @classmethod
    def read(cls, s: Any, info: q.TableInfo) -> _TableRows:
        """A few aggregate queries, whatever the history's length."""
        parts = q.partitions_of(s, info)
        placements = q.active_placements(s, [p.partition_id for p in parts])
        ids = [pl.placement_id for pl in placements]
        segments = s.execute(
            select(m.Segment.placement_id, func.count(), func.max(m.Segment.entry_id))
            .where(m.Segment.placement_id.in_(ids))
            .group_by(m.Segment.placement_id)
            .order_by(m.Segment.placement_id)
        ).all()
        acks = s.execute(select(func.count(), func.max(m.Ack.acked_us)).where(m.Ack.holder_placement_id.in_(ids))).one()
        round_id = s.scalar(
            select(func.max(m.Round.round_id)).where(
                m.Round.table_id == info.table_id, m.Round.finished_us.is_not(None)
            )
        )
        shared = [
            info.row.schema_version,
            [list(row) for row in segments],
            list(acks),
            [[p.partition_id, p.state, p.epoch, p.last_version, p.leader_placement_id] for p in parts],
            [
                [pl.placement_id, pl.site_id, pl.state, pl.root_segment_id, pl.key_begin, pl.key_end]
                for pl in placements
            ],
        ]
        return cls(info, parts, placements, shared, schema_versions(s, info.table_id), round_id)

    def leads_all(self, p: _Prepared) -> bool:
        """True if the prepared site leads every serving partition it holds (as these rows say)."""
        serving = [x for x in self.parts if q.serves(x)]
        ids, leaders = {x.partition_id for x in serving}, {x.leader_placement_id for x in serving}
        mine = [pl for pl in self.placements if pl.site_id == p.ids[1] and pl.partition_id in ids]
        return bool(mine) and all(pl.placement_id in leaders for pl in mine)


@dataclass(frozen=True)
class _Prepared:
    """A site's publication as read from the catalog: its ids and state token, and (when the token is not
    the recorded one) the state to publish; or why it waits."""

    site: str
    rows: _TableRows | None = None
    ids: tuple[int, int] = (0, 0)
    token: str = ""
    unchanged: SitePublication | None = None  # the recorded token is this one: nothing to read or write
    state: _SiteState | None = None
    waiting: str = ""  # the site holds no partition, or lacks a copy of one (joining)


def _prepare(s: Any, catalog: Catalog, rows: _TableRows, site: str, *, read_state: bool = True) -> _Prepared:
    """The site's state token (a digest of what decides its copy and its safe time: ``rows``, the site's
    recorded safe time and the publication's layout) and, if it is not the recorded one and ``read_state``,
    its state. The token is read before the state, in the same session: a recorded token names what was
    published or less, never more."""
    info = rows.info
    try:
        site_id = q.site_by_name(s, site).site_id
        if not any(pl.site_id == site_id for pl in rows.placements):
            raise NotFoundError(f"site {site} holds no partition of {info.name}")
        safe = _safe_time_row(s, info.table_id, site_id)
        ids = (info.table_id, site_id)
        token = _digest([_LAYOUT, rows.shared[0], safe, *rows.shared[1:]])
        recorded, snapshot_id, safe_time = recorded_token(s, *ids)
        if recorded == token:
            unchanged = SitePublication(site, PublishStatus.UNCHANGED, snapshot_id, safe_time)
            return _Prepared(site, rows, ids, token, unchanged=unchanged)
    except NotFoundError as exc:  # not recorded: the site holds no partition of the table (or is unknown)
        return _Prepared(site, waiting=str(exc))
    if not read_state:
        return _Prepared(site, rows, ids, token)
    try:
        return _Prepared(site, rows, ids, token, state=_site_state_in(s, catalog, rows, site, safe))
    except NotFoundError as exc:  # recorded: the site lacks a copy of some partition (joining)
        return _Prepared(site, rows, ids, token, waiting=str(exc))


def _safe_time_row(s: Any, table_id: int, site_id: int) -> int | None:
    value = s.scalar(
        select(m.SafeTime.safe_time_us).where(m.SafeTime.table_id == table_id, m.SafeTime.site_id == site_id)
    )
    return None if value is None else int(value)


def _publish_prepared(
    catalog: Catalog,
    p: _Prepared,
    handle: _Handle,
    leader_safe: int | None,
    leader_safe_time: LeaderSafeTime | None,
    choice: IcebergCatalogDef | None,
) -> SitePublication:
    """Publish a prepared site if it moved; FAILED (with why) leaves the previous snapshot. The outcome is
    recorded for ``segrep status`` (``catalog.publications``) with the state token: a publication that
    finds the same token returns UNCHANGED without reading a file."""
    if p.unchanged is not None:  # another publication recorded this state since the tokens were first read
        return p.unchanged
    if p.rows is None:
        return SitePublication(p.site, PublishStatus.WAITING, detail=p.waiting)
    started = time.perf_counter()
    if p.state is None:
        attempt = SitePublication(p.site, PublishStatus.WAITING, detail=p.waiting)
    else:
        # a site leading all it holds: as rounds bound a leader, read before its files (None: the previous
        # snapshot's safe time)
        state = replace(p.state, safe_time_us=leader_safe) if p.state.leads_all else p.state
        attempt = _attempt(catalog, p.site, state, p.rows.versions, handle, leader_safe_time, choice)
    return _recorded(catalog, p, replace(attempt, seconds=time.perf_counter() - started))


def _recorded(catalog: Catalog, p: _Prepared, out: SitePublication) -> SitePublication:
    """``out`` recorded for the site (a snapshot and the token only when its table shows the state)."""
    try:
        shows = out.status in (PublishStatus.PUBLISHED, PublishStatus.UNCHANGED)
        status = PublishStatus.PUBLISHED if shows else out.status
        snapshot, safe = (out.snapshot_id, out.safe_time_us) if shows else (None, None)
        record(catalog, *p.ids, str(status), out.detail, snapshot_id=snapshot, safe_time_us=safe, state_token=p.token)
    except (SegrepError, SQLAlchemyError) as exc:  # the catalog went away: status shows the last record
        log.warning("publication at %s not recorded: %s", p.site, exc)
    return out


@dataclass(frozen=True)
class _Handle:
    """A site's Iceberg table, loaded before the catalog's state is read. The commit is conditional on the
    metadata location loaded: it lands only if no other publication committed since, and one that committed
    before had read the catalog earlier than this one did. So an older state never replaces a newer snapshot."""

    ice: IcebergCatalog
    tbl: IcebergTable
    loc: SiteLocation
    row: m.Site


def _open(catalog: Catalog, row: m.Site, table: str, choice: IcebergCatalogDef | None) -> _Handle | SitePublication:
    """The site's Iceberg table (registered now if it is not yet), or why not: WAITING for a site that is down or
    whose root this catalog has not claimed (a new catalog before `catalog rebuild`, a vanished site: its
    files are not the ones the catalog lists, and nothing is written there), FAILED otherwise."""
    site = open_site(catalog, row)
    try:
        site.ensure_identified()
    except OSError as exc:  # SiteUnidentifiedError, or a root that cannot be reached or is blocked
        down = str(exc) if isinstance(exc, SiteUnidentifiedError) else f"DOWN/UNIDENTIFIED: {exc}"
        detail = f"{down} (its last snapshot, if any, stays current)"
        return SitePublication(row.name, PublishStatus.WAITING, detail=detail)
    try:
        loc = site_location(site)
        ice = site_catalog(catalog, row.name, row.uri, choice)
        return _Handle(ice, _table(ice, row.name, table, loc), loc, row)
    except (SegrepError, OSError) as exc:
        return SitePublication(row.name, PublishStatus.FAILED, detail=f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # the Iceberg catalog's own errors: never the round's failure
        log.warning("loading the Iceberg table %s at %s failed", table, row.name, exc_info=True)
        return SitePublication(row.name, PublishStatus.FAILED, detail=f"{type(exc).__name__}: {exc}")


def _attempt(
    catalog: Catalog,
    site: str,
    state: _SiteState,
    versions: dict[int, SchemaVersion],
    handle: _Handle,
    leader_safe_time: LeaderSafeTime | None,
    choice: IcebergCatalogDef | None,
) -> SitePublication:
    table = state.info.name
    try:
        try:
            return _publish(site, state, versions, handle)
        except CommitFailedException:  # another publication committed since the table was loaded: once more,
            fresh = _open(catalog, handle.row, table, choice)  # in the same order (table, safe time, state)
            if not isinstance(fresh, _Handle):
                return fresh
            safe = leader_safe_time(catalog, table, site) if leader_safe_time is not None else None
            again, again_versions = _site_state(catalog, table, site, safe)
            return _publish(site, again, again_versions, fresh)
    except NotFoundError as exc:
        return SitePublication(site, PublishStatus.WAITING, detail=str(exc))
    except (SegrepError, OSError, CommitFailedException) as exc:
        return SitePublication(site, PublishStatus.FAILED, detail=f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # a publication never fails the round, write or failover it follows
        log.warning("publishing %s at %s failed", table, site, exc_info=True)
        return SitePublication(site, PublishStatus.FAILED, detail=f"{type(exc).__name__}: {exc}")


def _site_state(
    catalog: Catalog, table: str, site: str, leader_safe: int | None
) -> tuple[_SiteState, dict[int, SchemaVersion]]:
    """The site's state and the table's schema versions read afresh (a publication that lost a race looks
    again); a leader's safe time is the one given (read before this)."""
    with catalog.read() as s:
        info = q.table_info(s, table)
        rows = _TableRows.read(s, info)
        site_id = q.site_by_name(s, site).site_id
        state = _site_state_in(s, catalog, rows, site, _safe_time_row(s, info.table_id, site_id))
    return (replace(state, safe_time_us=leader_safe) if state.leads_all else state), rows.versions


def _site_state_in(s: Any, catalog: Catalog, rows: _TableRows, site: str, safe: int | None) -> _SiteState:
    """The files the site serves and what the snapshot's summary says of them. A site the catalog has no safe
    time for (a replica no round reached yet, an old leader after a failover) promises nothing: 0,
    "unknown" (never the leaders' clock, which would claim writes it does not hold); a site leading every
    partition it holds is marked ``leads_all``, its safe time resolved as rounds bound a leader."""
    info = rows.info
    placements = placement_files_in(s, catalog, info, site)
    leads_all = all(pf.is_leader for pf in placements)
    safe_time: int | None = UNKNOWN_SAFE_TIME if safe is None else safe
    structure = _digest([[pf.placement_id, pf.key_begin, pf.key_end] for pf in placements])
    fingerprint = _digest(
        [_LAYOUT, structure, info.row.schema_version, [[seg.relpath for seg in pf.segments] for pf in placements]]
    )
    epoch = max((p.epoch for p in rows.parts if q.serves(p)), default=0)
    return _SiteState(info, placements, safe_time, rows.round_id, epoch, structure, fingerprint, leads_all)


def _digest(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _publish(site: str, state: _SiteState, versions: dict[int, SchemaVersion], handle: _Handle) -> SitePublication:
    if not state.placements:
        return SitePublication(site, PublishStatus.WAITING, detail="no partition is served")
    ice, tbl, loc = handle.ice, handle.tbl, handle.loc
    current_version = versions[state.info.row.schema_version]
    schema = types.iceberg_schema(current_version, current_version.version)
    mapping = types.name_mapping(versions.values(), current_version)
    snap = tbl.current_snapshot()
    summary = snap.summary if snap is not None and snap.summary is not None else None
    prev = dict(summary.additional_properties) if summary is not None else {}
    if state.safe_time_us is None:
        state = replace(state, safe_time_us=int(prev.get(_PREFIX + "safe-time-us") or UNKNOWN_SAFE_TIME))
    schema_same = types.same_columns(tbl.schema(), schema) and tbl.schema().schema_id == schema.schema_id
    if (
        prev.get(_PREFIX + "fingerprint") == state.fingerprint
        and prev.get(_PREFIX + "safe-time-us") == str(state.safe_time_us)
        and schema_same
    ):
        return SitePublication(site, PublishStatus.UNCHANGED, snap.snapshot_id if snap else None, state.safe_time_us)
    return _commit(ice, tbl, loc, state, versions, schema, mapping.model_dump_json(), schema_same, snap, prev)


def _table(ice: IcebergCatalog, site: str, table: str, loc: SiteLocation) -> IcebergTable:
    ident = identifier(site, table)
    try:
        return ice.load_table(ident)
    except NoSuchTableError:
        pass
    with contextlib.suppress(NamespaceAlreadyExistsError):  # another site's first publication made it
        ice.create_namespace(namespace(site))
    return ice.create_table(ident, schema=Schema(), location=loc.table(table), properties=TABLE_PROPERTIES)


def _commit(
    ice: IcebergCatalog,
    tbl: IcebergTable,
    loc: SiteLocation,
    state: _SiteState,
    versions: dict[int, SchemaVersion],
    schema: Schema,
    mapping_json: str,
    schema_same: bool,
    snap: Snapshot | None,
    prev: dict[str, str],
) -> SitePublication:
    io, location = tbl.io, tbl.location()
    meta = tbl.metadata
    snapshot_id = meta.new_snapshot_id()
    seq = meta.next_sequence_number()
    current = state.files()
    # files lacking a column the current schema gives a default are listed as filled copies (filled_copies)
    target = state.info.versions.target
    newer = sorted({seg.schema_version for _pf, seg in current.values()} - versions.keys())
    if newer:  # a schema change committed while the state was read (PostgreSQL reads each statement afresh)
        raise SegrepError(f"schema version {newer[0]} appeared during the publication: published at the next one")
    keys = {rel: fill.fill_key(versions[seg.schema_version], target) for rel, (_pf, seg) in current.items()}
    filled = {rel: fill.copy_relpath(state.info.name, rel, key) for rel, key in keys.items() if key is not None}
    uris = {rel: loc.file(filled.get(rel, rel)) for rel in current}
    before = _read_state(io, prev)
    published = None if before is None else before.files
    incremental = (
        snap is not None
        and before is not None
        and published is not None
        and prev.get(_PREFIX + "structure") == state.structure
        and published <= current.keys()
        # every carried file still listed under the same name (a default added since: its copy, listed afresh)
        and {rel: filled[rel] for rel in published if rel in filled} == before.filled
    )
    carried: list[ManifestFile] = list(snap.manifests(io)) if incremental and snap is not None else []
    kind = SnapshotKind.CLEAN
    if incremental:
        kind = SnapshotKind.CONSOLIDATED if len(carried) >= MAX_CARRIED_MANIFESTS else SnapshotKind.INCREMENTAL
    new_files = [rel for rel in current if not incremental or rel not in (published or set())]
    if before is not None and incremental and _disjoint_appends(state, current, new_files):
        # no key of a new file is anywhere else and none is a tombstone: nothing older is hidden, no index read
        unrestricted = [rel for rel in new_files if not _restricted(current[rel][0])]
        rows_out = _candidate_rows(state, [current[r] for r in new_files if r not in unrestricted], set(new_files))[1]
        hidden, after = rows_out, replace(before, unindexed=(*before.unindexed, *new_files), filled=filled)
    else:
        # the new files and those appended without the index so far are resolved against the index's winners
        fold = new_files + (list(before.unindexed) if incremental and before is not None else [])
        rows, outside = _candidate_rows(state, [current[rel] for rel in fold], set(new_files))
        pk = state.info.primary_key
        index = before.index if incremental and before is not None else None
        previous = None if index is None else winners_index.read_previous(io, index, rows, pk)
        res = resolve(None if previous is None else previous.winners, rows, pk)
        hidden = pa.concat_tables([outside, res.hidden]) if outside.num_rows else res.hidden
        stored = winners_index.store(io, location, snapshot_id, index, previous, res.index, pk)
        after = PublishedState(stored, tuple(sorted(current)), (), filled)
    shown = set(before.filled.values()) if before is not None else set()  # copies the current snapshot lists
    added = [_data_file(state, current[rel], uris[rel], keys[rel], filled.get(rel) in shown) for rel in new_files]
    listed, hiding = added, hidden
    if kind is SnapshotKind.CONSOLIDATED:  # from the metadata alone: see _consolidated
        kept, merged = _consolidated(carried)
        old_data, old_hidden = _carried_entries(io, merged, {uri: rel for rel, uri in uris.items()})
        listed, hiding, carried = old_data + added, pa.concat_tables([old_hidden, hidden]), kept
    delete_files = files.position_deletes(io, location, snapshot_id, hiding, uris)
    new_manifests = [
        x
        for x in (
            files.manifest(io, location, schema, snapshot_id, listed, deletes=False),
            files.manifest(io, location, schema, snapshot_id, delete_files, deletes=True),
        )
        if x is not None
    ]
    state_path = files.new_name(location, "segrep", f"state-{snapshot_id}", "json")
    files.write_bytes(io, state_path, after.to_json())
    ml = files.manifest_list(
        io, location, snapshot_id, snap.snapshot_id if snap else None, seq, new_manifests + carried
    )
    summary = Summary(
        Operation.APPEND if kind is SnapshotKind.INCREMENTAL else Operation.OVERWRITE,
        **_summary(state, after.index, state_path, kind, len(added), hidden.num_rows, loc.site),
    )
    snapshot = Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=snap.snapshot_id if snap else None,
        sequence_number=seq,
        manifest_list=ml,
        summary=summary,
        schema_id=schema.schema_id,
    )
    updates: list[TableUpdate] = []
    if not schema_same:
        if schema.schema_id not in {x.schema_id for x in meta.schemas}:
            updates.append(AddSchemaUpdate(schema_=schema))
        updates.append(SetCurrentSchemaUpdate(schema_id=schema.schema_id))
    properties = {**TABLE_PROPERTIES, "schema.name-mapping.default": mapping_json}
    if any(meta.properties.get(k) != v for k, v in properties.items()):
        updates.append(SetPropertiesUpdate(updates=properties))
    updates.append(AddSnapshotUpdate(snapshot=snapshot))
    updates.append(
        SetSnapshotRefUpdate(
            snapshot_id=snapshot_id,
            ref_name=MAIN_BRANCH,
            type=SnapshotRefType.BRANCH,
            max_ref_age_ms=None,
            max_snapshot_age_ms=None,
            min_snapshots_to_keep=None,
        )
    )
    expired = [x.snapshot_id for x in sorted(meta.snapshots, key=lambda x: x.sequence_number or 0)][
        : max(0, len(meta.snapshots) + 1 - KEEP_SNAPSHOTS)
    ]
    if expired:
        updates.append(RemoveSnapshotsUpdate(snapshot_ids=expired))
    requirement = AssertRefSnapshotId(snapshot_id=snap.snapshot_id if snap else None, ref=MAIN_BRANCH)
    faults.point("publish_before_commit")
    # the catalog's conditional update; pyiceberg then deletes metadata files past previous-versions-max
    tbl._do_commit(tuple(updates), (requirement,))
    # an incremental snapshot leaves behind only its expired predecessors' manifest lists and states: collected
    # with the rest when a consolidated or clean one drops the carried manifests (every MAX_CARRIED_MANIFESTS)
    collected = 0
    if kind is not SnapshotKind.INCREMENTAL:
        collected = collect_unreferenced(tbl, state.placements[0].site, state.info.name)
    return SitePublication(
        loc.site,
        PublishStatus.PUBLISHED,
        snapshot_id,
        state.safe_time_us,
        kind=kind,
        files_added=len(added),
        rows_hidden=hidden.num_rows,
        files_collected=collected,
    )


def _consolidated(carried: Sequence[ManifestFile]) -> tuple[list[ManifestFile], list[ManifestFile]]:
    """The carried manifests a consolidated snapshot keeps as they are, and those it merges: the largest data
    manifest (most often a clean snapshot's, listing most of the history) is kept, so consolidating costs the manifests
    added since rather than every file ever listed; every delete manifest is merged. The merged position deletes
    take the new snapshot's sequence number, at or above every data file's (the kept one's are older), so
    each still applies."""
    data = [mf for mf in carried if mf.content == ManifestContent.DATA]
    largest = max(data, key=lambda mf: (_listed(mf), -mf.sequence_number), default=None)  # ties: the oldest
    kept = [] if largest is None else [largest]
    return kept, [mf for mf in carried if mf is not largest]


def _listed(mf: ManifestFile) -> int:
    return (mf.added_files_count or 0) + (mf.existing_files_count or 0)


def _carried_entries(
    io: Any, manifests: Sequence[ManifestFile], listed: dict[str, str]
) -> tuple[list[DataFile], pa.Table]:
    """The data files and the hidden positions (``_file`` relative paths, ``_pos``) the carried manifests list;
    ``listed``: each listed file's URI -> its segment's relative path (a filled copy's too)."""
    data: list[DataFile] = []
    deletes: list[pa.Table] = []
    for mf in manifests:
        for entry in mf.fetch_manifest_entry(io, discard_deleted=True):
            if mf.content == ManifestContent.DATA:
                data.append(entry.data_file)
                continue
            with io.new_input(entry.data_file.file_path).open() as f:
                rows = pq.read_table(f, columns=["file_path", "pos"])
            paths = rows.column("file_path").to_pylist()
            unknown = next((p for p in paths if p not in listed), None)
            if unknown is not None:
                raise SegrepError(
                    f"{entry.data_file.file_path}: a position delete names {unknown}, which the snapshot does not list"
                )
            rels = pa.array([listed[p] for p in paths], pa.string())
            deletes.append(pa.table({FILE_COL: rels, POS_COL: rows.column("pos")}))
    empty = pa.table({FILE_COL: pa.array([], pa.string()), POS_COL: pa.array([], pa.int64())})
    return data, pa.concat_tables([empty, *deletes])


def _data_file(
    state: _SiteState, item: tuple[PlacementFiles, m.Segment], uri: str, key: str | None, listed: bool
) -> DataFile:
    """A listed file's entry: the segment file itself, or its filled copy (made now if it is not there;
    ``listed``: the current snapshot lists that copy)."""
    pf, seg = item
    if key is None:
        return files.data_file(uri, seg.row_count, seg.byte_size)
    copy = fill.filled_copy(pf.site, state.info, seg, key, listed=listed)
    return files.data_file(uri, seg.row_count, copy.byte_size)


def _summary(
    state: _SiteState, index: IndexFiles, state_path: str, kind: SnapshotKind, added: int, hidden: int, site: str
) -> dict[str, str]:
    us = UNKNOWN_SAFE_TIME if state.safe_time_us is None else state.safe_time_us
    safe = (
        "unknown"
        if us == UNKNOWN_SAFE_TIME
        else datetime.fromtimestamp(us / 1e6, UTC).isoformat(timespec="microseconds")
    )
    out = {
        "site": site,
        "safe-time-us": str(us),
        "safe-time": safe,
        "round-id": "" if state.round_id is None else str(state.round_id),
        "leader-epoch": str(state.epoch),
        "schema-version": str(state.info.row.schema_version),
        "fingerprint": state.fingerprint,
        "structure": state.structure,
        "index": index.base,
        "index-deltas": json.dumps(list(index.deltas)),
        "state": state_path,
        "snapshot-kind": str(kind),
        "files-added": str(added),
        "rows-hidden": str(hidden),
    }
    return {_PREFIX + k: v for k, v in out.items()}


@dataclass(frozen=True)
class PublishedState:
    """What a snapshot lists, for the next publication: the winners index and the files it covers, and the
    files appended since without it (each one's keys in no other file, no tombstone: all its rows in range
    are visible, so the index needs them only once a later file may share a key)."""

    index: IndexFiles
    indexed: tuple[str, ...]
    unindexed: tuple[str, ...]
    filled: dict[str, str] = field(default_factory=dict)  # a listed file -> its filled copy (filled_copies)

    @property
    def files(self) -> set[str]:
        return {*self.indexed, *self.unindexed}

    def to_json(self) -> bytes:
        doc = {**self.index.to_doc(), "indexed": list(self.indexed), "unindexed": list(self.unindexed)}
        doc["filled"] = self.filled
        return json.dumps(doc).encode()


def _read_state(io: Any, prev: dict[str, str]) -> PublishedState | None:
    """The previous snapshot's state, or None (a first publication, or a state file that cannot be read: the
    next snapshot is then a clean one)."""
    path = prev.get(_PREFIX + "state")
    if not path:
        return None
    try:
        with io.new_input(path).open() as f:
            doc = json.loads(f.read())
        filled = {str(k): str(v) for k, v in doc.get("filled", {}).items()}  # none before the copies existed
        return PublishedState(IndexFiles.from_doc(doc), tuple(doc["indexed"]), tuple(doc["unindexed"]), filled)
    except (OSError, ValueError, KeyError, TypeError):
        log.warning("publication state %s unreadable: the next snapshot is a clean one", path)
        return None


def _restricted(pf: PlacementFiles) -> bool:
    return pf.key_begin is not None or pf.key_end is not None


def _disjoint_appends(state: _SiteState, current: dict[str, tuple[PlacementFiles, m.Segment]], new: list[str]) -> bool:
    """True if no new file holds a tombstone or a key range that meets another listed file's (the catalog's
    key_min/key_max per segment, compared as the reader compares them): then no row anywhere is superseded."""
    if any(current[rel][1].deleted_rows for rel in new):
        return False
    decode = state.info.decode_primary_key
    spans = sorted(
        (decode(seg.key_min), decode(seg.key_max), rel) for rel, (_pf, seg) in current.items() if seg.row_count
    )
    wanted = set(new)
    highest: tuple[Any, ...] | None = None
    for i, (lo, hi, rel) in enumerate(spans):
        if rel in wanted:
            if highest is not None and lo <= highest:
                return False
            if i + 1 < len(spans) and spans[i + 1][0] <= hi:
                return False
        highest = hi if highest is None or hi > highest else highest
    return True


def _candidate_rows(
    state: _SiteState, chosen: Sequence[tuple[PlacementFiles, m.Segment]], fresh: set[str]
) -> tuple[pa.Table, pa.Table]:
    """The key rows of ``chosen`` files inside their placements' key ranges, and the positions outside them
    of those in ``fresh`` (the others' were hidden when they were first listed). A file two placements read
    (a split's unloading parent) counts once, inside either range."""
    info = state.info
    pk = list(info.primary_key)
    ranges: dict[str, list[KeyRange]] = {}
    for pf in state.placements:
        bounds = (keys.decode(pf.key_begin, info.key_type), keys.decode(pf.key_end, info.key_type))
        for seg in pf.segments:
            ranges.setdefault(seg.relpath, []).append(bounds)
    inside: list[pa.Table] = []
    outside: list[pa.Table] = []
    read = read_in_threads(lambda item: _key_rows(item[0], item[1], pk), chosen)
    for (_pf, seg), key_rows in zip(chosen, read, strict=True):
        rows = positions(seg.relpath, key_rows, pk)
        kept, dropped = out_of_range(rows, info.partition_key, info.key_type, ranges[seg.relpath])
        inside.append(kept)
        if seg.relpath in fresh:
            outside.append(dropped)
    schema = pa.schema([*[info.schema.field(k) for k in pk], *sch.INTERNAL_FIELDS])
    empty = positions("", schema.empty_table(), pk)
    rows_in = pa.concat_tables(inside, promote_options="permissive") if inside else empty
    rows_out = pa.concat_tables(outside) if outside else empty.select(["_file", "_pos"])
    return rows_in, rows_out


def _key_rows(pf: PlacementFiles, seg: m.Segment, pk: list[str]) -> pa.Table:
    """A segment file's key and internal columns, in file order; SegrepError if missing, short or lacking a
    column. Read through ``ParquetFile`` (a third of ``read_table``'s time on a small file, which a long history
    is made of), which returns no column rather than failing for a name the file lacks: checked first."""
    site = pf.site
    site.ensure_identified()
    path = site.path(seg.relpath)
    columns = [*pk, sch.VERSION_COL, sch.ORIGIN_COL, sch.DELETED_COL]
    try:
        with site.fs.open_input_file(path) as f:
            parquet = pq.ParquetFile(f, page_checksum_verification=True)
            lacking = [c for c in columns if c not in parquet.schema_arrow.names]
            if lacking:
                raise SegrepError(f"site {site.name}: segment file {seg.relpath} has no column {', '.join(lacking)}")
            rows = parquet.read(columns=columns)
    except FileNotFoundError:
        raise SegrepError(f"site {site.name}: segment file {seg.relpath} is missing (run `segrep repair`)") from None
    if rows.num_rows != seg.row_count:
        raise SegrepError(
            f"site {site.name}: segment file {seg.relpath} has {rows.num_rows} rows, the catalog says {seg.row_count}"
        )
    return rows
