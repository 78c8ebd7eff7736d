"""The short, seeded version of ``bench/chaos.py``: writers and rounds killed with SIGKILL at random moments,
a full disk, a replica site unreachable; then heal, rounds until idle, every site compared with the replay of
the acknowledged writes. SQLite catalog (the PostgreSQL restart is the bench's: it restarts the shared server).
The full run (60+ kills, PostgreSQL restarted) is `python bench/chaos.py`; its figures are in the README."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"


def _chaos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("segrep_bench_chaos", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def test_a_short_chaos_run_loses_nothing_and_converges(tmp_path: Path) -> None:
    chaos = _chaos()
    report = chaos.chaos_run(seed=11, kills=8, kind="sqlite", pg_restart=False, root=tmp_path)
    text = chaos.format_report(report)
    assert report.kills >= 8, text
    assert len(report.faults) == 2, text  # the full disk and the unreachable site happened
    assert report.converged, text
    assert (report.rows_lost, report.rows_resurrected, report.rows_wrong, report.duplicates) == (0, 0, 0, 0), text
    assert report.replica_differences == {"dr": 0, "edge": 0}, text
    assert report.published_differences == {"primary": 0, "dr": 0, "edge": 0}, text
    assert report.writes_acked > 0 and report.rows_at_leader > 0, text
    assert report.writes_failed == 2, text  # exactly the two written while the disk was full


def test_the_replay_allows_a_killed_write_all_or_nothing() -> None:
    chaos = _chaos()
    b = chaos.Batch
    batches = [b(0, [1, 2], False, "acked"), b(1, [2, 3], False, "killed"), b(2, [1], True, "acked")]
    batches.append(b(3, [4], False, "failed"))
    assert chaos.allowed_states(batches) == {1: {None}, 2: {"b0", "b1"}, 3: {None, "b1"}}
