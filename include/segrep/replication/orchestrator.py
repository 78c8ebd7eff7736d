"""One replication round, owned by the package: typed steps plan -> copy -> merge -> commit -> report.

``segrep round`` runs :meth:`RoundSteps.run` (every step in this process); the replication DAG runs the same
steps, either the whole round in one task after its plan (:meth:`RoundSteps.finish`, a small round) or as
mapped fast-forward tasks and a SparkSubmit merge (a big one); :meth:`RoundSteps.choose_path` decides, from
the plan's forecast, which. Whatever runs them, the steps are the protocol's (DESIGN section 6): a fast path
is the same leases, acks, checkpoints, safe time and fencing, only cheaper (DESIGN section 15).

Each step returns a typed record (``RoundPlan``, ``TargetReport``, ``RoundReport``, ``RoundView``); the view
renders itself and raises on the round's problems, so the glue around the steps (the CLI, an Airflow task)
runs them, logs the result and raises on failure, nothing more.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from segrep.catalog import Catalog
from segrep.catalog.link_lease import LinkLimits, LinkPacing
from segrep.catalog.link_limits import limits_or_definitions
from segrep.config.definitions import Definitions
from segrep.core import hlc
from segrep.core.human import human_bytes
from segrep.core.links import CopyPriority
from segrep.replication.commit import recommit
from segrep.replication.fast_forward import fast_forward_target
from segrep.replication.heartbeat import heartbeat
from segrep.replication.plan import plan_round
from segrep.replication.publication import publish
from segrep.replication.reports import RoundPlan, RoundReport, TargetReport, TargetStatus
from segrep.replication.round import TargetHeldBack, TargetUnreachable, round_key
from segrep.replication.run import run_merge, spark_copier
from segrep.replication.view import RoundView, retry_now, round_view
from segrep.spark import launch
from segrep.spark.launch import Submit
from segrep.spark.manifest import Manifest
from segrep.spark.merge_items import MergeEngine
from segrep.spark.merge_runner import MergeLimits, choose_engine
from segrep.storage.transport import Copier
from segrep.storage.workdir import result_path


class RoundPath(StrEnum):
    """How a round's copies and merges run once it is planned."""

    ONE_TASK = "one_task"  # every step in one process: copies in threads, a small merge in process
    MAPPED = "mapped"  # a fast-forward per target (mapped tasks) and the merge as a Spark application


@dataclass(frozen=True)
class PlannedRound:
    """The plan step's result as the later steps take it: the plan, the path chosen for it, and what the
    round's other tasks need (its merge result file, the key its leases are held under, the form's
    ``reoffer``). ``to_dict``/``from_dict``: the XCom between the DAG's tasks."""

    plan: RoundPlan
    path: RoundPath
    reoffer: bool
    result: str  # where the merge job writes its result file
    lease_holder: str  # the round's key: the Spark merge task keeps its leases alive under it

    @property
    def end_us(self) -> int:
        return self.plan.end_us

    def __str__(self) -> str:
        size = round_size(self.plan)
        merge = "a merge" if size.has_merges else "no merge"
        return (
            f"round of {self.plan.table} up to {hlc.iso(self.end_us)}: {self.path} path, {size.targets} "
            f"target(s), {human_bytes(size.copy_bytes)} to copy, {merge}"
        )

    @property
    def manifest(self) -> str | None:
        return self.plan.manifest

    def to_dict(self) -> dict[str, Any]:
        # the plan's fields at the top level: the SparkSubmit task's templates read "manifest" and "result"
        return {
            **self.plan.to_dict(),
            "path": str(self.path),
            "reoffer": self.reoffer,
            "result": self.result,
            "lease_holder": self.lease_holder,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> PlannedRound:
        return cls(
            RoundPlan.from_dict(doc), RoundPath(doc["path"]), bool(doc["reoffer"]), doc["result"], doc["lease_holder"]
        )


@dataclass(frozen=True)
class RoundSize:
    """What a planned round will move: bytes to fast-forward over every target, and its merge manifest."""

    copy_bytes: int
    targets: int
    has_merges: bool


def round_size(plan: RoundPlan) -> RoundSize:
    """From the plan's forecast (no catalog read): fast-forward bytes summed over the targets."""
    copy_bytes = sum(f.fast_forward_bytes for f in plan.summary.targets.values())
    return RoundSize(copy_bytes, len(plan.targets), plan.manifest is not None)


class RoundSteps:
    """The steps of one table's rounds, bound to a catalog and the definitions.

    ``submit`` starts the Spark applications a step needs (``spark-submit`` here, the Airflow connection's
    hook in a task); ``copier`` copies the batches under the policy's ``spark_copy_threshold_bytes`` (by default
    a pool of threads per target, paced at each link's share of the cap ``links`` gives: none by default),
    larger ones go to the Spark distributed copy through ``submit`` (not paced yet)."""

    def __init__(
        self,
        catalog: Catalog,
        defs: Definitions,
        table: str,
        *,
        submit: Submit = launch.submit,
        copier: Copier | None = None,
        links: LinkLimits | None = None,
        priority: CopyPriority = CopyPriority.ROUND,
    ) -> None:
        self.catalog, self.defs, self.table = catalog, defs, table
        self.policy = defs.policy(table)
        self.submit, self.copier = submit, copier
        self.links = limits_or_definitions(links, defs)  # the definitions' links unless a caller gives others
        self.priority = priority  # the copies' class on a capped link (a joining replica's: a bootstrap's)

    # -- the steps ------------------------------------------------------------------------------------------

    def plan(
        self,
        end_us: int | None = None,
        *,
        start_us: int | None = None,
        target: str | None = None,
        reoffer: bool = False,
    ) -> PlannedRound:
        """Create (or find) the round, predict every offer, lease, write the merge manifest; choose the path."""
        plan = plan_round(
            self.catalog, self.defs, self.table, end_us, start_us=start_us, target=target, reoffer=reoffer
        )
        result = str(result_path(self.defs, self.table, plan.end_us))
        key = round_key(self.table, plan.end_us)
        return PlannedRound(plan, self.choose_path(plan), reoffer, result, key)

    def choose_path(self, plan: RoundPlan) -> RoundPath:
        """ONE_TASK when the copies fit under ``one_task_round_max_bytes`` and the merge, if one is planned,
        runs in process (``spark.merge_runner.choose_engine``: its input rows and bytes under the policy's
        thresholds); else MAPPED (a task per target, and the merge on Spark)."""
        size = round_size(plan)
        if size.copy_bytes > self.policy.one_task_round_max_bytes:
            return RoundPath.MAPPED
        if plan.manifest is not None:
            engine = choose_engine(Manifest.load(plan.manifest), MergeLimits.of(self.policy)).engine
            if engine == MergeEngine.SPARK:
                return RoundPath.MAPPED
        return RoundPath.ONE_TASK

    def copy(self, planned: PlannedRound, target: str, *, retry: bool = False) -> TargetReport | None:
        """Fast-forward one target. A target that cannot be written is recorded in the round (its report says
        why) and raises ``TargetUnreachable``, so a task per target fails alone. ``retry``: an attempt someone
        asked for (a cleared or retried task), which the target's back-off does not hold back; a target held
        back while the plan has segments for it raises ``TargetHeldBack`` (recorded as BACKOFF in the round)."""
        big = spark_copier(self.defs, self.table, planned.end_us, target, self.submit)
        report = fast_forward_target(
            self.catalog,
            self.defs,
            self.table,
            target,
            planned.end_us,
            reoffer=planned.reoffer,
            retry=retry,
            copier=self.copier,
            big_copier=big,
            links=self.links,
            priority=self.priority,
        )
        forecast = planned.plan.summary.targets.get(target)
        if report.status == TargetStatus.BACKOFF and forecast is not None and forecast.offers > 0:
            raise TargetHeldBack(
                f"round of {self.table}: {target} was not tried: {report.error}; "
                + retry_now(self.table, target, "this task")
            )
        return report

    def merge(self, planned: PlannedRound) -> bool:
        """Run the round's merge manifest, if it has one; True if a merge ran."""
        if planned.manifest is None:
            return False
        # the one-task path was chosen because its merge runs in process (choose_path read the inputs' footers
        # then): not decided, nor the footers read, again
        engine = MergeEngine.IN_PROCESS if planned.path == RoundPath.ONE_TASK else "auto"
        with LinkPacing(self.catalog, CopyPriority.ROUND, self.links) as pacing:  # inputs of other sites
            run_merge(self.defs, self.table, planned.end_us, planned.manifest, self.submit, force=engine, pacing=pacing)
        return True

    def commit(self, planned: PlannedRound) -> RoundReport:
        """Merge results, checkpoints, safe time, the report, the splits it finishes, then the Iceberg
        publication of every site whose copy moved: idempotent, so a step run again after a failure commits
        (and publishes) what the catalog holds now."""
        report = recommit(self.catalog, self.defs, self.table, planned.end_us, merge_ran=planned.manifest is not None)
        # each site whose copy moved publishes it (``policy: {publish: iceberg}``); a failure is in the report,
        # never the round's
        report.published = list(publish(self.catalog, self.defs, self.table).sites)
        return report

    def report(self, report: RoundReport) -> RoundView:
        """The report with each target's pending work, lag and objective (``segrep status``'s numbers)."""
        return round_view(self.catalog, report, self.policy.rpo_s)

    # -- steps together ---------------------------------------------------------------------------------------

    def execute(self, planned: PlannedRound, *, retry: bool = False) -> RoundReport:
        """Everything after the plan, in this process: each target's copies, the merge, the commit. A target
        that fails does not stop the others; the report says which failed. ``retry``: see :meth:`copy`."""
        with heartbeat(self.catalog, planned.lease_holder):  # the round's leases live while this process does
            for site in planned.plan.targets:
                with contextlib.suppress(TargetUnreachable):  # recorded in the round; the others go on
                    self.copy(planned, site, retry=retry)
            self.merge(planned)
        return self.commit(planned)

    def finish(self, planned: PlannedRound, *, retry: bool = False) -> RoundView:
        """:meth:`execute`, then the view: what the DAG's one-task round logs and raises on."""
        return self.report(self.execute(planned, retry=retry))

    def run(
        self,
        end_us: int | None = None,
        *,
        start_us: int | None = None,
        target: str | None = None,
        reoffer: bool = False,
    ) -> RoundView:
        """A whole round in this process: plan, then :meth:`finish`."""
        return self.finish(self.plan(end_us, start_us=start_us, target=target, reoffer=reoffer))


def run_round(
    catalog: Catalog,
    defs: Definitions,
    table: str,
    until_us: int | None = None,
    *,
    target: str | None = None,
    reoffer: bool = False,
    submit: Submit = launch.submit,
    copier: Copier | None = None,
    links: LinkLimits | None = None,
    priority: CopyPriority = CopyPriority.ROUND,
) -> RoundReport:
    """plan -> fast-forward each target -> merge (only if planned) -> commit; the round's report (no view:
    what tests and workflows that run rounds back to back need). ``priority``: the class of its copies on a
    capped link (a catch-up's are second to the scheduled rounds')."""
    steps = RoundSteps(catalog, defs, table, submit=submit, copier=copier, links=links, priority=priority)
    return steps.execute(steps.plan(until_us, target=target, reoffer=reoffer))
