"""A whole round without Airflow (``segrep round``): the same steps, in the order the DAG runs them.

Airflow runs each step as its own task (fast-forward mapped per target, the merge as SparkSubmitOperator);
here they run one after another, a small merge in process and a large one with Spark launched by
``spark-submit`` through :mod:`segrep.spark.launch` (:mod:`segrep.spark.merge_runner` decides).
A target that fails does not stop the others; the report says which failed.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict

from segrep.catalog import Catalog
from segrep.config.definitions import Definitions
from segrep.replication.commit import commit_round
from segrep.replication.fast_forward import Copier, CopyItem, CopyOutcome, fast_forward_target
from segrep.replication.heartbeat import heartbeat
from segrep.replication.plan import plan_round
from segrep.replication.reports import RoundReport
from segrep.replication.round import TargetUnreachable, round_key
from segrep.spark import launch
from segrep.spark.launch import Submit
from segrep.spark.merge_runner import MergeLimits, MergeRun, run_merge_manifest
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


def run_merge(defs: Definitions, table: str, end_us: int, manifest: str, submit: Submit = launch.submit) -> MergeRun:
    """The round's merge manifest, in process or on Spark by the table's policy (``spark.merge_runner``)."""
    return run_merge_manifest(
        manifest,
        result_path(defs, table, end_us),
        submit=submit,
        limits=MergeLimits.of(defs.policy(table)),
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
    copier: Copier | None = None,
) -> RoundReport:
    """plan -> fast-forward each target -> merge (only if planned) -> commit; return the round report.

    ``copier`` copies the batches below the policy's ``spark_copy_threshold_bytes`` (by default one pool of
    threads per target, ``CopyPool``); larger ones go to the Spark distributed copy through ``submit``."""
    plan = plan_round(catalog, defs, table, until_us, target=target, reoffer=reoffer)
    with heartbeat(catalog, round_key(table, plan.end_us)):  # the merge leases live while this process does
        for site in plan.targets:
            big = spark_copier(defs, table, plan.end_us, site, submit)
            with contextlib.suppress(TargetUnreachable):  # recorded in the round; the others go on
                fast_forward_target(
                    catalog, defs, table, site, plan.end_us, reoffer=reoffer, copier=copier, big_copier=big
                )
        if plan.manifest:
            run_merge(defs, table, plan.end_us, plan.manifest, submit)
    return commit_round(catalog, defs, table, plan.end_us, merge_ran=plan.manifest is not None)
