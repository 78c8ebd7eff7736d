"""What a round plans and reports, as typed records.

The catalog keeps a round's report as JSON (``rounds.report``, ``round_targets.report``) and Airflow passes
plans between tasks as XCom; both go through ``to_dict``/``from_dict`` here, so every other module works with
the records themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from segrep.core import hlc
from segrep.core.states import Outcome
from segrep.publish.outcome import SitePublication
from segrep.spark.results import CommitSummary


class TargetStatus(StrEnum):
    """How one target site's fast-forward went in a round."""

    OK = "ok"
    DECLINED = "declined"  # an offer was declined (OVERLOADED, INVALID, INFLIGHT): retried next round
    BACKOFF = "backoff"  # not attempted: the target is backing off after failures
    FAILED = "failed"  # the site could not be read or written
    # held up by another round's leases (named with their holder and expiry), or by a merge of forks it holds
    # (UNMERGED: an old leader back after a failover with ``on_return: merge``): nothing moved
    WAITING = "waiting"
    DOWN = "down"  # the site's root or identity marker is missing or foreign: nothing written, acked or moved

    @property
    def rank(self) -> int:
        """Worse outcomes rank higher; a target's status is its partitions' worst."""
        return _RANK[self]


_RANK = {
    TargetStatus.OK: 0,
    TargetStatus.BACKOFF: 0,
    TargetStatus.WAITING: 1,
    TargetStatus.DECLINED: 1,
    TargetStatus.FAILED: 2,
    TargetStatus.DOWN: 3,
}


class RoundStatus(StrEnum):
    RUNNING = "running"
    OK = "ok"
    PARTIAL = "partial"  # every target reported, some declined or backed off
    FAILED = "failed"  # some target failed or did not report


@dataclass
class TargetForecast:
    """The planner's prediction for one target: offers by predicted outcome, bytes to fast-forward."""

    outcomes: dict[str, int] = field(default_factory=dict)
    fast_forward_bytes: int = 0

    @property
    def offers(self) -> int:
        """Segments the plan offers this target, whatever their predicted outcome."""
        return sum(self.outcomes.values())


@dataclass
class PlanSummary:
    """Per target the forecast; partitions with merges or majors planned; pushes by the leader's answer."""

    targets: dict[str, TargetForecast] = field(default_factory=dict)
    merges: list[int] = field(default_factory=list)
    majors: list[int] = field(default_factory=list)
    pushes: dict[str, int] = field(default_factory=dict)
    # follower sites whose pushed files could not be read (down): their pushes wait, no major is built for
    # them, and the forks a failover gave up that they hold bound no safe time this round (safetime.py)
    down: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> PlanSummary:
        return cls(
            targets={site: TargetForecast(**t) for site, t in doc.get("targets", {}).items()},
            merges=list(doc.get("merges", [])),
            majors=list(doc.get("majors", [])),
            pushes=dict(doc.get("pushes", {})),
            down=list(doc.get("down", [])),
        )


@dataclass
class RoundPlan:
    """The plan step's result: the round, its targets, and the merge manifest if Spark has work."""

    round_id: int
    table: str
    end_us: int
    targets: list[str]
    manifest: str | None
    summary: PlanSummary = field(default_factory=PlanSummary)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> RoundPlan:
        fields = {k: doc[k] for k in ("round_id", "table", "end_us", "targets", "manifest")}
        return cls(**fields, summary=PlanSummary.from_dict(doc.get("summary", {})))


@dataclass(frozen=True)
class InvalidSegment:
    """A segment whose copy to a target failed verification (INVALID): the file at ``site``, ``path`` on that
    site, is damaged, or the bytes were damaged on the way. Nothing was registered at the target."""

    segment_id: str
    partition_id: int
    site: str  # the site the copy came from (the partition's leader)
    path: str  # the file's path at that site
    error: str  # what the verification found


LEASE_DECLINES = frozenset({Outcome.INFLIGHT, Outcome.OVERLOADED})  # they wait for leases, nothing else


@dataclass
class TargetReport:
    """One target's fast-forward in a round (one partition's, folded into the target's by ``absorb``)."""

    site: str
    status: TargetStatus = TargetStatus.OK
    outcomes: dict[str, int] = field(default_factory=dict)
    segments_copied: int = 0
    bytes_copied: int = 0
    # bytes_copied by the site they came from: the link's traffic (the leader, or the feeder in a cascade)
    bytes_from: dict[str, int] = field(default_factory=dict)
    needs_major: list[int] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None
    spark_apps: int = 0
    decline_reason: str | None = None  # the first decline; the target's back-off records it once
    invalid: list[InvalidSegment] = field(default_factory=list)  # copies that failed verification
    # A decline that does not clear by itself (INVALID): the target backs off. INFLIGHT and OVERLOADED only
    # wait for leases, which a live round releases and a dead one's lapse within a lease TTL: no back-off.
    backs_off: bool = False
    # FAILED because the store refused (credentials, permissions, a missing bucket): retrying will not help
    # until the site is fixed, so the target does not back off and retry in a loop; the error says what to fix.
    refused: bool = False
    # Copies made but not committed because the offer went stale: the partition's leader or epoch changed
    # after it (a failover or switchover during the round), or the replica placement was removed. The files
    # are orphans for GC; the next round offers from the new leader. Not a decline: nothing waits or backs off.
    superseded: int = 0
    # requests to each site's object store retried after it throttled them (503 SlowDown, 429) while this
    # target's fast-forward ran in its process (storage.throttle): the store's limits, not failures
    throttled: dict[str, int] = field(default_factory=dict)

    def absorb(self, other: TargetReport) -> None:
        """Fold one partition's report into the target's: sums, and the worst status with its reason."""
        for k, v in other.outcomes.items():
            self.outcomes[k] = self.outcomes.get(k, 0) + v
        self.segments_copied += other.segments_copied
        self.superseded += other.superseded
        self.bytes_copied += other.bytes_copied
        for source, n in other.bytes_from.items():
            self.bytes_from[source] = self.bytes_from.get(source, 0) + n
        for store, n in other.throttled.items():
            self.throttled[store] = self.throttled.get(store, 0) + n
        self.spark_apps += other.spark_apps
        self.needs_major += other.needs_major
        self.invalid += other.invalid
        if other.status.rank > self.status.rank:
            self.status, self.error = other.status, other.error or self.error
        self.decline_reason = self.decline_reason or other.decline_reason
        self.backs_off = self.backs_off or other.backs_off
        self.refused = (self.refused or other.refused) and self.status == TargetStatus.FAILED

    def count(self, outcome: Outcome) -> None:
        self.outcomes[str(outcome)] = self.outcomes.get(str(outcome), 0) + 1

    def after(self, earlier: TargetReport) -> TargetReport:
        """This attempt's report with the copies of the round's earlier attempts added (an attempt that failed
        half-way, or a task cleared and run again, registered what it copied: the next attempt finds those
        segments held and copies only the rest). Status, outcomes and errors stay this attempt's."""
        bytes_from = dict(earlier.bytes_from)
        for source, n in self.bytes_from.items():
            bytes_from[source] = bytes_from.get(source, 0) + n
        return replace(
            self,
            segments_copied=earlier.segments_copied + self.segments_copied,
            bytes_copied=earlier.bytes_copied + self.bytes_copied,
            bytes_from=bytes_from,
            spark_apps=earlier.spark_apps + self.spark_apps,
        )

    def decline(self, outcome: Outcome) -> None:
        """Record a declined offer: the target is retried next round (after its back-off, unless the decline
        only waits for leases)."""
        self.count(outcome)
        self.status = TargetStatus.DECLINED
        self.decline_reason = self.decline_reason or str(outcome)
        self.backs_off = self.backs_off or outcome not in LEASE_DECLINES

    def wait(self, reason: str, outcome: Outcome | None = None) -> None:
        """Record that another round's leases hold this target up (``reason`` names the round and when its
        leases lapse): WAITING, unless something worse was found; no back-off (the leases lapse by themselves)."""
        if outcome is not None:
            self.count(outcome)
            self.decline_reason = self.decline_reason or str(outcome)
        if self.status.rank < TargetStatus.WAITING.rank:
            self.status = TargetStatus.WAITING
        if self.status == TargetStatus.WAITING:
            self.error = self.error or reason

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> TargetReport:
        doc = dict(doc)
        doc["status"] = TargetStatus(doc.get("status", TargetStatus.OK))
        doc["invalid"] = [InvalidSegment(**x) for x in doc.get("invalid", [])]
        return cls(**doc)


@dataclass
class RoundReport:
    """A finished round: per target what happened, the merges, the safe times it established."""

    round_id: int
    table: str
    end_us: int
    status: RoundStatus
    failed: list[str]
    targets: dict[str, TargetReport]
    merges: CommitSummary
    safe_time_us: dict[str, int]
    spark_apps: int
    plan: PlanSummary | None = None
    advanced: list[str] = field(default_factory=list)  # sites whose safe time this commit moved forward
    splits_retired: list[int] = field(default_factory=list)  # splits this commit finished (UNLOAD_FINAL)
    duration_s: float | None = None  # from the round's plan to this commit
    # each site's Iceberg publication after this commit (a table whose policy says ``publish: iceberg``)
    published: list[SitePublication] = field(default_factory=list)

    def __str__(self) -> str:
        return self.text()

    def text(self, sites: Sequence[str] | None = None) -> str:
        """A few lines a person can read: per target (each of ``sites``, default all) what happened, each file
        that failed verification and what to run, merges and conflicts, safe times, Spark applications, the
        splits it finished."""
        lines = [f"round {self.round_id} of {self.table} up to {hlc.iso(self.end_us)}: {self.status}"]
        for site, r in sorted(self.targets.items()):
            if not sites or site in sites:
                lines += _target_lines(self.table, site, r)
        lines += self.merges.lines()
        for site, us in sorted(self.safe_time_us.items()):
            lines.append(f"  safe time at {site}: {hlc.iso(us)}")
        lines.append(f"  spark applications: {self.spark_apps}")
        for split_id in self.splits_retired:
            lines.append(f"  split {split_id} of {self.table}: every replica holds the children; parent retired")
        lines += [f"  {x.line()}" for x in self.published]
        return "\n".join(lines)

    @property
    def invalid(self) -> list[tuple[str, InvalidSegment]]:
        """Every copy that failed verification, with its target site, in target order."""
        return [(site, bad) for site, r in sorted(self.targets.items()) for bad in r.invalid]

    @property
    def has_problems(self) -> bool:
        """The round needs a person: a target failed, a copied file failed verification (a damaged file or
        link), or a merge input failed verification. Declines that clear by themselves (OVERLOADED,
        INFLIGHT) and back-off are not problems. ``segrep round`` exits 1 on it."""
        return bool(self.failed or self.invalid or self.merges.invalid)

    def problems(self) -> list[str]:
        """One phrase per kind of problem behind :attr:`has_problems`: the CLI's error line and the reason the
        DAG's report task fails."""
        out = []
        if self.failed:
            out.append(f"target(s) {', '.join(self.failed)} failed (re-run to retry)")
        if self.invalid:
            out.append(f"{len(self.invalid)} copied file(s) failed verification (see INVALID in the report)")
        if self.merges.invalid:
            out.append(f"{len(self.merges.invalid)} merge input(s) failed verification")
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> RoundReport:
        """The report back from ``to_dict`` (an XCom value, or JSON)."""
        plan = doc.get("plan")
        return cls(
            round_id=doc["round_id"],
            table=doc["table"],
            end_us=doc["end_us"],
            status=RoundStatus(doc["status"]),
            failed=list(doc["failed"]),
            targets={site: TargetReport.from_dict(t) for site, t in doc["targets"].items()},
            merges=CommitSummary.from_dict(doc["merges"]),
            safe_time_us=dict(doc["safe_time_us"]),
            spark_apps=doc["spark_apps"],
            plan=None if plan is None else PlanSummary.from_dict(plan),
            advanced=list(doc.get("advanced", [])),
            splits_retired=list(doc.get("splits_retired", [])),
            duration_s=doc.get("duration_s"),
            published=[SitePublication.from_dict(x) for x in doc.get("published", [])],
        )

    def stored(self) -> dict[str, Any]:
        """The report as the catalog keeps it in ``rounds.report`` (the round's identity is in its row)."""
        doc = self.to_dict()
        # the identity is in the row; advanced and duration_s are this commit's, not the round's (a repeated
        # commit moves nothing and must leave the row as it was)
        for key in ("round_id", "table", "end_us", "status", "failed", "advanced", "duration_s", "published"):
            doc.pop(key)
        if self.plan is None:
            doc.pop("plan")
        return doc


def _target_lines(table: str, site: str, r: TargetReport) -> list[str]:
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(r.outcomes.items())) or "nothing to offer"
    extra = f"; {r.error}" if r.error else ""
    copied = f"; copied {r.segments_copied} segments, {r.bytes_copied:,} bytes"
    if set(r.bytes_from) - {site}:  # which link the bytes crossed (the leader, or a feeder: a cascade)
        copied += " (" + ", ".join(f"{n:,} from {src}" for src, n in sorted(r.bytes_from.items())) + ")"
    if r.superseded:
        copied += (
            f"; {r.superseded} copied but not committed: leadership changed or the placement was removed "
            "during the round (orphans for GC)"
        )
    if r.throttled:  # the stores' limits, met and waited out (or, past the retries, the error says so)
        copied += "; throttled by the store, retried " + ", ".join(f"{s} {n}" for s, n in sorted(r.throttled.items()))
    lines = [f"  {site}: {r.status} ({outcomes}{copied}){extra}"]
    for bad in r.invalid:
        lines.append(
            f"    INVALID: segment {bad.segment_id} of partition {bad.partition_id}, file {bad.path} "
            f"at {bad.site}: {bad.error}"
        )
    if r.invalid:
        lines.append(f"    to do: {invalid_advice(table, site, r.invalid)}")
    return lines


def invalid_advice(table: str, target: str, invalid: Sequence[InvalidSegment]) -> str:
    """What to run after copies to ``target`` failed verification: copy again at once; a file that fails
    again is damaged at its site, and ``segrep repair`` fetches it again from an intact copy."""
    sources = sorted({bad.site for bad in invalid})
    repair = " and ".join(f"`segrep repair {table} --site {site}`" for site in sources)
    return (
        f"run `segrep round {table} --target {target} --reoffer` to copy again now; if a file fails again, "
        f"it is damaged at {', '.join(sources)}: run {repair}"
    )
