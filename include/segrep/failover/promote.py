"""Unplanned failover (DESIGN section 11): move each listed table's leadership to another site, one
transaction per table, raising every moved partition's epoch, and record what the new leader lacked.

Only the catalog changes, so it works while the old leader's site is unreachable. Fencing comes from the
epoch: every commit at a leader (a writer's root move, a merge or major commit, a fast-forward's
registration, split finalize) is conditional on the partition's leader placement and epoch, so a writer or a
round of the old epoch that commits afterwards fails its conditional update; what it wrote is an orphan GC
removes. Writers and rounds read the leader from the catalog, so they follow without a definitions change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.snapshot import REPLICATING_STATES
from segrep.catalog.sql import rowcount
from segrep.config.definitions import Definitions
from segrep.core import faults, hlc
from segrep.core.errors import ConflictError, NotFoundError, RefusedError, SegrepError
from segrep.failover.assess import Assessment, assess, assess_view, read_view
from segrep.failover.cut import CutReport, assess_cut, common_safe_time, cut_table
from segrep.publish.outcome import Publication
from segrep.replication.publication import publish
from segrep.spark import launch
from segrep.spark.launch import Submit
from segrep.storage.probe import SiteUnusableError, check_sites


class Cut(StrEnum):
    """Which rows the new leader keeps: everything it holds (``latest``), or the rows as of the listed
    tables' smallest safe time at the new site (``safe-time``; the newer ones set aside, see ``cut``)."""

    LATEST = "latest"
    SAFE_TIME = "safe-time"


class MoveKind(StrEnum):
    FAILOVER = "failover"
    SWITCHOVER = "switchover"


@dataclass(frozen=True)
class Move:
    """One table's leader move, as assessed (dry run) or as committed (``failover_id`` set). ``on_return``: what
    the loss becomes when the sites holding it return (``rollback``: set aside in their rollback areas;
    ``merge``: pushed to the new leader and merged), as the move records it."""

    assessment: Assessment
    partitions_moved: int
    failover_id: int | None
    on_return: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FailoverReport:
    kind: MoveKind
    dry_run: bool
    cut: Cut
    to_site: str
    moves: list[Move]
    cut_us: int | None = None  # --at safe-time: the instant every listed table was cut at
    cuts: list[CutReport] = field(default_factory=list)  # --at safe-time: what each table's cut set aside (or would)
    # each site's Iceberg publication after the move (tables whose policy says ``publish: iceberg``)
    published: list[Publication] = field(default_factory=list)

    def __str__(self) -> str:
        """What a failover or switchover did (or, dry run, would do): per table the site chosen and why, every
        candidate, and the loss (the RPO) partition by partition, exact from the catalog."""
        lines = []
        for move in self.moves:
            lines += self._move_lines(move)
        if self.cut_us is not None:
            lines.append(f"cut at {hlc.iso(self.cut_us)} (the smallest safe time of these tables at {self.to_site})")
            for cut in self.cuts:
                if self.dry_run:
                    lines.append(
                        f"  {cut.table}: {cut.partitions_cut} partition(s) would be folded as of the cut, "
                        f"{cut.rows_set_aside:,} newer row(s) set aside at {self.to_site}"
                    )
                else:
                    where = ", ".join(cut.rollback_files) or "-"
                    lines.append(
                        f"  {cut.table}: {cut.partitions_cut} partition(s) folded as of the cut, "
                        f"{cut.rows_set_aside:,} newer row(s) set aside ({where})"
                    )
                lines += [
                    f"    partition {p.partition_id}: {p.rows:,} row(s) from {len(p.segment_ids)} segment(s)"
                    for p in cut.partitions
                ]
        lines += [f"{pub.table}: {x.line()}" for pub in self.published for x in pub.sites]
        return "\n".join(lines)

    def _move_lines(self, move: Move) -> list[str]:
        a = move.assessment
        head = f"{self.kind} of {a.table}: {a.from_site} -> {a.to_site}, at {self.cut}"
        if self.dry_run:
            head += " (dry run: nothing changed)"
        else:
            head += f": {move.partitions_moved} partition(s) moved, epochs raised (failover id {move.failover_id})"
        lines = [head, f"  why {a.to_site}: {a.reason}"]
        for c in a.candidates:
            verdict = "can lead" if c.eligible else f"cannot lead: {c.why_not}"
            lines.append(f"  candidate {c.site}: holds {c.rows_held:,} rows, lacks {c.rows_lacking:,} ({verdict})")
        total = a.total_loss()
        if total is None:
            lines.append(f"  loss: none ({a.to_site} holds every segment of the leaders' chains)")
            return lines
        would = "would be " if self.dry_run else ""
        lines.append(f"  loss ({would}given up): {total.summary()}")
        lines += [f"    partition {x.partition_id}: {x.summary()}" for x in a.loss]
        if move.on_return == "rollback":
            fate = "set aside in the rollback area of each site holding them, when it returns"
            fate += " (after a cut, whatever the table's policy)" if self.cut_us is not None else ""
        else:
            fate = f"pushed to {a.to_site} and merged (last writer wins) when the sites holding them return"
        lines.append(f"  on return ({move.on_return}): these rows {would or 'are '}{fate}")
        if total.rows_at_most:
            lines.append(
                f"  (at most: a lost major or merge output folds segments {a.to_site} holds already; their rows in "
                "it are counted, though not lost)"
            )
        return lines

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_site(catalog: Catalog, tables: Sequence[str]) -> tuple[str, str]:
    """The site every listed table could fail over to that holds the most of their rows (one site for all,
    so the promoted tables stay together; ties by site id), and why."""
    held: dict[str, int] = {}
    with catalog.read() as s:
        per_table = [assess(s, table).candidates for table in tables]
    eligible = set.intersection(*({c.site for c in cands if c.eligible} for cands in per_table))
    if not eligible:
        raise RefusedError(f"no site can lead all of {', '.join(tables)}; name one with --to")
    ids = {}
    for cands in per_table:
        for c in cands:
            if c.site in eligible:
                held[c.site] = held.get(c.site, 0) + c.rows_held
                ids[c.site] = c.site_id
    site = max(eligible, key=lambda name: (held[name], -ids[name]))
    others = ", ".join(f"{name} {held[name]:,}" for name in sorted(eligible) if name != site)
    why = f"{site} is the most advanced live replica of {', '.join(tables)} ({held[site]:,} rows held"
    return site, why + (f"; others: {others}; ties go to the lower site id)" if others else ")")


def failover(
    catalog: Catalog,
    defs: Definitions,
    tables: Sequence[str],
    *,
    to: str | None = None,
    cut: Cut = Cut.LATEST,
    dry_run: bool = False,
    kind: MoveKind = MoveKind.FAILOVER,
    submit: Submit = launch.submit,
) -> FailoverReport:
    """Assess (``dry_run``) or make the move of every listed table to ``to`` (default: see
    :func:`choose_site`). Each table moves in its own transaction, assessed again inside it under the
    partitions' row locks, so the recorded loss is exactly what the move gave up. ``--at safe-time``: the cut
    follows the moves; a dry run reports what it would set aside (``cut.assess_cut``, reading the new
    leader's files), as it reports the loss."""
    if not tables:
        raise SegrepError("name at least one table to fail over")
    wanted = list(dict.fromkeys(tables))
    with catalog.read() as s:
        for table in wanted:
            q.table_info(s, table)  # NotFoundError naming an unknown table, before anything changes
    site, why = (to, None) if to is not None else choose_site(catalog, wanted)
    cut_us = None
    if cut == Cut.SAFE_TIME:
        with catalog.read() as s:
            cut_us = common_safe_time(s, wanted, site)
        _check_cut_site(defs, site, dry_run=dry_run)
    moves = []
    for table in wanted:
        on_return = on_return_of(defs, table, cut)
        if dry_run:
            with catalog.read() as s:
                a = assess(s, table, site, chosen_because=why, cut_us=cut_us)
            moves.append(Move(a, len(a.moving), None, on_return))
            continue
        with catalog.write() as s:
            moves.append(promote_table(s, table, site, cut, kind, why, on_return, cut_us=cut_us))
        faults.point("failover_between_tables")
    cuts = []
    if cut_us is not None:
        for move in moves:
            table = move.assessment.table
            if dry_run:  # what the cut below would set aside, chosen by the same functions
                cuts.append(assess_cut(catalog, table, site, cut_us))
                continue
            assert move.failover_id is not None
            cuts.append(cut_table(catalog, defs, table, site, cut_us, move.failover_id, submit))
    published = [] if dry_run else [publish(catalog, defs, table) for table in wanted]
    return FailoverReport(kind, dry_run, cut, site, moves, cut_us, cuts, published)


def on_return_of(defs: Definitions, table: str, cut: Cut) -> str:
    """What a move of ``table`` records for its loss's return: the table's policy, except after a cut. There,
    what the old leader alone holds is newer than the cut (the new site held everything up to it): merging it
    back would undo the cut, so it is set aside whatever the policy says; so are the forks other sites hold
    past the cut (``assess._forks_past``), given up with it."""
    return "rollback" if cut == Cut.SAFE_TIME else defs.policy(table).on_return


def _check_cut_site(defs: Definitions, site: str, *, dry_run: bool) -> None:
    """A cut reads the new leader's segments and writes its rollback files and majors there, after the move
    has paused writes: a store that cannot be used there refuses the failover before anything changes, instead
    of leaving writes paused behind a cut that failed (a dry run only looks at the store)."""
    try:
        check_sites([defs.site(site)], write=not dry_run)
    except SiteUnusableError as exc:
        raise RefusedError(f"cannot cut at the safe time on {site}: {exc}; nothing changed") from None


def promote_table(
    s: Session,
    table: str,
    site: str,
    cut: Cut,
    kind: MoveKind,
    why: str | None,
    on_return: str,
    *,
    cut_us: int | None = None,
) -> Move:
    """In the caller's transaction: lock the table's partitions, assess under the locks, move every leader
    to ``site`` raising its epoch, lift a switchover's pause, and record the move with its loss."""
    info = q.table_info(s, table)
    to = q.site_by_name(s, site)
    # the partitions and placements as tuples, read once under the partitions' row locks (taken in id order):
    # the assessment and the move both work from them, so nothing commits at these leaders meanwhile
    view = read_view(s, info, lock=True)
    a = assess_view(view, site, chosen_because=why, cut_us=cut_us)
    leaders = {pl.placement_id: pl for pl in view.placements}
    at_site = {pl.partition_id: pl for pl in view.placements if pl.site_id == to.site_id}
    from_ids = set()
    moved = 0
    now = hlc.now_us()
    # a switchover's pause ends with its promotion (on every partition: a split parent in UNLOAD too); a cut
    # at a safe time pauses writes until its fold is committed (``cut.cut_table`` lifts it)
    s.execute(
        update(m.Partition)
        .where(m.Partition.table_id == info.table_id)
        .values(paused_us=None if cut_us is None else hlc.now_us())
        .execution_options(synchronize_session=False)
    )
    moves: list[dict[str, int]] = []
    for part in view.rows:
        current = leaders.get(part.leader_placement_id or -1)
        if current is not None and current.site_id == to.site_id:
            continue
        target = at_site.get(part.partition_id)
        if target is None:
            raise NotFoundError(f"table {table}: partition {part.partition_id} has no placement at {site}")
        if current is not None:
            from_ids.add(current.site_id)
        moves.append({"pid": part.partition_id, "leader": target.placement_id, "epoch": part.epoch + 1})
        moved += 1
    if moves:
        # One UPDATE ... FROM for the whole table (not a statement per partition): every partition the view
        # moves, and only those (the same conditions, under the row locks), gets the site's placement as its
        # leader and its epoch raised by one.
        p, pl = m.Partition, m.Placement
        res = s.execute(
            update(p)
            .where(
                p.table_id == info.table_id,
                p.state.in_([str(x) for x in REPLICATING_STATES]),
                p.leader_placement_id.is_not(None),
                pl.partition_id == p.partition_id,
                pl.site_id == to.site_id,
                pl.removed_us.is_(None),
                p.leader_placement_id != pl.placement_id,
            )
            .values(leader_placement_id=pl.placement_id, epoch=p.epoch + 1)
            .execution_options(synchronize_session=False)
        )
        if rowcount(res) != len(moves):
            raise ConflictError(f"table {table}: {rowcount(res)} of {len(moves)} partitions moved; nothing changed")
        s.expire_all()  # a Partition the session holds no longer holds its leader and epoch
    if not moved:
        raise RefusedError(f"table {table}: site {site} leads every partition already")
    faults.point("failover_before_commit")
    record = m.Failover(
        table_id=info.table_id,
        kind=str(kind),
        from_site_id=min(from_ids) if from_ids else to.site_id,
        to_site_id=to.site_id,
        cut=str(cut),
        cut_us=cut_us,
        on_return=on_return,
        loss=[x.to_dict() for x in a.loss],
        done_us=now,
    )
    s.add(record)
    s.flush()
    return Move(a, moved, record.failover_id, on_return)
