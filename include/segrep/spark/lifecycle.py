"""Spark processes never outlive the command that started them.

``spark-submit`` starts a JVM, which starts the Python driver, which starts Python workers. When the segrep
command that launched it is interrupted, the whole process group is killed (:func:`kill_group`); when it is
killed outright (kill -9, an OOM kill) it cannot clean up, so the kernel does: the JVM is started with a
parent-death signal, and the driver asks for one too (:func:`die_with_parent`, called by every job in
``spark_jobs/``). Workers exit on their own when the JVM that feeds them goes. Linux only; elsewhere these are
no-ops and an interrupted command still kills its group.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys

_PR_SET_PDEATHSIG = 1
# Loaded once at import: the child runs die_with_parent between fork and exec, where nothing may take a lock.
_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform.startswith("linux") else None


def die_with_parent(parent_pid: int | None = None) -> None:
    """Have the kernel SIGKILL this process when its parent dies. If the parent is already gone (it died
    before the request took effect, or ``parent_pid`` is not our parent any more), exit now."""
    if _LIBC is None:
        return
    _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    parent = os.getppid()
    if parent == 1 or (parent_pid is not None and parent != parent_pid):
        os._exit(1)


def kill_group(proc: subprocess.Popen[str]) -> None:
    """Kill a child started with ``start_new_session=True`` and everything it started, and reap it."""
    with contextlib.suppress(ProcessLookupError):  # it already went
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
