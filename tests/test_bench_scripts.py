"""The benchmark scripts still run, at the smallest scale that takes every code path.

Their figures are measured by hand on an idle machine (README, Benchmarks); here only that each script runs to
the end and prints its table, so a change to the catalog or an API cannot leave a benchmark broken until the
next time someone measures (a join made ambiguous by a new foreign key, a failover refused by a new rule,
both happened). The Spark-heavy ones (maintenance, the merge of rounds, the Spark side of merge_crossover; the
ring of topologies merges in process at this size) and the long ones
(chaos, airflow_lag: its short version is ``tests/replication/test_chaos.py``) are not run here. open_tables'
writer part starts a standalone Spark cluster: at a tiny scale it runs here, marked ``spark``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SCRIPTS = {
    "object_store": ["--scale", "0.01", "--batches", "2", "--repeats", "1"],
    "copy_cpu": ["--files", "2", "--size-mb", "1", "--repeats", "1"],
    "cli_startup": ["--rows", "200", "--repeats", "1", "--publish"],
    "failover": [
        *("--scale", "0.01", "--repeats", "1", "--promote-partitions", "20", "--promote-segments", "300"),
        *("--promote-new", "5", "--switch-partitions", "10", "--switch-mb", "100", "--switch-batches", "2"),
        *("--batches", "2", "--max-rounds", "4", "--skip-failback-merge"),  # (d) runs a Spark merge
    ],
    "write_read": ["--scale", "0.01", "--batches", "2", "--repeats", "1"],
    "operator_page": [
        *("--partitions", "20", "--segments", "100", "--new", "5", "--days", "1", "--round-every-s", "3600"),
        *("--repeats", "1"),
    ],
    "merge_crossover": ["--sizes", "10,1000", "--repeats", "1", "--skip-spark"],
    "topologies": ["--scale", "0.01", "--batches", "2", "--ring-batches", "2"],
    "links": ["--mb", "4", "--cap", "4", "--s3-cap", "4", "--repeats", "1", "--window", "3", "--round-every", "0.5"],
    "open_tables": [
        *("--scale", "0.01", "--rounds", "2", "--update-rows", "200", "--history-segments", "64", "--repeats", "1"),
        *("--delete-files", "20", "--delete-rows", "50"),
        *("--writer-repeats", "1", "--writer-ceiling", "--cores", "1", "--memory", "1g", "--executor-memory", "768m"),
    ],
    "rounds": [
        *("--scale", "0.01", "--batches", "2", "--repeats", "1", "--noop-repeats", "1", "--skip-merge"),
        *("--batched-sample", "200", "--row-sample", "100", "--batch-rows", "50", "--plan-partitions", "20"),
        *("--plan-segments", "1000", "--plan-repeats", "1"),
    ],
}
# a line the table must hold, and end with MET: a target that is a property at any size (rounds (f): the round
# after a schema change moves exactly the new write's segments and rewrites nothing)
MET_LINES = {
    "rounds": ("(f) round after the change and a write",),
    # a link's cap is never exceeded, on either pair, at any size (over windows of a few seconds)
    "links": ("local: cap, round + bootstrap + scrub, max over", "s3: cap, round + bootstrap + scrub, max over"),
}
# lines the table must hold whatever their figures: the baselines that bound a target (how many of each)
PRESENT_LINES = {"open_tables": {"(publish, floor)": 1, "(writer, ceiling)": 2, "(deletes)": 1}}
# where a script writes by default (its TPC-H cache, its results), sent to the test's directory instead
OPTIONS = {
    "object_store": ("--tpch-dir", "--work-dir"),
    "copy_cpu": ("--work-dir",),
    "cli_startup": ("--work-dir",),
    "failover": ("--tpch-dir", "--work-dir"),
    "write_read": ("--tpch-dir",),
    "operator_page": (),
    "merge_crossover": ("--work-dir", "--results-dir"),
    "topologies": ("--tpch-dir",),
    "rounds": ("--tpch-dir", "--work-dir", "--results-dir"),
    "links": ("--work-dir",),
    "open_tables": ("--tpch-dir", "--work-dir"),
}
# scripts that need more than the machine (marked as the tests that need it are)
MARKS = {"open_tables": pytest.mark.spark}


@pytest.mark.parametrize("script", [pytest.param(s, marks=MARKS.get(s, ())) for s in sorted(SCRIPTS)])
def test_the_benchmark_runs_to_the_end(script: str, pg_server: str, tmp_path: Path) -> None:
    args = list(SCRIPTS[script])
    for option in OPTIONS[script]:
        where = tmp_path / option.strip("-")
        where.mkdir()
        args += [option, str(where)]
    done = run_bench(script, args, tmp_path)
    for prefix in MET_LINES.get(script, ()):
        lines = table_lines(done, prefix)
        assert len(lines) == 1 and lines[0].endswith("| MET |"), done.stdout[-3000:]
    for prefix, count in PRESENT_LINES.get(script, {}).items():
        assert len(table_lines(done, prefix)) == count, done.stdout[-3000:]


def test_the_open_tables_publication_runs_with_dr_on_an_object_store(tmp_path: Path) -> None:
    """``--dr-store s3``: `dr` on a moto server the bench starts itself; its rounds upload, its publications write
    their metadata to the store, and both are measured."""
    tpch = tmp_path / "tpch"
    tpch.mkdir()
    args = ["--part", "publish", "--dr-store", "s3", "--scale", "0.01", "--rounds", "1", "--update-rows", "200"]
    done = run_bench("open_tables", [*args, "--tpch-dir", str(tpch)], tmp_path)
    assert len(table_lines(done, "(publish) round after a write")) == 2, done.stdout[-3000:]
    assert len(table_lines(done, "(publish, floor)")) == 1, done.stdout[-3000:]


def table_lines(done: subprocess.CompletedProcess[str], prefix: str) -> list[str]:
    """The lines of the bench's table whose first cell starts with ``prefix``."""
    return [line for line in done.stdout.splitlines() if line.startswith(f"| {prefix}")]


def run_bench(script: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``bench/<script>.py args`` run to the end in ``cwd``: exit 0 and no traceback, or the test fails."""
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / f"{script}.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"{script}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done
