"""A whole round without Airflow (``segrep round``): the same steps, in the order the DAG runs them.

Airflow runs each step as its own task (fast-forward mapped per target, the merge as SparkSubmitOperator);
here they run one after another, with Spark launched by ``spark-submit`` through :mod:`segrep.spark.launch`.
A target that fails does not stop the others; the report says which failed.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from segrep.catalog import Catalog
from segrep.config.definitions import Definitions
from segrep.core import faults, hlc
from segrep.core.errors import SplitIncompleteError
from segrep.replication.rounds import (
    Copier,
    CopyItem,
    CopyOutcome,
    TargetUnreachable,
    commit_round,
    fast_forward_target,
    plan_round,
    result_path,
    round_dir,
)
from segrep.spark import launch
from segrep.spark.jobs import write_json_atomic

Submit = Callable[..., None]


def spark_copier(defs: Definitions, table: str, end_us: int, site: str, submit: Submit = launch.submit) -> Copier:
    """A copier that runs one Spark distributed-copy application per batch it is given."""
    calls = 0

    def copy(items: list[CopyItem]) -> list[CopyOutcome]:
        nonlocal calls
        calls += 1
        folder = round_dir(defs, table, end_us)
        items_file, result_file = folder / f"copy-{site}-{calls}.json", folder / f"copy-{site}-{calls}-result.json"
        write_json_atomic(items_file, [asdict(i) for i in items])
        submit(
            "distributed_copy", ["--items", str(items_file), "--result", str(result_file)], name=f"segrep-copy-{table}"
        )
        return [CopyOutcome(**raw) for raw in json.loads(result_file.read_text())]

    return copy


def run_merge(defs: Definitions, table: str, end_us: int, manifest: str, submit: Submit = launch.submit) -> None:
    submit(
        "merge",
        ["--manifest", manifest, "--result", str(result_path(defs, table, end_us))],
        name=f"segrep-merge-{table}",
    )


def run_round(
    catalog: Catalog,
    defs: Definitions,
    table: str,
    until_us: int | None = None,
    *,
    target: str | None = None,
    reoffer: bool = False,
    submit: Submit = launch.submit,
) -> dict[str, Any]:
    """plan -> fast-forward each target -> merge (only if planned) -> commit; return the round report."""
    plan = plan_round(catalog, defs, table, until_us, target=target, reoffer=reoffer)
    for site in plan.targets:
        with contextlib.suppress(TargetUnreachable):  # recorded in the round; the others go on
            fast_forward_target(catalog, defs, table, site, plan.end_us, reoffer=reoffer,
                                big_copier=spark_copier(defs, table, plan.end_us, site, submit))  # fmt: skip
    if plan.manifest:
        run_merge(defs, table, plan.end_us, plan.manifest, submit)
    return commit_round(catalog, defs, table, plan.end_us, merge_ran=plan.manifest is not None)


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
) -> dict[str, Any]:
    """A whole split without Airflow (``segrep split``): start (or resume), copy passes until SPLIT_FINALIZE,
    an unload pass, UNLOAD_FINAL. One Spark application per pass that has rewrites or merges to run.
    If a parent placement cannot push yet (its site is down), the split stays in UNLOAD and a re-run
    continues it."""
    from segrep.split import workflow as sp

    if split_keys:
        ref = sp.start_split(catalog, table, partition_id, list(split_keys), is_async=is_async)
    else:
        ref = sp.find_split(catalog, table, partition_id)
    faults.point("split_after_start")
    passes: list[dict[str, Any]] = []

    def one_pass() -> sp.PassPlan:
        plan = sp.plan_pass(catalog, defs, ref.split_id)
        if plan.manifest:
            submit("merge", ["--manifest", plan.manifest, "--result", str(plan.result)], name=f"segrep-split-{table}")
        passes.append({**plan.to_dict(), "commit": sp.commit_pass(catalog, plan)})
        return plan

    for attempt in range(1, max_passes + 1):
        if sp.find_split(catalog, table, partition_id).state != sp.SplitState.SPLITTING:
            break
        plan = one_pass()
        try:
            sp.finalize(catalog, ref.split_id, plan.cut_entry_id)
        except SplitIncompleteError:
            if attempt == max_passes:
                raise
    faults.point("split_after_finalize")
    if sp.find_split(catalog, table, partition_id).state == sp.SplitState.UNLOAD:
        one_pass()
    finished = sp.finish(catalog, defs, ref.split_id)
    return {"split_id": ref.split_id, "table": table, "children": ref.children, "passes": passes, **finished}


def format_report(report: dict[str, Any], sites: Sequence[str] | None = None) -> str:
    """A few lines a person can read: per target what happened, merges, safe times."""
    lines = [f"round {report['round_id']} of {report['table']} up to {hlc.iso(report['end_us'])}: {report['status']}"]
    for site, r in sorted(report.get("targets", {}).items()):
        if sites and site not in sites:
            continue
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted((r.get("outcomes") or {}).items())) or "nothing to offer"
        extra = f"; {r['error']}" if r.get("error") else ""
        copied = f"; copied {r.get('segments_copied', 0)} segments, {r.get('bytes_copied', 0):,} bytes"
        lines.append(f"  {site}: {r['status']} ({outcomes}{copied}){extra}")
    merges = report.get("merges", {})
    if merges.get("items"):
        lines.append(
            f"  merges: {merges.get('committed', 0)}/{merges['items']} committed, {merges.get('rows_merged', 0):,} rows"
            f" kept of {merges.get('rows_in', 0):,} pushed"
        )
    for site, us in sorted((report.get("safe_time_us") or {}).items()):
        lines.append(f"  safe time at {site}: {hlc.iso(us)}")
    lines.append(f"  spark applications: {report.get('spark_apps', 0)}")
    return "\n".join(lines)
