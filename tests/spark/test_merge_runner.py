"""Which engine runs a merge manifest (``spark.merge_runner``), and the in-process twin on bad input files.

No Spark here: ``submit`` is a stand-in that records what it was asked to run. The engines' equality is
tests/spark/test_in_process_merge.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from segrep.core import faults
from segrep.core.errors import SegrepError
from segrep.spark import in_process
from segrep.spark.in_process import run_manifest_in_process
from segrep.spark.manifest import Manifest
from segrep.spark.merge_items import MergeEngine
from segrep.spark.merge_runner import ENGINE_ENV, MergeLimits, choose_engine, run_merge_manifest
from segrep.spark.results import commit_results
from tests.support.env import Env, make_env, sqlite_url
from tests.support.forks import MIX_YAML, TABLE, ItemCase, write_case

ROW = {"d": None, "t": None, "f": None, "b": None, "s": "v", "day": None, "_deleted": False}


class Recorded:
    """A ``submit`` that records its calls (no Spark application is started)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str], str]] = []

    def __call__(self, app: str, args: Sequence[str], *, name: str, master: str | None = None) -> None:
        self.calls.append((app, list(args), name))


def rows(g: str, keys: range, version: int, origin: int) -> list[dict[str, Any]]:
    return [{**ROW, "g": g, "k": k, "_version": version, "_origin": origin} for k in keys]


@pytest.fixture
def forked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Env, Path, Manifest]]:
    """A manifest merging 2 + 3 pushed rows into a leader of 4 (partition a-m), and a major of 2 rows (m-)."""
    monkeypatch.delenv(ENGINE_ENV, raising=False)
    env = make_env(tmp_path, sqlite_url(tmp_path), MIX_YAML)
    merge = ItemCase(
        "merge", [rows("a", range(4), 5, 1)], [("dr", rows("a", range(2), 6, 2)), ("edge", rows("b", range(3), 7, 3))],
        {}, None, None, None, False,
    )  # fmt: skip
    major = ItemCase("major", [rows("x", range(2), 3, 1)], [], {}, None, None, None, False)
    manifest = write_case(env, [merge, major], f"{TABLE}-merge-1")
    path = tmp_path / "manifest.json"
    manifest.write(path)
    yield env, path, manifest
    env.catalog.dispose()


def bytes_of(manifest: Manifest) -> int:
    return sum(ref.byte_size for it in manifest.items for ref in (*it.incoming, *it.visible))


def test_under_both_thresholds_it_runs_in_process(forked: tuple[Env, Path, Manifest]) -> None:
    env, path, manifest = forked
    submit, result = Recorded(), path.with_name("result.json")
    run = run_merge_manifest(path, result, submit=submit, limits=MergeLimits(11, bytes_of(manifest)), name="n")
    assert submit.calls == [] and run.engine == MergeEngine.IN_PROCESS
    assert (run.items, run.rows_in, run.bytes_in) == (2, 4 + 2 + 3 + 2, bytes_of(manifest))
    doc = json.loads(result.read_text())
    assert doc["engine"] == "in_process" and [r["rows_out"] for r in doc["items"]] == [5, 2]
    summary = commit_results(env.catalog, path, result)
    # rows_in: what each item read (a merge its pushed rows; the leader's keys are only looked up)
    assert (summary.committed, summary.rows_merged, summary.rows_in, summary.spark_apps) == (2, 7, 5 + 2, 0)


@pytest.mark.parametrize(
    ("limits", "rows_counted"),
    [(MergeLimits(10**9, 1), False), (MergeLimits(10, 10**12), True)],  # too many bytes; too many rows (11)
)
def test_over_either_threshold_it_submits_the_spark_job(
    forked: tuple[Env, Path, Manifest], limits: MergeLimits, rows_counted: bool
) -> None:
    _env, path, _manifest = forked
    submit, result = Recorded(), path.with_name("result.json")
    run = run_merge_manifest(path, result, submit=submit, limits=limits, name="segrep-merge-mix")
    assert submit.calls == [("merge", ["--manifest", str(path), "--result", str(result)], "segrep-merge-mix")]
    assert run.engine == MergeEngine.SPARK and not result.exists()  # the job writes it
    assert run.rows_in == (11 if rows_counted else None)
    assert ("rows" if rows_counted else "bytes") in run.reason


def test_an_engine_is_pinned_by_the_call_then_the_environment_then_the_policy(
    forked: tuple[Env, Path, Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    _env, _path, manifest = forked
    small, big = MergeLimits(10**9, 10**12), MergeLimits(0, 0)
    assert choose_engine(manifest, small).engine == MergeEngine.IN_PROCESS
    assert choose_engine(manifest, big).engine == MergeEngine.SPARK
    assert choose_engine(manifest, MergeLimits(10**9, 10**12, "spark")).engine == MergeEngine.SPARK
    assert choose_engine(manifest, MergeLimits(0, 0, "in_process")).engine == MergeEngine.IN_PROCESS
    monkeypatch.setenv(ENGINE_ENV, "spark")
    pinned = choose_engine(manifest, MergeLimits(10**9, 10**12, "in_process"))
    assert pinned.engine == MergeEngine.SPARK and ENGINE_ENV in pinned.reason and pinned.rows_in is None
    assert choose_engine(manifest, small, force="in_process").engine == MergeEngine.IN_PROCESS
    monkeypatch.setenv(ENGINE_ENV, "auto")
    assert choose_engine(manifest, MergeLimits(0, 0, "in_process")).engine == MergeEngine.IN_PROCESS
    monkeypatch.setenv(ENGINE_ENV, "jvm")
    with pytest.raises(SegrepError, match=f"{ENGINE_ENV}: expected one of auto, spark, in_process; got 'jvm'"):
        choose_engine(manifest, small)
    with pytest.raises(SegrepError, match="forced: expected one of"):
        choose_engine(manifest, small, force="fast")


def test_a_damaged_or_missing_input_makes_only_its_item_invalid(forked: tuple[Env, Path, Manifest]) -> None:
    env, path, manifest = forked
    pushed = manifest.items[0].incoming[1]
    damaged = env.site_dir(pushed.site) / pushed.relpath
    damaged.write_bytes(damaged.read_bytes().replace(b"v", b"w"))  # same size, other bytes
    bad, good = run_manifest_in_process(manifest)["items"]
    assert bad["status"] == "invalid" and bad["output"] is None and (bad["rows_in"], bad["rows_out"]) == (0, 0)
    assert str(damaged) in bad["error"] and "does not match the catalog" in bad["error"]
    assert good["status"] == "ok" and good["rows_out"] == 2

    damaged.unlink()
    run = choose_engine(manifest, MergeLimits(10**9, 10**12))  # the missing file counts no row
    assert run.engine == MergeEngine.IN_PROCESS and run.rows_in == 4 + 2 + 2
    bad, _good = run_manifest_in_process(manifest)["items"]
    assert bad["status"] == "invalid" and f"segment file {damaged} is missing" in bad["error"]
    result = path.with_name("result.json")
    run_merge_manifest(path, result, submit=Recorded(), limits=MergeLimits(10**9, 10**12), name="n")
    summary = commit_results(env.catalog, path, result)
    assert summary.committed == 1 and [p.item for p in summary.invalid] == [manifest.items[0].item_id]


def test_a_failure_in_process_is_a_merge_error_and_an_injected_crash_stays_one(
    forked: tuple[Env, Path, Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What would fail the Spark job (here: a file that cannot be decoded after its checks) fails the in-process
    run as a SegrepError naming the job, with no result file; an injected crash propagates as itself."""
    _env, path, _manifest = forked
    result, limits = path.with_name("result.json"), MergeLimits(10**9, 10**12)

    def undecodable(*_args: Any) -> None:
        raise OSError("Parquet magic bytes not found in footer")

    monkeypatch.setattr(in_process, "read_file", undecodable)
    with pytest.raises(SegrepError, match="merge job segrep-merge-mix failed in process: OSError: Parquet magic"):
        run_merge_manifest(path, result, submit=Recorded(), limits=limits, name="segrep-merge-mix")
    assert not result.exists()
    monkeypatch.undo()
    monkeypatch.setenv(faults.FAULTS_ENV, "in_merge_job")
    with pytest.raises(faults.InjectedFault):
        run_merge_manifest(path, result, submit=Recorded(), limits=limits, name="n")
    assert not result.exists()
