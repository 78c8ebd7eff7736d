"""A whole split without Airflow (``segrep split``): the same steps, in the order the split DAG runs them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from segrep.catalog import Catalog
from segrep.config.definitions import Definitions
from segrep.core import faults
from segrep.core.errors import SplitIncompleteError
from segrep.core.states import SplitState
from segrep.spark import launch
from segrep.spark.launch import Submit
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
    finish: sp.FinishReport

    @property
    def state(self) -> SplitState:
        return self.finish.state

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
    """A whole split without Airflow (``segrep split``): start (or resume), copy passes until SPLIT_FINALIZE,
    an unload pass, UNLOAD_FINAL. One Spark application per pass that has rewrites or merges to run.
    If a parent placement cannot push yet (its site is down), the split stays in UNLOAD and a re-run
    continues it."""
    if split_keys:
        ref = sp.start_split(catalog, table, partition_id, list(split_keys), is_async=is_async)
    else:
        ref = sp.find_split(catalog, table, partition_id)
    faults.point("split_after_start")
    passes: list[SplitPass] = []

    def one_pass() -> sp.PassPlan:
        plan = sp.plan_pass(catalog, defs, ref.split_id)
        if plan.manifest:
            submit("merge", ["--manifest", plan.manifest, "--result", str(plan.result)], name=f"segrep-split-{table}")
        passes.append(SplitPass(plan, sp.commit_pass(catalog, plan)))
        return plan

    for attempt in range(1, max_passes + 1):
        if sp.find_split(catalog, table, partition_id).state != SplitState.SPLITTING:
            break
        plan = one_pass()
        try:
            sp.finalize(catalog, ref.split_id, plan.cut_entry_id)
        except SplitIncompleteError:
            if attempt == max_passes:
                raise
    faults.point("split_after_finalize")
    if sp.find_split(catalog, table, partition_id).state == SplitState.UNLOAD:
        one_pass()
    finished = sp.finish(catalog, defs, ref.split_id)
    return SplitRunReport(ref.split_id, table, ref.children, passes, finished)


def resume_splits(
    catalog: Catalog, defs: Definitions, table: str, *, submit: Submit = launch.submit
) -> list[SplitRunReport]:
    """Continue every unfinished split of ``table`` (one whose parent replica could not push, say)."""
    return [
        run_split(catalog, defs, table, progress.parent_partition_id, submit=submit)
        for progress in split_progress(catalog, table)
    ]
