"""The Spark applications a round's steps start: the distributed copy of a big batch, and the merge.

``submit`` starts them: ``spark-submit`` through :mod:`segrep.spark.launch` in ``segrep round``, the Airflow
connection's hook inside a task; a merge runs in process when small (:mod:`segrep.spark.merge_runner`
decides). The steps themselves are in :mod:`segrep.replication.orchestrator`.
"""

from __future__ import annotations

import itertools
import json
from contextlib import nullcontext
from dataclasses import asdict

from segrep.catalog.link_lease import LinkPacing
from segrep.config.definitions import Definitions
from segrep.spark import launch
from segrep.spark.launch import Submit
from segrep.spark.link_pacing import paced_merge
from segrep.spark.merge_runner import MergeLimits, MergeRun, run_merge_manifest
from segrep.storage.atomic import write_json_atomic
from segrep.storage.transport import Copier, CopyItem, CopyOutcome
from segrep.storage.workdir import copy_batch_paths, result_path


def spark_copier(defs: Definitions, table: str, end_us: int, site: str, submit: Submit = launch.submit) -> Copier:
    """A copier that runs one Spark distributed-copy application per batch it is given."""
    numbers = itertools.count(1)  # the partitions' threads call at once: each batch takes its own number

    def copy(items: list[CopyItem]) -> list[CopyOutcome]:
        items_file, result_file = copy_batch_paths(defs, table, end_us, site, next(numbers))
        write_json_atomic(items_file, [asdict(i) for i in items])
        submit(
            "distributed_copy", ["--items", str(items_file), "--result", str(result_file)], name=f"segrep-copy-{table}"
        )
        return [CopyOutcome(**raw) for raw in json.loads(result_file.read_text())]

    return copy


def run_merge(
    defs: Definitions,
    table: str,
    end_us: int,
    manifest: str,
    submit: Submit = launch.submit,
    *,
    force: str = "auto",
    pacing: LinkPacing | None = None,
) -> MergeRun:
    """The round's merge manifest, in process or on Spark by the table's policy (``spark.merge_runner``), or on
    the engine ``force`` names; with ``pacing``, its reads across defined links go at their share."""
    with paced_merge(manifest, pacing) if pacing is not None else nullcontext():
        return run_merge_manifest(
            manifest,
            result_path(defs, table, end_us),
            submit=submit,
            limits=MergeLimits.of(defs.policy(table)),
            name=f"segrep-merge-{table}",
            force=force,
        )
