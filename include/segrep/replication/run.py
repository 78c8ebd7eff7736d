"""A whole round without Airflow (``segrep round``): the same steps, in the order the DAG runs them.

Airflow runs each step as its own task (fast-forward mapped per target, the merge as SparkSubmitOperator);
here they run one after another, with Spark launched by ``spark-submit`` through :mod:`segrep.spark.launch`.
A target that fails does not stop the others; the report says which failed.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from segrep.catalog import Catalog
from segrep.config.definitions import Definitions
from segrep.core import hlc
from segrep.replication.rounds import (
    Copier,
    CopyItem,
    CopyOutcome,
    TargetUnreachable,
    commit_round,
    fast_forward_target,
    plan_round,
)
from segrep.spark import launch
from segrep.spark.launch import Submit
from segrep.storage.atomic import write_json_atomic
from segrep.storage.workdir import copy_batch_paths, result_path


def spark_copier(defs: Definitions, table: str, end_us: int, site: str, submit: Submit = launch.submit) -> Copier:
    """A copier that runs one Spark distributed-copy application per batch it is given."""
    calls = 0

    def copy(items: list[CopyItem]) -> list[CopyOutcome]:
        nonlocal calls
        calls += 1
        items_file, result_file = copy_batch_paths(defs, table, end_us, site, calls)
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
