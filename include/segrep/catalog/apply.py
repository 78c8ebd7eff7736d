"""``segrep apply``: bring the catalog in line with the definitions file, idempotently.

All changes are made in one transaction; ``--dry-run`` runs the very same code and rolls back, so what it
prints is exactly what a real run would do. Changes that would lose data or break chains are refused with
a message that says what to do instead: dropping a table that holds segments, changing the key or split
points of a table with data, changing a site's id, or moving a site that holds files.

Column changes make the table's next schema version (``core.schema_changes``: add, soft drop, rename, widen,
reorder; one version per apply, recorded with what changed); a change that could misread the files is
refused, naming the column and the way out (a table without segments is created again instead).

Before anything changes, every site's store is probed (:mod:`segrep.storage.probe`): a real run writes,
reads back and deletes a probe object under each root; a dry run only looks, so it writes nothing anywhere.
A store that cannot be used, or does not answer in time, is refused by name.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from segrep.catalog import Catalog, schemas, site_identity
from segrep.catalog import leases as ls
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.config.definitions import Definitions, SiteDef, TableDef
from segrep.config.locations import redact_uri
from segrep.core import hlc, keys
from segrep.core import schema as sch
from segrep.core.errors import RefusedError
from segrep.core.schema_changes import SchemaChange, SchemaChangeRefused, plan_schema_change
from segrep.core.schema_versions import Column, SchemaVersion, first_version
from segrep.core.states import PartitionState, PlacementState
from segrep.storage.identity import IdentityProblem
from segrep.storage.probe import check_sites


@dataclass(frozen=True)
class Change:
    verb: str  # add, change, remove
    what: str

    def __str__(self) -> str:
        return f"{self.verb:<7} {self.what}"


class _DryRun(Exception):
    pass


def apply_definitions(
    catalog: Catalog, defs: Definitions, *, dry_run: bool = False, unprobed: set[str] | None = None
) -> list[Change]:
    """Bring the catalog in line with ``defs`` (or, with ``dry_run``, say what that would change). The sites
    named in ``unprobed`` (known to be down: a lost region being recovered from) are not probed."""
    skip = unprobed or set()
    probed = [sdef for sdef in defs.sites.values() if sdef.name not in skip]
    check_sites(probed, write=not dry_run)  # before the write transaction: a probe may take time
    changes: list[Change] = []
    try:
        with catalog.write() as s:
            _sync_sites(s, defs, changes)
            for tdef in defs.tables.values():
                _sync_table(s, tdef, changes)
            _drop_undefined_tables(s, defs, changes)
            _drop_undefined_sites(s, defs, changes)
            _identify_sites(s, defs, skip, changes, dry_run=dry_run)
            if dry_run:
                raise _DryRun
    except _DryRun:
        pass
    return changes


def _sync_sites(s: Session, defs: Definitions, changes: list[Change]) -> None:
    existing = {site.name: site for site in s.scalars(select(m.Site))}
    by_id = {site.site_id: site for site in existing.values()}
    for sdef in defs.sites.values():
        row = existing.get(sdef.name)
        if row is None:
            other = by_id.get(sdef.site_id)
            if other is not None:
                raise RefusedError(
                    f"site {sdef.name}: id {sdef.site_id} belongs to site {other.name} in the catalog; "
                    "site ids are stamped on rows and cannot be reused"
                )
            s.add(m.Site(site_id=sdef.site_id, name=sdef.name, uri=sdef.uri, created_us=hlc.now_us()))
            changes.append(Change("add", f"site {sdef.name} (id {sdef.site_id}) at {sdef.uri}"))
            continue
        if row.site_id != sdef.site_id:
            raise RefusedError(
                f"site {sdef.name}: id is {row.site_id} in the catalog, {sdef.site_id} in the definitions; "
                "site ids are stamped on rows and cannot change"
            )
        if row.uri != sdef.uri:
            _refuse_if_site_has_segments(s, row, sdef)
            row.uri = sdef.uri
            row.site_uuid = None  # the new root is claimed below, as a new site's is
            changes.append(Change("change", f"site {sdef.name} uri to {sdef.uri}"))
    s.flush()


def _identify_sites(s: Session, defs: Definitions, down: set[str], changes: list[Change], *, dry_run: bool) -> None:
    """Claim every defined site not claimed yet (write its identity marker, creating a new root), and name
    every claimed site whose root is missing or foreign: it is DOWN/UNIDENTIFIED, and apply never creates
    anything in its place. A site named ``--site-down`` is not looked at; one never claimed whose root is
    missing while the catalog lists segments there is not claimed either (its volume may be unmounted)."""
    for row in s.scalars(select(m.Site).where(m.Site.name.in_(list(defs.sites))).order_by(m.Site.name)):
        if row.name in down:
            continue
        expected = site_identity.expected_identity(s, row)
        check = site_identity.check_site(s, row)
        if expected is not None:
            if not check.ok:
                changes.append(Change("down", f"{check.detail}"))
            continue
        held = q.segment_count_at_site(s, row.site_id)
        if held and check.problem is IdentityProblem.NO_ROOT:
            changes.append(
                Change(
                    "down",
                    f"site {row.name}: its root is missing while the catalog lists {held} segment(s) "
                    f"there; not claimed (`segrep site adopt {row.name}` once it is back or replaced)",
                )
            )
            continue
        if check.found is not None and check.found.catalog_uuid != site_identity.catalog_uuid(s):
            changes.append(
                Change(
                    "down",
                    f"site {row.name}: its root holds the marker of {check.found.describe()}, not claimed; "
                    f"`segrep catalog rebuild --site {row.name}` claims it with its files",
                )
            )
            continue
        claimed = site_identity.claim(s, row, dry_run=dry_run)
        if claimed.result is not site_identity.ClaimResult.KEPT:
            changes.append(Change("claim", str(claimed)))


def _refuse_if_site_has_segments(s: Session, row: m.Site, sdef: SiteDef) -> None:
    n = q.segment_count_at_site(s, row.site_id)
    if n:
        raise RefusedError(
            f"site {sdef.name}: cannot move it from {redact_uri(row.uri)} to {sdef.uri} while the catalog references "
            f"{n} segment(s) there; move the files and rebuild, or keep the old uri"
        )


def _sync_table(s: Session, tdef: TableDef, changes: list[Change]) -> None:
    row = s.scalars(select(m.Table).where(m.Table.name == tdef.name)).one_or_none()
    if row is None:
        _create_table(s, tdef, changes)
        return
    info = q.TableInfo.of(s, row)
    has_data = q.segment_count(s, row.table_id) > 0
    differences = _shape_differences(s, info, tdef)
    try:
        evolution = _schema_change(s, row, tdef)
    except SchemaChangeRefused as exc:
        if has_data or not exc.recreate_ok:
            raise
        differences.insert(0, "columns")  # no segment to misread: the table is created again
        evolution = None
    if differences:
        if has_data:
            raise RefusedError(
                f"table {tdef.name} holds data; refusing to change its {', '.join(differences)} "
                "(that would orphan or misread its segments). Define a new table and copy the rows with "
                f"`segrep table rewrite {tdef.name} --into NEW_TABLE`, or use `segrep split` for new partitions"
            )
        _drop_table(s, row)
        _create_table(s, tdef, changes, verb="change", why=", ".join(differences))
        return
    if evolution is not None:
        schemas.record_version(s, row, evolution.version, evolution.text, evolution.next_field_id)
        changes.append(
            Change(
                "change",
                f"table {tdef.name}: schema v{evolution.version.version - 1} -> v{evolution.version.version}: "
                f"{evolution.text}",
            )
        )
    _sync_placements(s, info, tdef, has_data, changes)
    if row.writes != tdef.writes:
        changes.append(Change("change", f"table {tdef.name} writes from {row.writes} to {tdef.writes}"))
        row.writes = tdef.writes


def _schema_change(s: Session, row: m.Table, tdef: TableDef) -> SchemaChange | None:
    """The table's next schema version from the definitions' columns (None: the columns are unchanged)."""
    history = [e.schema for e in schemas.schema_history(s, row.table_id)]
    current = next(v for v in history if v.version == row.schema_version)
    return plan_schema_change(
        tdef.name,
        current,
        tdef.column_specs,
        key_columns=[*row.primary_key, row.partition_key],
        history=history,
        next_field_id=row.next_field_id,
    )


def _shape_differences(s: Session, info: q.TableInfo, tdef: TableDef) -> list[str]:
    out = []
    if list(tdef.primary_key) != list(info.row.primary_key):
        out.append("primary key")
    if tdef.partition_key != info.row.partition_key:
        out.append("partition key")
    initial = [
        p for p in q.partitions_of(s, info) if p.parent_partition_id is None and p.begin_key is not None
    ]  # the partitions created from split_points (splits add children later)
    if [info.decode_key(p.begin_key) for p in initial] != list(tdef.split_points):
        out.append("split points")
    # Each initial partition's leader site (from `leader` and `leaders`) against the catalog's
    site_ids = {row.name: row.site_id for row in s.scalars(select(m.Site))}
    expected = {
        p.partition_id: site_ids.get(tdef.leader_of(i))
        for i, p in enumerate(q.partitions_of(s, info))
        if p.parent_partition_id is None
    }
    actual = dict(
        s.execute(
            select(m.Partition.partition_id, m.Placement.site_id)
            .join(m.Placement, m.Partition.leader_placement_id == m.Placement.placement_id)
            .where(m.Partition.table_id == info.table_id, m.Partition.parent_partition_id.is_(None))
        ).all()
    )
    moved = {pid for pid, site_id in actual.items() if expected.get(pid) != site_id}
    if moved:
        # After `segrep failover`/`switchover` the catalog owns the leader: the definitions keep naming the
        # site the table started at, and stay valid while the leaders are among the table's sites.
        sites = {site_ids[name] for name in tdef.sites if name in site_ids}
        if q.last_failover(s, info.table_id) is None or not {actual[p] for p in moved} <= sites:
            out.append("leader site (a leader change is a failover, not a definition change: segrep failover)")
    return out


def _create_table(s: Session, tdef: TableDef, changes: list[Change], verb: str = "add", why: str = "") -> None:
    now = hlc.now_us()
    # version 1: ids 1..n in column order (``first_version``), with the defaults the definitions give (they
    # must stay as given: a default is what rows written before its column read as)
    ids = first_version([(c.name, c.type) for c in tdef.column_specs])
    first = SchemaVersion(
        ids.version,
        tuple(
            Column(col.field_id, col.name, col.type, spec.default)
            for col, spec in zip(ids.columns, tdef.column_specs, strict=True)
        ),
    )
    row = m.Table(
        name=tdef.name,
        columns=sch.schema_to_columns(tdef.schema),
        primary_key=list(tdef.primary_key),
        partition_key=tdef.partition_key,
        schema_fingerprint=tdef.fingerprint,
        created_us=now,
        writes=tdef.writes,
        schema_version=first.version,
        next_field_id=len(first.columns) + 1,
    )
    s.add(row)
    s.flush()
    schemas.record_version(s, row, first, "created", len(first.columns) + 1)
    bounds = [None, *tdef.split_points, None]
    for index, (begin, end) in enumerate(itertools.pairwise(bounds)):
        part = m.Partition(
            table_id=row.table_id,
            begin_key=keys.encode(begin),
            end_key=keys.encode(end),
            state=PartitionState.LIVE,
            epoch=1,
            last_version=0,
            created_us=now,
        )
        s.add(part)
        s.flush()
        for site_name in tdef.sites:
            pl = _add_placement(s, part, site_name, PlacementState.LIVE)
            if site_name == tdef.leader_of(index):
                part.leader_placement_id = pl.placement_id
            pl.feeder_site_id = _feeder_id(s, tdef, site_name)
    s.flush()
    detail = f" ({why})" if why else ""
    changes.append(
        Change(
            verb,
            f"table {tdef.name}{detail}: {len(tdef.schema)} columns, key ({', '.join(tdef.primary_key)}), "
            f"{len(bounds) - 1} partition(s), leader {tdef.leader}, replicas {', '.join(tdef.replicas) or 'none'}"
            + _topology(tdef),
        )
    )


def _topology(tdef: TableDef) -> str:
    """What the definitions add to broadcast from one leader, for the change line."""
    parts = [f", partition {i} led by {site}" for i, site in sorted(tdef.leaders.items())]
    parts += [f", {site} fed from {feeder}" for site, feeder in sorted(tdef.feeders.items())]
    if tdef.writes != "leader":
        parts.append(f", writes at {tdef.writes}")
    return "".join(parts)


def _feeder_id(s: Session, tdef: TableDef, site_name: str) -> int | None:
    feeder = tdef.feeders.get(site_name)
    return None if feeder is None else q.site_by_name(s, feeder).site_id


def _add_placement(s: Session, part: m.Partition, site_name: str, state: str) -> m.Placement:
    site = q.site_by_name(s, site_name)
    q.reset_watermarks(s, part.partition_id)  # a new replica makes every entry of the partition relevant again
    pl = m.Placement(partition_id=part.partition_id, site_id=site.site_id, state=state, created_us=hlc.now_us())
    s.add(pl)
    s.flush()
    return pl


def _sync_placements(s: Session, info: q.TableInfo, tdef: TableDef, has_data: bool, changes: list[Change]) -> None:
    """Add placements for new replica sites (JOINING when the table holds data: a bootstrap feeds them);
    mark those of replica sites no longer listed as REMOVED (their files stay on the site)."""
    parts = q.partitions_of(s, info, q.WRITABLE_STATES)
    placements = q.active_placements(s, [p.partition_id for p in parts])
    sites = q.sites_by_id(s)
    wanted = set(tdef.sites)  # after a failover the leader may be a listed replica and `leader:` a follower
    for part in parts:
        here = {sites[pl.site_id].name: pl for pl in placements if pl.partition_id == part.partition_id}
        for site_name in sorted(wanted - set(here)):
            pl = _add_placement(s, part, site_name, PlacementState.JOINING if has_data else PlacementState.LIVE)
            pl.needs_bootstrap = has_data  # rounds wait for `segrep bootstrap`, which checks the target first
        for site_name, pl in here.items():
            if site_name not in wanted and pl.placement_id != part.leader_placement_id:
                pl.state = PlacementState.REMOVED
                pl.removed_us = hlc.now_us()
    feeders_changed: set[str] = set()
    for pl in q.active_placements(s, [p.partition_id for p in parts]):
        name = sites[pl.site_id].name
        feeder = _feeder_id(s, tdef, name) if name in wanted else None
        if pl.feeder_site_id != feeder:
            pl.feeder_site_id, pl.feeder_fallback_us = feeder, None
            feeders_changed.add(name)
    for name in sorted(feeders_changed & wanted):
        source = tdef.feeders.get(name) or "the leader"
        changes.append(Change("change", f"replica {name} of table {tdef.name} fed from {source}"))
    present = {sites[pl.site_id].name for pl in placements}
    for site_name in sorted(wanted - present):
        state = f"JOINING: run `segrep bootstrap {tdef.name} {site_name}`" if has_data else "LIVE"
        changes.append(Change("add", f"replica {site_name} of table {tdef.name} ({state})"))
    for site_name in sorted(present - wanted):
        changes.append(Change("remove", f"replica {site_name} of table {tdef.name} (its files stay on the site)"))


def _drop_undefined_tables(s: Session, defs: Definitions, changes: list[Change]) -> None:
    for row in s.scalars(select(m.Table).where(m.Table.name.not_in(list(defs.tables)))).all():
        n = q.segment_count(s, row.table_id)
        if n:
            raise RefusedError(
                f"table {row.name} is not in the definitions but holds {n} segment(s); refusing to drop a "
                "table with rows. Put it back in the definitions file"
            )
        _drop_table(s, row)
        changes.append(Change("remove", f"table {row.name} (it held no segments)"))


def _drop_table(s: Session, row: m.Table) -> None:
    part_ids = select(m.Partition.partition_id).where(m.Partition.table_id == row.table_id)
    pl_ids = select(m.Placement.placement_id).where(m.Placement.partition_id.in_(part_ids))
    s.execute(update(m.Partition).where(m.Partition.table_id == row.table_id).values(leader_placement_id=None))
    ls.drop_acks(s, targets=pl_ids)
    s.execute(
        delete(m.Checkpoint).where(m.Checkpoint.partition_id.in_(part_ids)).execution_options(synchronize_session=False)
    )
    ls.drop_leases(s, targets=pl_ids)
    for model, cond in (
        (m.Placement, m.Placement.partition_id.in_(part_ids)),
        (m.Split, m.Split.table_id == row.table_id),
        (m.Partition, m.Partition.table_id == row.table_id),
        (m.SafeTime, m.SafeTime.table_id == row.table_id),
        (m.PublicationRow, m.PublicationRow.table_id == row.table_id),
        (m.Round, m.Round.table_id == row.table_id),
        (m.SchemaVersionRow, m.SchemaVersionRow.table_id == row.table_id),
    ):
        s.execute(delete(model).where(cond).execution_options(synchronize_session=False))
    s.delete(row)
    s.flush()


def _drop_undefined_sites(s: Session, defs: Definitions, changes: list[Change]) -> None:
    for row in s.scalars(select(m.Site).where(m.Site.name.not_in(list(defs.sites)))).all():
        active = s.scalar(
            select(func.count())
            .select_from(m.Placement)
            .where(m.Placement.site_id == row.site_id, m.Placement.removed_us.is_(None))
        )
        if active:
            raise RefusedError(
                f"site {row.name} is not in the definitions but holds {active} placement(s); remove it from "
                "every table's replicas first"
            )
        referenced = s.scalar(select(func.count()).select_from(m.Placement).where(m.Placement.site_id == row.site_id))
        if referenced:
            continue  # history of removed placements refers to it; it stays, unused
        s.delete(row)
        changes.append(Change("remove", f"site {row.name} (it held no placements)"))
