"""Bootstrap and join: bringing a replica site into a table that already holds data (DESIGN section 7;
the xCluster bootstrap decision tree of seeds 000 and 001).

A replica placement that cannot simply follow the leader carries ``needs_bootstrap``: a new replica site of a
table with data (``segrep apply`` adds it that way) or one that fell out of retention (GC marks it). Rounds
skip such placements. ``bootstrap`` walks the decision tree for each partition:
- new replica, no data at the target: clear the flag; rounds feed it from the leader's newest major segment
  (a follower always fast-forwards a major), then its minors, while writes go on;
- new replica, but the target already holds files of the partition: refused unless the mode says ``adopt``
  (accepted only if those files resolve to exactly the leader's rows; they stay in place and every copy is
  verified on arrival) or ``replace`` (the files are moved aside under ``.replaced/``, never deleted);
- a replica that held data and fell out of retention: it is REMOVED and a new placement (new id, so no ack or
  push of the old one can be mistaken for the new one: EventQL 3.6) joins from the newest major; the site's
  safe time for the table is dropped until it is LIVE again (its readers now see the new placement).
What a joining replica still needs is held from GC (it counts as a replica), and a lease covers each copy.
JOIN_FINALIZE (JOINING -> LIVE) happens in a round's commit once the replica holds the leader's newest segment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import StrEnum

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from segrep.catalog import Catalog, site_identity
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.config.definitions import Definitions
from segrep.core import hlc
from segrep.core.errors import RefusedError, SegrepError
from segrep.core.projection import read_projected
from segrep.core.states import PlacementState
from segrep.data.reader import placement_files, read_placement, resolve
from segrep.storage.site import Site


class Mode(StrEnum):
    AUTO = "auto"
    ADOPT = "adopt"
    REPLACE = "replace"


@dataclass
class BootstrapReport:
    table: str
    site: str
    mode: str
    actions: list[str] = field(default_factory=list)
    joining: list[int] = field(default_factory=list)  # placement ids now fed by rounds

    def lines(self) -> list[str]:
        return [f"bootstrap of {self.table} at {self.site} (mode {self.mode}):", *(f"  {a}" for a in self.actions)]


def partition_files(site: Site, table: str, partition_id: int) -> list[str]:
    """Segment files of one partition directory at a site (relative paths, sorted)."""
    prefix = f"{table}/{partition_id}/"
    return [rel for rel in site.list_segment_files() if rel.startswith(prefix)]


def bootstrap(catalog: Catalog, defs: Definitions, table: str, site: str, mode: str = "auto") -> BootstrapReport:
    """Run the decision tree for every partition of ``table`` at ``site``; all or nothing."""
    try:
        chosen = Mode(mode)
    except ValueError:
        raise SegrepError(f"unknown bootstrap mode {mode!r}: use auto, adopt or replace") from None
    tdef = defs.table(table)
    defs.site(site)
    if site == tdef.leader and len(tdef.leaders) == 0:
        raise RefusedError(
            f"site {site} is the leader of {table}: a bootstrap brings in a replica site (replicas of {table}: "
            f"{', '.join(tdef.replicas) or 'none'})"
        )
    if site not in tdef.sites:
        raise RefusedError(
            f"site {site} is not a replica of {table} in {defs.path}: add it to the table's replicas and run "
            "`segrep apply` first"
        )
    report = BootstrapReport(table, site, str(chosen))
    moves: list[tuple[Site, str]] = []
    refusals: list[str] = []
    with catalog.write() as s:
        info = q.table_info(s, table)
        site_row = q.site_by_name(s, site)
        if site_row.site_uuid is None:  # a site apply recorded without claiming it (it was down then)
            report.actions.append(str(site_identity.claim(s, site_row)))
        storage = site_identity.open_site(s, site_row)
        storage.ensure_identified()  # DOWN/UNIDENTIFIED: refused before any placement changes
        for part in q.partitions_of(s, info, q.WRITABLE_STATES):
            s.get(m.Partition, part.partition_id, with_for_update=True)  # serialises with rounds and GC
            pl = q.placement_at(s, part.partition_id, site_row.site_id)
            pid = part.partition_id
            if pl is None:
                refusals.append(f"partition {pid} has no placement at {site} (run `segrep apply`)")
                continue
            if pl.placement_id == part.leader_placement_id:  # per-partition leaders: it follows the others
                report.actions.append(f"partition {pid}: led by {site}; nothing to bootstrap")
                continue
            if not pl.needs_bootstrap:
                report.actions.append(f"partition {pid}: already replicating ({pl.state}); nothing to do")
                continue
            held = s.scalar(select(m.Segment.entry_id).where(m.Segment.placement_id == pl.placement_id).limit(1))
            if held is not None:
                new = _rejoin(s, part, pl)
                _live_if_nothing_to_copy(s, part, new)
                report.joining.append(new.placement_id)
                report.actions.append(
                    f"partition {pid}: placement {pl.placement_id} fell out of retention; REMOVED, new placement "
                    f"{new.placement_id} joins from the newest major segment"
                )
                continue
            # Files the catalog lists at this site (a removed placement's, e.g. of a site dropped from the
            # replicas and added back) are ours: GC deletes or keeps them. Moving them aside would leave
            # catalog rows pointing at nothing; only files the catalog does not know are the target's data.
            known = set(
                s.scalars(
                    select(m.Segment.relpath)
                    .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
                    .where(m.Placement.site_id == site_row.site_id, m.Placement.partition_id == pid)
                )
            )
            existing = [rel for rel in partition_files(storage, table, pid) if rel not in known]
            if existing and chosen == Mode.AUTO:
                refusals.append(
                    f"{site} already holds {len(existing)} file(s) of {table} partition {pid} under "
                    f"{storage.path(f'{table}/{pid}')}; use --mode adopt (kept if they equal the source) or "
                    "--mode replace (moved aside, not deleted)"
                )
                continue
            if existing and chosen == Mode.ADOPT:
                problem = _adopt_problem(catalog, info, storage, part, existing)
                if problem:
                    refusals.append(f"partition {pid}: cannot adopt the data at {site}: {problem}")
                    continue
                report.actions.append(f"partition {pid}: adopted {len(existing)} file(s) equal to the source")
            if existing and chosen == Mode.REPLACE:
                moves += [(storage, rel) for rel in existing]
                report.actions.append(f"partition {pid}: {len(existing)} existing file(s) moved aside")
            pl.needs_bootstrap = False
            q.reset_watermarks(s, pid)
            _live_if_nothing_to_copy(s, part, pl)
            report.joining.append(pl.placement_id)
            report.actions.append(f"partition {pid}: placement {pl.placement_id} JOINING, fed from the newest major")
        if refusals:
            s.rollback()
            raise RefusedError(f"bootstrap of {table} at {site} refused, nothing changed: " + "; ".join(refusals))
        stamp = hlc.now_us()
        for storage_, rel in moves:  # before the commit: a failure here leaves the catalog unchanged
            _move_aside(storage_, rel, stamp)
    return report


def _rejoin(s: Session, part: m.Partition, old: m.Placement) -> m.Placement:
    old.state = PlacementState.REMOVED
    old.removed_us = hlc.now_us()
    new = m.Placement(
        partition_id=part.partition_id,
        site_id=old.site_id,
        state=PlacementState.JOINING,
        created_us=hlc.now_us(),
        feeder_site_id=old.feeder_site_id,
    )
    s.add(new)
    s.flush()
    q.reset_watermarks(s, part.partition_id)
    # Readers at the site now see the new, empty placement: the site's safe time for the table no longer holds
    # (invariant 4). It is set again by the round that makes the site LIVE, as for a site that joins.
    s.execute(delete(m.SafeTime).where(m.SafeTime.table_id == part.table_id, m.SafeTime.site_id == old.site_id))
    return new


def _live_if_nothing_to_copy(s: Session, part: m.Partition, pl: m.Placement) -> None:
    """JOIN_FINALIZE at once when the leader holds nothing yet (no round would ever look at the partition)."""
    leader = s.get(m.Placement, part.leader_placement_id) if part.leader_placement_id else None
    if leader is not None and leader.root_segment_id is None:
        pl.state = PlacementState.LIVE


def _adopt_problem(
    catalog: Catalog, info: q.TableInfo, storage: Site, part: m.Partition, files: list[str]
) -> str | None:
    """None if the files resolve to exactly the rows the leader's placement resolves to (each file projected to
    the table's target schema version first, as every read does)."""
    versions = info.versions

    def read(rel: str) -> pa.Table:
        with storage.fs.open_input_file(storage.path(rel)) as f:
            parquet = pq.ParquetFile(f)
            return read_projected(parquet.schema_arrow, versions, None, lambda cols: parquet.read(columns=cols))

    try:
        tables = [read(rel) for rel in files]
        theirs = resolve(pa.concat_tables(tables, promote_options="permissive"), info.primary_key)
    except (pa.ArrowInvalid, OSError, SegrepError) as exc:
        return f"its files cannot be read: {exc}"
    _, placements = placement_files(catalog, info.name)
    pf = next(p for p in placements if p.partition_id == part.partition_id)
    ours = read_placement(info, pf)
    key = [(k, "ascending") for k in info.primary_key]
    theirs = theirs.select(ours.column_names).cast(ours.schema).sort_by(key)
    if not theirs.equals(ours.sort_by(key)):
        return f"its rows differ from the source ({theirs.num_rows} rows there, {ours.num_rows} at the leader)"
    return None


def _move_aside(storage: Site, rel: str, stamp: int) -> None:
    target = f".replaced/{stamp}/{rel}"
    if storage.local:
        os.makedirs(os.path.dirname(storage.path(target)), exist_ok=True)
        os.rename(storage.path(rel), storage.path(target))
    else:
        storage.fs.create_dir(os.path.dirname(storage.path(target)), recursive=True)
        storage.fs.move(storage.path(rel), storage.path(target))
