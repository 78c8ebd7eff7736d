"""Every path under the work directory (``<data_dir>/work``), in one place.

The work directory holds what passes between a Python step and its Spark step: manifests, result files and
copy batches. Each workflow has its own folder or files per run (a round's interval end, a split, a
compaction or verify key), so a retried step finds its own files and two runs never share one.
"""

from __future__ import annotations

from pathlib import Path

from segrep.config.definitions import Definitions


def work_root(defs: Definitions) -> Path:
    return defs.data_dir / "work"


def round_dir(defs: Definitions, table: str, end_us: int) -> Path:
    return work_root(defs) / "rounds" / table / str(end_us)


def manifest_path(defs: Definitions, table: str, end_us: int) -> Path:
    """A round's merge manifest (written by the plan step, read by the Spark merge job)."""
    return round_dir(defs, table, end_us) / "merge-manifest.json"


def result_path(defs: Definitions, table: str, end_us: int) -> Path:
    """A round's merge result (written by the Spark merge job, read by the commit step)."""
    return round_dir(defs, table, end_us) / "merge-result.json"


def copy_batch_paths(defs: Definitions, table: str, end_us: int, site: str, n: int) -> tuple[Path, Path]:
    """The items and result files of the ``n``-th Spark distributed copy of a round to ``site``."""
    folder = round_dir(defs, table, end_us)
    return folder / f"copy-{site}-{n}.json", folder / f"copy-{site}-{n}-result.json"


def split_dir(defs: Definitions, table: str, split_id: int) -> Path:
    return work_root(defs) / "splits" / table / str(split_id)


def split_pass_paths(defs: Definitions, table: str, split_id: int, phase: str, now_us: int) -> tuple[Path, Path]:
    """The manifest and result files of one split pass (phase and start time make each pass's own)."""
    folder = split_dir(defs, table, split_id)
    return folder / f"{phase}-{now_us}-manifest.json", folder / f"{phase}-{now_us}-result.json"


def compaction_dir(defs: Definitions, table: str, key: str) -> Path:
    return work_root(defs) / "compaction" / table / key


def compaction_paths(defs: Definitions, table: str, key: str) -> tuple[Path, Path]:
    """The manifest and result files of one compaction run."""
    folder = compaction_dir(defs, table, key)
    return folder / "manifest.json", folder / "result.json"


def verify_paths(defs: Definitions, table: str, key: str) -> tuple[Path, Path]:
    """The digest manifest and result files of one verify run's Spark job (``key`` names the run)."""
    folder = work_root(defs) / "verify" / table
    return folder / f"{key}-manifest.json", folder / f"{key}-result.json"
