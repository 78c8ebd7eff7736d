"""Named fault-injection points, switched on by configuration (``SEGREP_FAULTS``), for crash tests.

A crash test sets ``SEGREP_FAULTS=after_copy_before_commit`` (comma-separated names), runs a step, sees it
die at that point, clears the variable and re-runs: the system must converge with nothing lost and nothing
duplicated. With the variable unset, :func:`point` costs one dictionary look-up.

``NAME:hang`` instead stops the process at that point until it is killed (after one line on stderr saying so):
how the kill -9 tests and ``bench/chaos.py`` catch a round exactly there. ``NAME:enospc`` raises the OSError a
full disk raises (``disk_full:enospc``: every atomic local write fails as on a full file system).
"""

from __future__ import annotations

import errno
import os
import sys
import time

FAULTS_ENV = "SEGREP_FAULTS"
POINTS = (
    "before_copy",  # a fast-forward offer was leased, nothing copied yet
    "after_copy_before_commit",  # the file is at the target under its final name; the catalog does not know it
    "after_commit_before_ack",  # the receiver committed the segment; the sender has not recorded the ack
    "in_merge_job",  # inside the Spark merge job, after the first output file was written
    "before_checkpoint",  # acks and merges are committed; checkpoints and safe time are not
    "split_after_start",  # the split and its children exist; nothing was rewritten yet
    "split_before_finalize",  # every child acked the copy pass; SPLIT_FINALIZE has not committed
    "split_after_finalize",  # writes go to the children; no parent placement has unloaded yet
    "split_before_parent_files",  # UNLOAD_FINAL committed; the parent's files are still on the sites
    "mid_upload",  # every part of a multipart upload to an S3 store is sent; the upload is not completed
    "disk_full",  # an atomic local write has written its bytes (a full disk says so here); nothing renamed yet
    "failover_before_commit",  # a table's leaders are moved in the transaction; it has not committed
    "failover_between_tables",  # one table of a multi-table failover committed; the next has not started
    "switchover_before_promote",  # writes paused and the new leader drained; nothing promoted yet
    "write_between_batches",  # a one-commit write of several batches (table rewrite) wrote a batch's files
    "publish_before_commit",  # an Iceberg publication wrote its files; the catalog still names the old snapshot
    "in_spark_write",  # a Spark writer's task wrote a segment file (final name); nothing is committed
)


HANG_MARK = "segrep: fault point hanging: "


class InjectedFault(RuntimeError):
    """The crash a fault point simulates. Not a SegrepError: nothing should handle it as a user error."""


def point(name: str) -> None:
    """Raise InjectedFault if the fault ``name`` is switched on."""
    if name not in POINTS:
        raise ValueError(f"unknown fault point {name!r}; known: {', '.join(POINTS)}")
    enabled = os.environ.get(FAULTS_ENV, "")
    if not enabled:
        return
    wanted = {x.strip() for x in enabled.split(",")}
    if name in wanted:
        raise InjectedFault(f"injected fault at {name}")
    if f"{name}:enospc" in wanted:
        raise OSError(errno.ENOSPC, f"No space left on device (injected at {name})")
    if f"{name}:hang" in wanted:
        # one write of the whole line: two threads reaching the point at once must not interleave their lines
        sys.stderr.flush()
        os.write(sys.stderr.fileno(), f"{HANG_MARK}{name}\n".encode())
        while True:  # until killed
            time.sleep(3600)
