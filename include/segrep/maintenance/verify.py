"""``segrep verify``: is every replica the leader's rows, and is every file the segment the catalog names?
(DESIGN section 13.)

Rows: each partition's replica is compared with its leader as of one pinned version, the replica site's safe
time by default, so replication in flight is never a difference: both sides keep only row versions <= the
pin, then resolve (last writer wins). Their digests (``data.digest``) are compared; where they differ the key
ranges are bisected down to the keys only at the leader, only at the replica, and different. A key that has a
row version past the pin on either side is left out (``changed_since_pin``): as of the pin, a compacted side
may no longer hold the older row version the other still shows. Small partitions are digested in process,
large ones by the run's one Spark application (``verify_spark``); only those whose digests differ are then read
in process, to name the keys.
Files (``--files``): ``scrub``. Each run leaves one record per site compared, and each file's last check.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from dataclasses import replace as _replace
from enum import StrEnum
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy import select

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.link_lease import LinkLimits, LinkPacing, unlimited
from segrep.catalog.site_identity import open_site
from segrep.catalog.verifications import record_file_checks, record_verification
from segrep.core import hlc, keys
from segrep.core import schema as sch
from segrep.core.errors import NotFoundError, SegrepError, SiteUnidentifiedError
from segrep.core.links import CopyPriority
from segrep.data.digest import Digest, diff_keys, digest_of, row_hashes
from segrep.data.reader import PlacementFiles, placement_files, placement_rows, resolve
from segrep.maintenance.scrub import FileProblem, ScrubResult, scrub
from segrep.maintenance.verify_spark import Pair, SparkDigests
from segrep.storage.pacing import Pacer
from segrep.storage.stores import STORE_ERRORS

MAX_KEYS_LISTED = 100  # per partition and kind; the counts are always complete
SAFE_TIME = "safe-time"
_INT64_MAX = 2**63 - 1


class Verdict(StrEnum):
    EQUAL = "equal"
    DIFFERENT = "different"
    UNREADABLE = "unreadable"  # a file of either side failed its checks (the scrub names it)
    SKIPPED = "skipped"  # nothing to pin on: the site has no safe time yet, or the placement needs bootstrap


@dataclass(frozen=True)
class RowCheck:
    partition_id: int
    site: str
    leader_site: str
    as_of_us: int | None
    verdict: Verdict
    leader: Digest | None = None
    replica: Digest | None = None
    only_at_leader: tuple[Any, ...] = ()  # keys as JSON lists, at most MAX_KEYS_LISTED of each kind
    only_at_replica: tuple[Any, ...] = ()
    different: tuple[Any, ...] = ()
    differences: int = 0
    changed_since_pin: int = 0
    detail: str | None = None
    on_spark: bool = False  # digested by the run's Spark application (a large partition)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["leader"] = None if self.leader is None else self.leader.hex()
        doc["replica"] = None if self.replica is None else self.replica.hex()
        return doc

    def lines(self) -> list[str]:
        """Nothing when equal, else the head line (partition, site, leader, pin, verdict) and what differs,
        key by key."""
        pin = "-" if self.as_of_us is None else hlc.iso(self.as_of_us)
        head = (
            f"  partition {self.partition_id} at {self.site} (leader {self.leader_site}, as of {pin}): "
            f"{self.verdict.upper()}"
        )
        if self.verdict == Verdict.EQUAL:
            return []
        if self.verdict != Verdict.DIFFERENT:
            return [f"{head}: {self.detail}"]
        lines = [f"{head}: {self.differences} key(s) differ"]
        for label, found in (
            (f"only at the leader {self.leader_site}", self.only_at_leader),
            (f"only at {self.site}", self.only_at_replica),
            ("different", self.different),
        ):
            if found:
                lines.append(f"    {label}: {', '.join(str(k) for k in found)}")
        return lines


@dataclass
class VerifyReport:
    table: str
    sites: list[str]
    rows: list[RowCheck] = field(default_factory=list)
    files_checked: bool = False
    scrub: ScrubResult = field(default_factory=ScrubResult)

    def __str__(self) -> str:
        """What ``segrep verify`` found: each difference by partition, site and key, each bad file by path."""
        verdict = f"{self.differences} difference(s)" if self.differences else "all equal"
        lines = [f"verify of {self.table} at {', '.join(self.sites) or 'no replica'}: {verdict}"]
        equal = sum(1 for r in self.rows if r.verdict == Verdict.EQUAL)
        spark = sum(1 for r in self.rows if r.on_spark)
        on_spark = f" ({spark} digested on Spark, one application)" if spark else ""
        lines.append(f"  rows: {equal} of {len(self.rows)} replica partition(s) equal to their leader{on_spark}")
        for r in self.rows:
            lines += r.lines()
        if self.files_checked:
            lines.append(f"  files: {self.scrub.files} checked, {self.scrub.bytes:,} bytes, {len(self.files)} bad")
            for f in self.files:
                whose = "the leader's copy" if f.is_leader else "a replica's copy"
                lines.append(
                    f"    {f.state.upper()}: {f.path} at {f.site} (segment {f.segment_id} of partition "
                    f"{f.partition_id}, {whose}): {f.detail}"
                )
        if self.differences:
            lines.append(f"  to do: segrep repair {self.table} (or --dry-run first to see what it would do)")
        return "\n".join(lines)

    @property
    def files(self) -> list[FileProblem]:
        return self.scrub.problems

    def differences_at(self, site: str) -> int:
        rows = sum(_weight(r) for r in self.rows if r.site == site)
        return rows + sum(1 for f in self.files if f.site == site)

    @property
    def differences(self) -> int:
        return sum(_weight(r) for r in self.rows) + len(self.files)

    def problems(self) -> list[str]:
        """One phrase per difference found, naming the partition and site or the file: why the DAG's verify
        task fails (the keys themselves are in the report it prints)."""
        out = [
            f"partition {r.partition_id} at {r.site}: {r.verdict}"
            + (f" ({r.differences} key(s))" if r.verdict == Verdict.DIFFERENT else "")
            for r in self.rows
            if _weight(r)
        ]
        return out + [f"{f.state} {f.path} at {f.site}" for f in self.files]

    @property
    def spark_apps(self) -> int:
        """Spark applications the run started: one when any partition was large enough, else none."""
        return int(any(r.on_spark for r in self.rows))

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "sites": self.sites,
            "differences": self.differences,
            "spark_apps": self.spark_apps,
            "rows": [r.to_dict() for r in self.rows],
            "files": None
            if not self.files_checked
            else {
                "checked": self.scrub.files,
                "bytes": self.scrub.bytes,
                "problems": [p.to_dict() for p in self.files],
            },
        }


def _weight(check: RowCheck) -> int:
    """Differences a row check counts for: its keys, or one for a partition that could not be read."""
    if check.verdict == Verdict.DIFFERENT:
        return check.differences
    return 1 if check.verdict == Verdict.UNREADABLE else 0


def parse_at(text: str | None) -> int | None:
    """``--at``: ``safe-time`` (None: each site's own) or a version in microseconds."""
    if text is None or text == SAFE_TIME:
        return None
    if not text.isdigit() or int(text) > _INT64_MAX:
        raise SegrepError(f"--at {text!r} is neither {SAFE_TIME} nor a version (whole microseconds, < 2**63)")
    return int(text)


@dataclass(frozen=True)
class Scope:
    """What one verify looks at: the table, the replica sites whose rows are compared, the sites whose files
    are checked, and the pin of each replica site."""

    info: q.TableInfo
    row_sites: list[str]
    file_sites: list[str]
    pins: dict[str, int | None]
    site_ids: dict[str, int]
    needs_bootstrap: frozenset[int]  # placement ids


def scope_of(catalog: Catalog, table: str, site: str | None, at: int | None) -> Scope:
    """Check the table and site exist and the site holds the table; SegrepError (nothing written) if not."""
    with catalog.read() as s:
        info = q.table_info(s, table)
        if site is not None:
            q.site_by_name(s, site)
        parts = q.serving_partitions(s, info)
        placements = q.active_placements(s, [p.partition_id for p in parts])
        sites = q.sites_by_id(s)
        leaders = {p.leader_placement_id for p in parts}
        holding = sorted({sites[pl.site_id].name for pl in placements})
        replica_sites = sorted({sites[pl.site_id].name for pl in placements if pl.placement_id not in leaders})
        safe = dict(
            s.execute(
                select(m.SafeTime.site_id, m.SafeTime.safe_time_us).where(m.SafeTime.table_id == info.table_id)
            ).all()
        )
        flagged = frozenset(pl.placement_id for pl in placements if pl.needs_bootstrap)
        leader_sites = {sites[pl.site_id].name for pl in placements if pl.placement_id in leaders}
        for row in sites.values():  # a vanished or foreign root is DOWN/UNIDENTIFIED, never "0 rows, all lost"
            if row.name in leader_sites or (row.name in holding and site in (None, row.name)):
                try:
                    open_site(s, row).ensure_identified(fresh=True)
                except SiteUnidentifiedError:
                    raise
                except STORE_ERRORS:
                    pass  # unreachable: an UNREADABLE difference, found where its files are read
    if site is not None and site not in holding:
        raise NotFoundError(f"site {site!r} holds no placement of {table} (it is at: {', '.join(holding) or 'none'})")
    ids = {x.name: x.site_id for x in sites.values()}
    row_sites = [x for x in replica_sites if site is None or x == site]
    file_sites = [x for x in holding if site is None or x == site]
    pins = {x: at if at is not None else safe.get(ids[x]) for x in row_sites}
    return Scope(info, row_sites, file_sites, pins, ids, flagged)


def _keys_json(t: pa.Table) -> list[Any]:
    return [[keys.encode(v) for v in row.values()] for row in t.slice(0, MAX_KEYS_LISTED).to_pylist()]


def _late_keys(raw: pa.Table, pin: int, primary_key: tuple[str, ...]) -> set[tuple[Any, ...]]:
    late = raw.filter(pc.field(sch.VERSION_COL) > pin).select(list(primary_key))
    return {tuple(r.values()) for r in late.to_pylist()}


def _without(t: pa.Table, late: set[tuple[Any, ...]]) -> pa.Table:
    if not late or t.num_rows == 0:
        return t
    keep = [tuple(r.values()) not in late for r in t.to_pylist()]
    return t.filter(pa.array(keep, pa.bool_()))


def compare_placement(
    info: q.TableInfo, leader: PlacementFiles, leader_raw: pa.Table, replica: PlacementFiles, pin: int
) -> RowCheck:
    """The replica's rows as of ``pin`` against the leader's (``leader_raw``: the leader's unresolved rows)."""
    base = RowCheck(leader.partition_id, replica.site.name, leader.site.name, pin, Verdict.EQUAL)
    try:
        replica_raw = placement_rows(info, replica)
    except SegrepError as exc:  # a damaged file (CorruptSegmentError) or a site that cannot be reached
        return _replace(base, verdict=Verdict.UNREADABLE, detail=str(exc))
    pk = info.primary_key
    cols = list(info.schema.names)
    sides = [resolve(raw.filter(pc.field(sch.VERSION_COL) <= pin), pk) for raw in (leader_raw, replica_raw)]
    hashes = [row_hashes(t, cols) for t in sides]
    digests = [digest_of(h) for h in hashes]
    if digests[0] == digests[1]:
        return _replace(base, leader=digests[0], replica=digests[1])
    diff = diff_keys(pk, sides[0], hashes[0], sides[1], hashes[1])
    late = _late_keys(leader_raw, pin, pk) | _late_keys(replica_raw, pin, pk)
    only_l, only_r, changed = (_without(t, late) for t in (diff.only_left, diff.only_right, diff.different))
    count = only_l.num_rows + only_r.num_rows + changed.num_rows
    return _replace(
        base,
        verdict=Verdict.DIFFERENT if count else Verdict.EQUAL,
        leader=digests[0],
        replica=digests[1],
        only_at_leader=tuple(_keys_json(only_l)),
        only_at_replica=tuple(_keys_json(only_r)),
        different=tuple(_keys_json(changed)),
        differences=count,
        changed_since_pin=diff.count - count,
    )


def compare_rows(
    catalog: Catalog, scope: Scope, only_partitions: set[int] | None = None, spark: SparkDigests | None = None
) -> list[RowCheck]:
    """Every replica placement at the scope's row sites against its leader, partition by partition; with
    ``spark``, the large ones are digested there first and read here only if their digests differ."""
    pairs = _pairs(catalog, scope, only_partitions)
    on_spark = spark.digest(scope.info, [p for p in pairs if isinstance(p, Pair)]) if spark is not None else {}
    leader_raw: dict[int, pa.Table | SegrepError] = {}
    out: list[RowCheck] = []
    for pair in pairs:
        if isinstance(pair, RowCheck):
            out.append(pair)
            continue
        known = on_spark.get(pair.key)
        if known is not None and known.equal:
            base = RowCheck(pair.replica.partition_id, pair.site, pair.leader.site.name, pair.pin, Verdict.EQUAL)
            out.append(_replace(base, leader=known.leader, replica=known.replica, on_spark=True))
        else:
            out.append(_replace(_in_process(scope.info, pair, leader_raw), on_spark=known is not None))
    return out


def _in_process(info: q.TableInfo, pair: Pair, leader_raw: dict[int, pa.Table | SegrepError]) -> RowCheck:
    """The pair compared here; the leader's rows read once per partition (``leader_raw``) for every site."""
    pid = pair.replica.partition_id
    if pid not in leader_raw:
        try:
            leader_raw[pid] = placement_rows(info, pair.leader)
        except SegrepError as exc:
            leader_raw[pid] = exc
    raw = leader_raw[pid]
    if isinstance(raw, SegrepError):
        check = RowCheck(pid, pair.site, pair.leader.site.name, pair.pin, Verdict.UNREADABLE)
        return _replace(check, detail=f"at the leader: {raw}")
    return compare_placement(info, pair.leader, raw, pair.replica, pair.pin)


def _pairs(catalog: Catalog, scope: Scope, only_partitions: set[int] | None) -> list[Pair | RowCheck]:
    """What to compare, in report order: a pair per replica placement, or its SKIPPED check (why not)."""
    info = scope.info
    _, leaders = placement_files(catalog, info.name)
    by_partition = {pf.partition_id: pf for pf in leaders}
    out: list[Pair | RowCheck] = []
    for site in scope.row_sites:
        pin = scope.pins[site]
        _, replicas = placement_files(catalog, info.name, site)
        for pf in replicas:
            lead = by_partition[pf.partition_id]
            if pf.is_leader or (only_partitions is not None and pf.partition_id not in only_partitions):
                continue
            check = RowCheck(pf.partition_id, site, lead.site.name, pin, Verdict.SKIPPED)
            if pf.placement_id in scope.needs_bootstrap:
                out.append(_replace(check, detail="the placement needs a bootstrap; rounds do not feed it"))
            elif pin is None:
                out.append(_replace(check, detail=f"{site} has no safe time for {info.name} yet (joining?)"))
            else:
                out.append(Pair(site, pin, lead, pf))
    return out


def verify(
    catalog: Catalog,
    table: str,
    *,
    site: str | None = None,
    at: int | None = None,
    files: bool = False,
    rate: int = 0,
    record: bool = True,
    spark: SparkDigests | None = None,
    reader: str | None = None,
    links: LinkLimits = unlimited,
) -> VerifyReport:
    """Compare rows (and with ``files``, every file) of ``table``; record the outcome per site unless
    ``record`` is False (a dry run). With ``spark``, large partitions are digested there (one application).
    ``reader``: the site this process runs at; the files of every other site cross the link from there to it
    and take a scrub's share of its cap (``links``: none by default)."""
    started = hlc.now_us()
    scope = scope_of(catalog, table, site, at)
    report = VerifyReport(table, sorted({*scope.row_sites, *(scope.file_sites if files else [])}))
    report.rows = compare_rows(catalog, scope, spark=spark)
    if files:
        report.files_checked = True
        with LinkPacing(catalog, CopyPriority.SCRUB, links) as pacing:

            def link_from(site: str) -> Pacer | None:
                return None if reader is None or site == reader else pacing.pacer(site, reader)

            report.scrub = scrub(catalog, scope.info, set(scope.file_sites), Pacer(rate), link_from)
    if record:
        record_report(catalog, scope, report, started)
    return report


def record_report(catalog: Catalog, scope: Scope, report: VerifyReport, started: int) -> None:
    """One transaction: each file's check and one verification record per site compared."""
    finished = hlc.now_us()
    with catalog.write() as s:
        record_file_checks(s, report.scrub.checks)
        for name in report.sites:
            kinds = [k for k, on in (("rows", name in scope.row_sites), ("files", report.files_checked)) if on]
            record_verification(
                s,
                scope.info.table_id,
                scope.site_ids[name],
                kind="+".join(kinds),
                as_of_us=scope.pins.get(name),
                differences=report.differences_at(name),
                started_us=started,
                finished_us=finished,
            )
