"""The shares of links that a process holds for work another process paces (DESIGN section 17): a Spark
distributed copy's tasks, a merge's readers. The holder rewrites one small JSON file whenever a share changes
(a cap lowered by a time window, a holder arriving or leaving); each task's ``FollowingPacer`` reads its
link's rate from it again every second, so a change reaches copies and reads already running, not only the
next batch. The file is read by path: the executors must see the holder's directory (local Spark, or a
cluster sharing it); a task that cannot read it keeps the rate it was given.

Format: ``{"links": [{"source": ..., "target": ..., "bytes_per_s": int or null}]}``, the rate per task of
each link (null: unpaced, 0: held).
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path

from segrep.storage.atomic import write_json_atomic

RATES_DIR_ENV = "SEGREP_LINK_RATES_DIR"

# (source site, target site) -> bytes per second for each task of that link (None: unpaced, 0: held)
Rates = Mapping[tuple[str, str], int | None]


def rates_dir() -> Path:
    """Where a process keeps the rate files of the batches it hands to Spark: ``$SEGREP_LINK_RATES_DIR``, else
    the system's temporary directory (what local Spark's executors see)."""
    return Path(os.environ.get(RATES_DIR_ENV, "").strip() or tempfile.gettempdir())


def new_rates_path(folder: Path | None = None) -> Path:
    """A fresh rate file's path for one batch (``folder`` or ``rates_dir()``)."""
    return (folder or rates_dir()) / f"segrep-link-rates-{uuid.uuid4().hex}.json"


def write_rates(path: str | os.PathLike[str], rates: Rates) -> None:
    """Replace the file's rates (atomically: a reader sees the old rates or the new ones)."""
    doc = [{"source": s, "target": t, "bytes_per_s": r} for (s, t), r in sorted(rates.items())]
    write_json_atomic(path, {"links": doc})


def read_rate(path: str | os.PathLike[str], source: str, target: str) -> int | None:
    """The rate per task of ``source -> target`` in the file (None: unpaced). OSError if the file cannot be
    read, ValueError if it is not a rate file or does not name the link."""
    with open(path) as f:
        doc = json.load(f)
    for entry in doc["links"] if isinstance(doc, dict) and isinstance(doc.get("links"), list) else []:
        if isinstance(entry, dict) and entry.get("source") == source and entry.get("target") == target:
            rate = entry.get("bytes_per_s")
            if rate is None or (isinstance(rate, int) and rate >= 0):
                return rate
            raise ValueError(f"rate file {path}: {source} -> {target} has rate {rate!r}")
    raise ValueError(f"rate file {path} names no link {source} -> {target}")


def follower(path: str | os.PathLike[str], source: str, target: str) -> Callable[[], int | None]:
    """What a ``FollowingPacer`` asks: the link's rate in the file now."""
    return partial(read_rate, path, source, target)
