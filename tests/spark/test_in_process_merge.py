"""The in-process merge (``spark.in_process``) against the Spark job (``spark.jobs``) on the same manifests.

Generated cases (tests/support/forks.py): pushed segments of several origins with ties on ``_version``,
tombstones, leader chains, majors with a tombstone cutoff and an as-of, split rewrites and key ranges. Each
manifest runs on Spark (the session's SparkSession), is committed, the catalog is put back as it was, and the
same manifest runs in process and is committed: the result documents must be equal (but for ``engine``), the
output files byte for byte (so the rows and their order too), and the catalog afterwards the same.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings

from segrep.spark.in_process import run_manifest_in_process
from segrep.spark.jobs import run_manifest
from segrep.spark.manifest import Manifest
from segrep.spark.merge_items import MergeEngine
from segrep.spark.results import commit_results
from segrep.storage.atomic import write_json_atomic
from tests.support.env import Env, make_env, sqlite_url
from tests.support.forks import (
    MIX_YAML,
    ItemCase,
    cases,
    catalog_state,
    copy_catalog,
    one_write_one_row,
    restore_catalog,
    write_case,
)

pytestmark = pytest.mark.spark
KEY = "mix-merge-1"


def run_and_commit(env: Env, manifest_path: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """Record ``doc`` as the manifest's result, read its outputs, commit it; what each step left."""
    result_path = manifest_path.with_name("result.json")
    write_json_atomic(result_path, doc)
    outputs = {}
    for res in doc["items"]:
        if res["output"] is not None:
            path = env.site_dir("primary") / res["output"]["relpath"]
            outputs[res["item_id"]] = (path.read_bytes(), pq.read_table(path))
    summary = commit_results(env.catalog, manifest_path, result_path)
    return {"doc": doc, "outputs": outputs, "summary": asdict(summary), "catalog": catalog_state(env.catalog)}


def both_engines(spark: Any, case: list[ItemCase | None]) -> tuple[dict[str, Any], dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = make_env(root, sqlite_url(root), MIX_YAML)
        try:
            manifest = write_case(env, one_write_one_row(case), KEY)
            mpath = root / "manifest.json"
            manifest.write(mpath)
            manifest = Manifest.load(mpath)  # as the job reads it
            before = root / "before.db"
            copy_catalog(env.url, before)
            on_spark = run_and_commit(env, mpath, run_manifest(spark, manifest))
            restore_catalog(env.catalog, env.url, before)
            in_process = run_and_commit(env, mpath, run_manifest_in_process(manifest))
        finally:
            env.catalog.dispose()
    return on_spark, in_process


def comparable(rows: pa.Table) -> list[dict[str, Any]]:
    """The rows as Python values, a NaN as the text "NaN" (NaN equals nothing, itself included: Arrow's
    ``Table.equals`` finds two tables holding the same NaN unequal)."""
    return [{k: "NaN" if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in rows.to_pylist()]


def assert_same(on_spark: dict[str, Any], in_process: dict[str, Any]) -> None:
    assert on_spark["doc"].pop("engine") == MergeEngine.SPARK
    assert in_process["doc"].pop("engine") == MergeEngine.IN_PROCESS
    assert in_process["doc"] == on_spark["doc"]
    assert in_process["outputs"].keys() == on_spark["outputs"].keys()
    for item, (data, rows) in on_spark["outputs"].items():
        mine, my_rows = in_process["outputs"][item]
        assert comparable(my_rows) == comparable(rows), (item, my_rows.to_pylist(), rows.to_pylist())
        assert mine == data, item  # the same file, byte for byte
    assert (on_spark["summary"].pop("spark_apps"), in_process["summary"].pop("spark_apps")) == (1, 0)
    assert in_process["summary"] == on_spark["summary"]
    assert in_process["catalog"] == on_spark["catalog"]


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=cases())
def test_generated_manifests_give_the_same_outputs_results_and_commits(spark: Any, case: list[ItemCase | None]) -> None:
    on_spark, in_process = both_engines(spark, case)
    assert_same(on_spark, in_process)


def test_conflicts_ties_and_a_damaged_input(spark: Any, tmp_path: Path) -> None:
    """A fixed case with conflicts counted both ways (among the pushed rows and against the leader), ties on
    ``_version``; then one input file damaged: that item is invalid on both engines with the same error, the
    other still merged."""
    row = {"d": None, "t": None, "f": 1.5, "b": True, "s": "v", "day": None, "_deleted": False}
    leader = [[{**row, "g": "a", "k": k, "_version": 5, "_origin": 1} for k in range(4)]]
    pushed = [
        ("dr", [{**row, "g": "a", "k": k, "_version": 5, "_origin": 2, "s": "dr"} for k in range(3)]),
        ("edge", [{**row, "g": "a", "k": k, "_version": 5, "_origin": 3, "s": "edge"} for k in (1, 2, 5)]),
    ]
    merge = ItemCase("merge", leader, pushed, {"2": 1, "3": 1}, None, None, None, False)
    major = ItemCase(
        "major", [[{**row, "g": "x", "k": 1, "_version": 2, "_origin": 2}]], [], {}, None, None, None, False
    )
    on_spark, in_process = both_engines(spark, [merge, major])
    conflicts = on_spark["doc"]["items"][0]["conflicts"]
    assert {(c["site_id"], c["by_site_id"]): c["rows"] for c in conflicts} == {(2, 3): 2, (1, 3): 2, (1, 2): 1}
    assert_same(on_spark, in_process)

    env = make_env(tmp_path, sqlite_url(tmp_path), MIX_YAML)
    manifest = write_case(env, [merge, major], KEY)
    damaged = manifest.items[0].incoming[1]
    path = env.site_dir(damaged.site) / damaged.relpath
    path.write_bytes(path.read_bytes()[:-9] + b"x" * 9)
    docs = [run_manifest(spark, manifest), run_manifest_in_process(manifest)]
    for doc in docs:
        doc.pop("engine")
        bad, good = doc["items"]
        assert bad["status"] == "invalid" and damaged.relpath in bad["error"] and "does not match" in bad["error"]
        assert good["status"] == "ok" and good["rows_out"] == 1
    assert docs[0] == docs[1]
    env.catalog.dispose()


def test_an_empty_major_as_of_a_cut_is_written_by_both(spark: Any) -> None:
    """A major as of an instant before every row: no row, but the output is written (its place in the chain
    matters), the same on both engines."""
    row = {"d": None, "t": None, "f": None, "b": None, "s": None, "day": None, "_deleted": False, "_origin": 1}
    chain = [[{**row, "g": "a", "k": 1, "_version": 7}], [{**row, "g": "b", "k": 2, "_version": 9}]]
    case = ItemCase("major", chain, [], {}, None, 3, None, False)
    on_spark, in_process = both_engines(spark, [case, replace(case, leader=[[{**chain[0][0], "g": "q"}]])])
    assert [r["rows_out"] for r in on_spark["doc"]["items"]] == [0, 0]
    assert all(r["output"] is not None for r in on_spark["doc"]["items"])
    assert_same(on_spark, in_process)
