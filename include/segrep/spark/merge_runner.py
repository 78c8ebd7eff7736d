"""Where a merge manifest runs: in this process when its inputs are small, as a Spark application otherwise.

Every workflow that merges (round forks, compaction and failover-cut majors, split rewrites and UNLOAD merges,
and so catch-up, which runs rounds) calls :func:`run_merge_manifest` instead of submitting the Spark merge job
itself. It sums the manifest's input bytes (the catalog's file sizes, nothing read) and, when they are under
the policy's ``in_process_merge_max_bytes``, its input rows (the files' Parquet footers); under both
thresholds the manifest runs in process (``spark.in_process``), else ``submit`` runs ``spark_jobs/merge.py``
exactly as before. Either way the result file is written atomically where the commit step reads it, in the
same form, so the commit step does not care which engine ran (its report counts only Spark applications).
The policy's ``merge_engine`` (or ``SEGREP_MERGE_ENGINE``, or the caller's ``force``) pins one engine.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from segrep.config.policy import MERGE_ENGINES, Policy
from segrep.core import faults
from segrep.core.errors import SegrepError
from segrep.spark.in_process import run_manifest_in_process
from segrep.spark.launch import Submit
from segrep.spark.manifest import FileRef, Manifest
from segrep.spark.merge_items import MergeEngine, footer_rows
from segrep.storage.atomic import write_json_atomic
from segrep.storage.store_errors import first_line

ENGINE_ENV = "SEGREP_MERGE_ENGINE"  # auto | spark | in_process: overrides every table's policy
APP = "merge"  # spark_jobs/merge.py


@dataclass(frozen=True)
class MergeLimits:
    """The thresholds under which a manifest runs in process, and the engine setting (``auto`` decides)."""

    max_rows: int
    max_bytes: int
    engine: str = "auto"

    @classmethod
    def of(cls, policy: Policy) -> MergeLimits:
        return cls(policy.in_process_merge_max_rows, policy.in_process_merge_max_bytes, policy.merge_engine)


@dataclass(frozen=True)
class MergeRun:
    """Which engine ran a manifest, why, and how much it read. ``rows_in`` is None when the rows were not
    counted (an engine pinned, or the bytes alone over their threshold)."""

    engine: MergeEngine
    reason: str
    items: int
    bytes_in: int
    rows_in: int | None
    seconds: float = 0.0


def run_merge_manifest(
    manifest_path: str | os.PathLike[str],
    result_path: str | os.PathLike[str],
    *,
    submit: Submit,
    limits: MergeLimits,
    name: str,
    force: str = "auto",
) -> MergeRun:
    """Run the manifest on the engine :func:`choose_engine` picks; the result file is written either way
    (by the Spark job, or here). ``name`` is the Spark application's; ``force`` pins an engine for this call."""
    manifest = Manifest.load(manifest_path)
    choice = choose_engine(manifest, limits, force)
    started = time.monotonic()
    if choice.engine == MergeEngine.SPARK:
        submit(APP, ["--manifest", str(manifest_path), "--result", str(result_path)], name=name)
    else:
        write_json_atomic(result_path, _in_process(manifest, name))
    return MergeRun(
        choice.engine, choice.reason, choice.items, choice.bytes_in, choice.rows_in, time.monotonic() - started
    )


def _in_process(manifest: Manifest, name: str) -> dict[str, Any]:
    """The manifest's result, run here. What fails a Spark job (a leader site that cannot be written, a file
    that cannot be decoded) fails this as it does: a SegrepError saying so; an injected crash stays a crash."""
    try:
        return run_manifest_in_process(manifest)
    except (faults.InjectedFault, SegrepError):
        raise
    except Exception as exc:
        raise SegrepError(f"merge job {name} failed in process: {type(exc).__name__}: {first_line(exc)}") from exc


def choose_engine(manifest: Manifest, limits: MergeLimits, force: str = "auto") -> MergeRun:
    """The engine for ``manifest`` (nothing run yet): ``force``, else ``SEGREP_MERGE_ENGINE``, else the policy's
    ``merge_engine``; ``auto`` runs in process when both the input bytes and the input rows are within
    ``limits``. A setting that is none of ``auto``, ``spark``, ``in_process`` is a SegrepError naming it."""
    setting, origin = _setting(force, limits.engine)
    refs = [ref for item in manifest.items for ref in (*item.incoming, *item.visible)]
    bytes_in = sum(ref.byte_size for ref in refs)
    n = len(manifest.items)
    if setting != "auto":
        return MergeRun(MergeEngine(setting), f"{origin} {setting}", n, bytes_in, None)
    if bytes_in > limits.max_bytes:
        return MergeRun(MergeEngine.SPARK, f"{bytes_in} input bytes > {limits.max_bytes}", n, bytes_in, None)
    rows_in = sum(_rows(ref) for ref in refs)
    if rows_in > limits.max_rows:
        return MergeRun(MergeEngine.SPARK, f"{rows_in} input rows > {limits.max_rows}", n, bytes_in, rows_in)
    reason = f"{rows_in} input rows <= {limits.max_rows} and {bytes_in} bytes <= {limits.max_bytes}"
    return MergeRun(MergeEngine.IN_PROCESS, reason, n, bytes_in, rows_in)


def _setting(force: str, policy: str) -> tuple[str, str]:
    """The engine setting that applies, and where it comes from."""
    env = os.environ.get(ENGINE_ENV, "").strip()
    for value, origin in ((force, "forced"), (env, ENGINE_ENV), (policy, "policy merge_engine")):
        if value and value not in MERGE_ENGINES:
            raise SegrepError(f"{origin}: expected one of {', '.join(MERGE_ENGINES)}; got {value!r}")
        if value and value != "auto":
            return value, origin
    return "auto", "auto"


def _rows(ref: FileRef) -> int:
    """The file's rows by its footer; 0 for a file that cannot be read (the item is invalid on either engine,
    which says why)."""
    try:
        return footer_rows(ref)
    except (OSError, pa.ArrowException, SegrepError):
        return 0
