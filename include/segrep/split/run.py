"""A whole split without Airflow (``segrep split``), and the steps it shares with the split DAG: the DAG's
tasks call :func:`begin_split`, ``workflow.plan_pass`` / ``commit_pass``, :func:`finalize_split`,
``replication.unload.finish`` and :func:`require_done`, in the order :func:`run_split` calls them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from segrep.catalog import Catalog
from segrep.catalog.models import MAX_PARTITION_ID
from segrep.config.definitions import Definitions
from segrep.core import faults
from segrep.core.errors import SegrepError, SplitIncompleteError
from segrep.core.states import SplitPhase, SplitState
from segrep.publish.outcome import Publication
from segrep.replication.publication import publish
from segrep.replication.unload import FinishReport, finish
from segrep.spark import launch
from segrep.spark.launch import Submit
from segrep.spark.merge_runner import MergeLimits, run_merge_manifest
from segrep.spark.results import CommitSummary
from segrep.split import workflow as sp
from segrep.split.progress import split_progress


@dataclass(frozen=True)
class SplitPass:
    plan: sp.PassPlan
    commit: CommitSummary


@dataclass(frozen=True)
class SplitRunReport:
    """A whole split run: each pass's plan and commit, and what UNLOAD_FINAL did or waits for."""

    split_id: int
    table: str
    children: list[int]
    passes: list[SplitPass]
    finish: FinishReport
    # each site's Iceberg publication once the children serve
    published: Publication | None = None

    @property
    def state(self) -> SplitState:
        return self.finish.state

    @property
    def waiting(self) -> str | dict[str, int] | None:
        """What UNLOAD_FINAL waits for (None once DONE)."""
        return self.finish.waiting

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_partition_id(partition_id: object) -> int:
    """``partition_id`` if it can name a partition (a positive 32-bit integer, as the catalog stores it); else
    SegrepError naming it, before it reaches the database (where 2**70 is an OverflowError, not an answer)."""
    if isinstance(partition_id, bool) or not isinstance(partition_id, int):
        raise SegrepError(f"partition id {partition_id!r} is not an integer")
    if not 1 <= partition_id <= MAX_PARTITION_ID:
        raise SegrepError(f"partition id {partition_id} is out of range: partition ids are 1 to {MAX_PARTITION_ID}")
    return partition_id


def begin_split(
    catalog: Catalog, table: str, partition_id: int, split_keys: Sequence[Any] | None = None, *, is_async: bool = False
) -> sp.SplitRef:
    """Step 1: start splitting ``partition_id`` at ``split_keys`` or, without keys, find its split to resume
    it (after a failure, a leader change or a parent replica that was down). Raises SegrepError, before
    anything is read or written, for a partition id that is not a positive 32-bit integer."""
    check_partition_id(partition_id)
    wanted = [] if split_keys is None else sp.split_key_list(split_keys)
    if wanted:
        ref = sp.start_split(catalog, table, partition_id, wanted, is_async=is_async)
    else:
        ref = sp.find_split(catalog, table, partition_id)
    faults.point("split_after_start")
    return ref


def finalize_split(catalog: Catalog, split_id: int, copy: sp.PassPlan | dict[str, Any] | None = None) -> sp.SplitRef:
    """SPLIT_FINALIZE after the copy pass ``copy`` (a PassPlan or its ``to_dict()``), up to that pass's cut;
    without a copy pass, up to the parent leader's newest segment. A split already past it (async, or resumed
    in UNLOAD) is returned as it is. Raises SplitIncompleteError, changing nothing, if a child still lacks a
    segment: run another copy pass."""
    plan = copy if copy is None or isinstance(copy, sp.PassPlan) else sp.PassPlan(**copy)
    cut = plan.cut_entry_id if plan is not None and plan.phase == SplitPhase.COPY else None
    ref = sp.finalize(catalog, split_id, cut)
    faults.point("split_after_finalize")
    return ref


def require_done(finished: FinishReport, table: str) -> FinishReport:
    """``finished`` if the split is DONE, or waits only for rounds to carry the children to replica sites
    (those rounds finish it); else SplitIncompleteError saying what it waits for."""
    if finished.state != SplitState.DONE and not finished.replicas_only:
        raise SplitIncompleteError(
            f"split {finished.split_id} of {table} waits for {finished.waiting}: a parent replica could not push "
            "yet (its site is down?); run the split again without split keys to resume it"
        )
    return finished


def run_split(
    catalog: Catalog,
    defs: Definitions,
    table: str,
    partition_id: int,
    split_keys: Sequence[Any] | None = None,
    *,
    is_async: bool = False,
    submit: Submit = launch.submit,
    max_passes: int = 3,
) -> SplitRunReport:
    """A whole split without Airflow (``segrep split``): :func:`begin_split`, copy passes until
    :func:`finalize_split` succeeds, an unload pass, UNLOAD_FINAL. One merge job per pass that has rewrites or
    merges to run (in process or a Spark application: ``spark.merge_runner``). The split DAG runs the same
    steps, one task each, one copy pass per run. If a parent placement cannot push yet (its site is down), the
    split stays in UNLOAD and a re-run continues it."""
    ref = begin_split(catalog, table, partition_id, split_keys, is_async=is_async)
    passes: list[SplitPass] = []
    limits = MergeLimits.of(defs.policy(table))

    def one_pass() -> sp.PassPlan:
        plan = sp.plan_pass(catalog, defs, ref.split_id)
        if plan.manifest:
            run_merge_manifest(
                plan.manifest, str(plan.result), submit=submit, limits=limits, name=f"segrep-split-{table}"
            )
        passes.append(SplitPass(plan, sp.commit_pass(catalog, plan)))
        return plan

    for attempt in range(1, max_passes + 1):
        splitting = sp.find_split(catalog, table, partition_id).state == SplitState.SPLITTING
        copy = one_pass() if splitting else None
        try:
            finalize_split(catalog, ref.split_id, copy)
            break
        except SplitIncompleteError:
            if attempt == max_passes:
                raise
    if sp.find_split(catalog, table, partition_id).state == SplitState.UNLOAD:
        one_pass()
    finished = finish(catalog, defs, ref.split_id)
    published = publish(catalog, defs, table)
    return SplitRunReport(ref.split_id, table, ref.children, passes, finished, published)


def resume_splits(
    catalog: Catalog, defs: Definitions, table: str, *, submit: Submit = launch.submit
) -> list[SplitRunReport]:
    """Continue every unfinished split of ``table`` (one whose parent replica could not push, say)."""
    return [
        run_split(catalog, defs, table, progress.parent_partition_id, submit=submit)
        for progress in split_progress(catalog, table)
    ]
