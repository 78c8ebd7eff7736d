"""``segrep repair``: mend what ``verify`` finds (DESIGN section 13).

- First the leader, from its replicas (``maintenance.union``, the union rule): a segment a replica holds that
  the leader lacks is fetched back to the leader where it makes its chain whole, or left to the next round's
  merge (a fork); a replica holding what the leader lacks is never re-bootstrapped from it.
- A missing, damaged or divergent copy of a segment is fetched again from any holder whose file hashes to the
  segment's facts (the leader's catalog row where the leader lists the segment, else the copy's own): a
  segment's bytes are the same at every site, so the sha256 decides, and the leader's own copy is mended from
  a replica's the same way. The copy is verified before it replaces anything (``storage.transfer``: temporary
  name, hashed, fsynced, renamed only if size and sha256 match). A divergent copy's catalog row is set back to
  the leader's facts for the segment, conditionally, in one transaction.
- A segment with no intact copy anywhere is LOST: reported with its rows and version range; nothing is deleted.
- A replica whose rows still differ from the leader's once every file is intact holds a chain the protocol
  cannot mend by itself: its placement is re-bootstrapped (``maintenance.bootstrap``: a new placement joins
  from the leader's newest major segment; the old one's files stay until GC) and caught up by rounds.
  Mending with a segment of the leader's rows written at the replica is not done: the leader does not hold
  such a segment, so the protocol takes it for a fork (pushed back, merged on Spark, the replica then stuck
  until a new major), and rows that keep their versions tie with the rows they should replace under LWW.

``dry_run`` reads and hashes but changes nothing: no copy, no catalog row, no record.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import update

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.link_lease import LinkLimits, LinkPacing, unlimited
from segrep.catalog.link_limits import limits_or_definitions
from segrep.catalog.sql import rowcount
from segrep.catalog.verifications import FileCheckResult, record_file_checks
from segrep.config.definitions import Definitions
from segrep.core import hlc
from segrep.core.errors import ConflictError
from segrep.core.links import CopyPriority
from segrep.maintenance.bootstrap import bootstrap
from segrep.maintenance.scrub import FileProblem, SegmentCopy, check_copy, leader_facts, segment_copies
from segrep.maintenance.union import LeaderLack, mend_leaders
from segrep.maintenance.verify import RowCheck, Scope, Verdict, VerifyReport, compare_rows, scope_of, verify
from segrep.replication.join import catch_up
from segrep.spark import launch
from segrep.spark.launch import Submit
from segrep.storage.atomic import FileFacts
from segrep.storage.pacing import Pacer
from segrep.storage.transfer import copy_verified

# The entry fields of a segment row: equal in every copy of one segment id (both digests: every read checks
# the file's bytes by one of them).
_ENTRY_FIELDS = (
    "byte_size",
    "sha256",
    "crc64nvme",
    "row_count",
    "deleted_rows",
    "min_version",
    "max_version",
    "key_min",
    "key_max",
    "base_segment_id",
    "included_segment_ids",
    "is_major",
    "origin_site_id",
    "epoch",
    "schema_fingerprint",
    "schema_version",
)


@dataclass(frozen=True)
class FileRepair:
    problem: FileProblem
    source: str  # the site whose verified copy replaced it
    catalog_fixed: bool  # the copy's catalog row was set back to the leader's facts

    def to_dict(self) -> dict[str, Any]:
        return {"problem": self.problem.to_dict(), "source": self.source, "catalog_fixed": self.catalog_fixed}


@dataclass(frozen=True)
class LostSegment:
    """A segment with no intact copy at any site: its rows are gone unless a copy is found elsewhere."""

    partition_id: int
    segment_id: str
    sites: tuple[str, ...]
    row_count: int
    deleted_rows: int
    min_version: int
    max_version: int
    problems: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "sites": list(self.sites), "problems": list(self.problems)}


@dataclass
class RepairReport:
    table: str
    dry_run: bool
    files: list[FileRepair] = field(default_factory=list)
    lost: list[LostSegment] = field(default_factory=list)
    rebootstraps: list[RowCheck] = field(default_factory=list)
    unmended: list[RowCheck] = field(default_factory=list)  # row checks repair could not act on (unreadable)
    after: VerifyReport | None = None
    leader: list[LeaderLack] = field(default_factory=list)  # segments replicas hold that a leader lacked
    # replicas whose rows differ while they hold what the leader lacks: never re-bootstrapped from it (the
    # next round pushes their segments to the leader, which merges them)
    held_back: list[RowCheck] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """Nothing lost, and: verified equal afterwards (a dry run: nothing to do)."""
        if self.lost or self.unmended or self.held_back or any(not x.fetched for x in self.leader):
            return False
        if self.dry_run:
            return not (self.files or self.rebootstraps or self.leader)
        return self.after is not None and self.after.differences == 0

    def __str__(self) -> str:
        """What ``segrep repair`` did (or would do): files fetched again, LOST segments, replicas re-bootstrapped."""
        verb = "would " if self.dry_run else ""
        lines = [f"repair of {self.table}{' (dry run: nothing changed)' if self.dry_run else ''}:"]
        for x in self.leader:
            if not x.relinks:
                lines.append(
                    f"  LEADER LACKS {x.describe()}: a fork of the leader's chain; rounds push it to the leader, "
                    "which merges it (nothing is discarded)"
                )
            elif x.source is None:
                lines.append(f"  LEADER LACKS {x.describe()}: no intact copy to fetch; nothing is discarded")
            elif not x.fetched:
                lines.append(f"  LEADER LACKS {x.describe()}: not fetched (its leader is not at the --site given)")
            else:
                done = "would fetch it to the leader" if self.dry_run else "fetched to the leader"
                lines.append(f"  LEADER LACKS {x.describe()}: {done} from {x.source}, on its chain again")
        for f in self.files:
            p = f.problem
            fixed = "; its catalog row set back to the leader's" if f.catalog_fixed else ""
            lines.append(
                f"  {verb}fetch {p.path} at {p.site} ({p.state}) again from {f.source}{fixed}"
                if self.dry_run
                else f"  fetched {p.path} at {p.site} ({p.state}) again from {f.source}{fixed}"
            )
        for lost in self.lost:
            lines.append(
                f"  LOST: segment {lost.segment_id} of partition {lost.partition_id} ({lost.row_count} row(s), "
                f"{lost.deleted_rows} tombstone(s), versions {lost.min_version}..{lost.max_version}): no intact "
                f"copy at any site; bad at {', '.join(lost.sites)}; nothing was deleted"
            )
        for r in self.rebootstraps:
            lines.append(
                f"  {verb}re-bootstrap partition {r.partition_id} at {r.site}: {r.differences} key(s) differ from "
                "the leader with every file intact"
            )
            lines += r.lines()[1:]
        for r in self.unmended:
            lines.append(f"  not mended: partition {r.partition_id} at {r.site}: {r.detail}")
        for r in self.held_back:
            lines.append(
                f"  not re-bootstrapped: partition {r.partition_id} at {r.site} holds segments the leader lacks "
                f"({r.differences} key(s) differ); rounds push them to the leader first"
            )
        if not (self.files or self.lost or self.rebootstraps or self.unmended or self.leader or self.held_back):
            lines.append("  nothing to repair")
        if self.after is not None:
            lines.append(str(self.after))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "dry_run": self.dry_run,
            "clean": self.clean,
            "files": [f.to_dict() for f in self.files],
            "lost": [x.to_dict() for x in self.lost],
            "rebootstraps": [r.to_dict() for r in self.rebootstraps],
            "unmended": [r.to_dict() for r in self.unmended],
            "leader": [x.to_dict() for x in self.leader],
            "held_back": [r.to_dict() for r in self.held_back],
            "after": None if self.after is None else self.after.to_dict(),
        }


@dataclass
class _Sources:
    """Which copies hash to which facts, each hashed at most once."""

    pacer: Pacer
    seen: dict[int, FileFacts | None] = field(default_factory=dict)  # id(copy) -> facts (None: unreadable)

    def intact(self, copy: SegmentCopy, facts: FileFacts) -> bool:
        key = id(copy)
        if key not in self.seen:
            probe = SegmentCopy(copy.site, copy.site_uri, copy.placement_id, copy.partition_id, False, copy.segment)
            problem, _ = check_copy(probe, self.pacer, None)
            self.seen[key] = None if problem is not None else copy.facts
        return self.seen[key] == facts


def repair(
    catalog: Catalog,
    defs: Definitions,
    table: str,
    *,
    site: str | None = None,
    dry_run: bool = False,
    rate: int = 0,
    submit: Submit = launch.submit,
    links: LinkLimits | None = None,
) -> RepairReport:
    """Mend every copy (at ``site``, or everywhere) of ``table``'s segments and every replica's rows; a file
    copied back over a link with limits (``links``, default the definitions') goes at a repair's share of it."""
    links = limits_or_definitions(links, defs)
    scope = scope_of(catalog, table, site, None)
    report = RepairReport(table, dry_run)
    pacer = Pacer(rate)
    mends = mend_leaders(catalog, table, site=site, pacer=pacer, dry_run=dry_run, links=links)
    report.leader = mends.lacks
    copies = segment_copies(catalog, scope.info)
    reference = leader_facts(copies)
    leader_rows = {(c.partition_id, c.segment.segment_id): c.segment for c in copies if c.is_leader}
    sources = _Sources(pacer)
    bad: list[tuple[SegmentCopy, FileProblem]] = []
    for c in copies:
        if site is None or c.site == site:
            problem, _ = check_copy(c, pacer, reference.get((c.partition_id, c.segment.segment_id)))
            if problem is not None:
                bad.append((c, problem))
                sources.seen[id(c)] = None
    by_segment: dict[tuple[int, str], list[tuple[SegmentCopy, FileProblem]]] = defaultdict(list)
    for c, problem in bad:
        by_segment[(c.partition_id, c.segment.segment_id)].append((c, problem))
    fixes: list[tuple[SegmentCopy, m.Segment]] = []
    with LinkPacing(catalog, CopyPriority.REPAIR, links) as pacing:  # a capped link: a repair's share
        for key, broken in sorted(by_segment.items()):
            want = reference.get(key) or broken[0][0].facts
            holders = sorted(
                (c for c in copies if (c.partition_id, c.segment.segment_id) == key),
                key=lambda c: (not c.is_leader, c.site),
            )
            for target, problem in broken:
                source = next(
                    (
                        c
                        for c in holders
                        if c.site != target.site
                        and c.segment.relpath == target.segment.relpath
                        and sources.intact(c, want)
                    ),
                    None,
                )
                if source is None:
                    continue
                if not dry_run:
                    link = pacing.pacer(source.site, target.site)
                    copy_verified(
                        source.storage(),
                        target.storage(),
                        target.segment.relpath,
                        want.byte_size,
                        want.sha256,
                        None,
                        link,
                    )
                fixed = target.facts != want
                if fixed:
                    fixes.append((target, leader_rows.get(key, source.segment)))
                report.files.append(FileRepair(problem, source.site, fixed))
            unrepaired = [(c, p) for c, p in broken if not any(f.problem == p for f in report.files)]
            if unrepaired:
                seg = unrepaired[0][0].segment
                report.lost.append(
                    LostSegment(
                        key[0],
                        key[1],
                        tuple(sorted({c.site for c, _ in unrepaired})),
                        seg.row_count,
                        seg.deleted_rows,
                        seg.min_version,
                        seg.max_version,
                        tuple(f"{p.site}: {p.state}: {p.detail}" for _, p in unrepaired),
                    )
                )
    if not dry_run:
        _commit_file_repairs(catalog, report.files, fixes)
    _plan_rows(catalog, scope, report, bad, mends.unmended(dry_run))
    if not dry_run:
        _rebootstrap(catalog, defs, table, report.rebootstraps, submit, links)
        report.after = verify(catalog, table, site=site, files=True, rate=rate)
    return report


def _commit_file_repairs(
    catalog: Catalog, repaired: list[FileRepair], fixes: list[tuple[SegmentCopy, m.Segment]]
) -> None:
    """One transaction: each divergent copy's row set to the leader's facts (only if still as it was read),
    and each repaired file's check recorded as good."""
    now = hlc.now_us()
    with catalog.write() as s:
        for target, ref in fixes:
            res = s.execute(
                update(m.Segment)
                .where(
                    m.Segment.placement_id == target.placement_id,
                    m.Segment.segment_id == target.segment.segment_id,
                    m.Segment.sha256 == target.segment.sha256,
                )
                .values({name: getattr(ref, name) for name in _ENTRY_FIELDS})
                .execution_options(synchronize_session=False)
            )
            if rowcount(res) != 1:
                raise ConflictError(
                    f"segment {target.segment.segment_id} at placement {target.placement_id} changed during repair"
                )
        record_file_checks(
            s, [FileCheckResult(f.problem.placement_id, f.problem.segment_id, now, None) for f in repaired]
        )


def _plan_rows(
    catalog: Catalog,
    scope: Scope,
    report: RepairReport,
    bad: list[tuple[SegmentCopy, FileProblem]],
    holds_more: set[tuple[int, str]],
) -> None:
    """The replicas whose rows differ once every file is intact. On a dry run the files are not mended yet:
    partitions with a damaged file are left to the file repairs (a real run compares them afterwards). A
    replica holding what its leader lacks (``holds_more``: partition, site) is held back, never re-bootstrapped:
    that would discard the only copies of those rows."""
    damaged = {c.partition_id for c, _ in bad}
    checks = compare_rows(catalog, scope)
    for check in checks:
        if report.dry_run and check.partition_id in damaged:
            continue
        if check.verdict == Verdict.DIFFERENT and (check.partition_id, check.site) in holds_more:
            report.held_back.append(check)
        elif check.verdict == Verdict.DIFFERENT:
            report.rebootstraps.append(check)
        elif check.verdict == Verdict.UNREADABLE and not any(x.partition_id == check.partition_id for x in report.lost):
            report.unmended.append(check)


def _rebootstrap(
    catalog: Catalog,
    defs: Definitions,
    table: str,
    checks: list[RowCheck],
    submit: Submit,
    links: LinkLimits = unlimited,
) -> None:
    """Flag each differing replica placement, bootstrap its site (a new placement joins from the newest major)
    and run rounds to that site until it has caught up (a bootstrap's share of a capped link)."""
    if not checks:
        return
    with catalog.write() as s:
        for check in checks:
            site_row = q.site_by_name(s, check.site)
            pl = q.placement_at(s, check.partition_id, site_row.site_id)
            if pl is not None:
                pl.needs_bootstrap = True
    for site in sorted({c.site for c in checks}):
        bootstrap(catalog, defs, table, site, "auto")
        catch_up(catalog, defs, table, site, submit=submit, links=links)
