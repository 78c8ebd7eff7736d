"""`segrep verify` on Spark (DESIGN sections 8 and 13): partitions at or above the policy's
``verify_spark_threshold_bytes`` are digested by one Spark application per verify run, with digests EQUAL to
the in-process ones for the same rows (every column type), and only those whose digests differ are read in
process to name the keys."""

from __future__ import annotations

import datetime as dt
import json
import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from segrep.core import hlc
from segrep.core import schema as sch
from segrep.data.digest import table_digest
from segrep.data.reader import placement_files, placement_rows, resolve
from segrep.data.writer import write_batch
from segrep.maintenance import verify as verify_module
from segrep.maintenance.verify import RowCheck, Verdict, verify
from segrep.maintenance.verify_spark import SparkDigests
from segrep.spark import launch
from segrep.spark.digest_job import run_digests
from segrep.spark.digest_manifest import DigestManifest
from segrep.spark.items import digest_item
from tests.support.cli import cli
from tests.support.damage import change_payload, copies_at, copy_holding, rewrite_segment, truncate
from tests.support.env import ORDERS_YAML, Env, make_env
from tests.support.models import Model
from tests.support.rounds import round_until_idle
from tests.support.spark import spark_submit_in
from tests.support.tables import TABLE

pytestmark = pytest.mark.spark

ON_SPARK_YAML = ORDERS_YAML.replace(
    "    replicas: [dr, edge]\n", "    replicas: [dr, edge]\n    policy: {verify_spark_threshold_bytes: 1}\n"
)

TYPED_YAML = """
data_dir: data
sites:
  primary: {id: 1, uri: sites/primary}
tables:
  typed:
    columns: {tag: string, k: int64, b: bool, i8: int8, i16: int16, i32: int32, f32: float32, f64: float64,
              bin: binary, d: date, ts: timestamp, dec: 'decimal(15,2)', note: string}
    primary_key: [tag, k]
    partition_key: tag
    split_points: [m]
    leader: primary
"""


def _typed(keys: range, note: str) -> pa.Table:
    """Every column type, with nulls, NaN, -0.0, infinities, separators and non-ASCII text in the values."""
    floats = [math.nan, -0.0, math.inf, -math.inf, 1e-310, 2.5, None]
    return pa.table(
        {
            "tag": [["a", "b:c", "x", "zé"][k % 4] for k in keys],
            "k": pa.array(list(keys), pa.int64()),
            "b": pa.array([None if k % 5 == 0 else k % 2 == 0 for k in keys], pa.bool_()),
            "i8": pa.array([(k % 256) - 128 for k in keys], pa.int8()),
            "i16": pa.array([None if k % 7 == 0 else -k for k in keys], pa.int16()),
            "i32": pa.array([k * 1000 for k in keys], pa.int32()),
            "f32": pa.array([floats[k % len(floats)] for k in keys], pa.float32()),
            "f64": pa.array([floats[(k + 3) % len(floats)] for k in keys], pa.float64()),
            "bin": pa.array([None if k % 3 == 0 else bytes([k % 256, 58, 45]) for k in keys], pa.binary()),
            "d": pa.array([dt.date(1900 + k % 200, 1 + k % 12, 1 + k % 28) for k in keys], pa.date32()),
            "ts": pa.array(
                [
                    None if k % 4 == 1 else dt.datetime(1969, 12, 31, 23, 59, tzinfo=dt.UTC) + dt.timedelta(seconds=k)
                    for k in keys
                ],
                pa.timestamp("us", tz="UTC"),
            ),
            "dec": pa.array(
                [None if k % 6 == 0 else Decimal(f"{k - 50}.{k % 100:02d}") for k in keys], pa.decimal128(15, 2)
            ),
            "note": [f"{note}{k}" if k % 9 else "" for k in keys],
        }
    )


def test_spark_and_in_process_digests_are_equal_for_every_column_type(tmp_path: Path, spark: Any) -> None:
    env = make_env(tmp_path, f"sqlite:///{tmp_path}/catalog.db", TYPED_YAML)
    write_batch(env.catalog, "typed", _typed(range(0, 120), "first"))
    middle = hlc.now_us()
    write_batch(env.catalog, "typed", _typed(range(60, 200), "second"))  # updates overlap the first batch
    write_batch(env.catalog, "typed", _typed(range(0, 30), "").select(["tag", "k"]), delete=True)
    info, placements = placement_files(env.catalog, "typed")
    items, expected = [], {}
    for pf in placements:
        raw = placement_rows(info, pf)
        for pin in (middle, hlc.now_us()):
            rows = resolve(raw.filter(pc.field(sch.VERSION_COL) <= pin), info.primary_key)
            item = digest_item(pf, pin)
            items.append(item)
            expected[item.item_id] = table_digest(rows, info.schema.names)
    manifest = DigestManifest("t", "typed", list(info.row.columns.items()), list(info.primary_key), "tag", items)

    got = {o.item_id: o.digest for o in run_digests(spark, manifest)}

    assert got == expected
    assert sum(d.rows for d in expected.values()) > 200 and len(set(expected.values())) == len(expected)
    env.catalog.dispose()


@pytest.fixture
def digest_env(tmp_path: Path) -> Any:
    env = make_env(tmp_path, f"sqlite:///{tmp_path}/catalog.db", ON_SPARK_YAML)
    model = Model()
    model.upsert(env, range(300), "a")
    model.upsert(env, range(200, 400), "b")
    model.delete(env, range(0, 10))
    round_until_idle(env)
    yield env
    env.catalog.dispose()


def _facts(rows: list[RowCheck]) -> list[tuple[Any, ...]]:
    """What a row check found, whoever computed it."""
    return sorted(
        (r.partition_id, r.site, r.verdict, r.leader, r.replica, r.only_at_leader, r.only_at_replica, r.different)
        for r in rows
    )


def test_one_spark_submit_digests_every_large_partition_and_finds_a_planted_difference(digest_env: Env) -> None:
    env = digest_env
    calls: list[str] = []

    def counting_submit(app: str, args: list[str], *, name: str, master: str | None = None) -> None:
        calls.append(app)
        launch.submit(app, args, name=name, master="local[2]")

    in_process = verify(env.catalog, TABLE, record=False)
    spark = SparkDigests.for_table(env.defs, TABLE, counting_submit)
    on_spark = verify(env.catalog, TABLE, record=False, spark=spark)

    assert calls == ["verify"]  # one application for the four (partition, site) pairs
    assert len(on_spark.rows) == 4 and all(r.on_spark for r in on_spark.rows) and on_spark.spark_apps == 1
    assert not any(r.on_spark for r in in_process.rows) and in_process.spark_apps == 0
    assert _facts(on_spark.rows) == _facts(in_process.rows)
    assert {r.verdict for r in on_spark.rows} == {Verdict.EQUAL} and on_spark.differences == 0

    target = copy_holding(env, "dr", 108)
    rewrite_segment(env, target, change_payload(108, "tampered"))
    code, out, err = cli(env, "verify", TABLE, "--json")  # the CLI: launch.submit, a real spark-submit
    doc = json.loads(out)
    assert code == 1 and "1 difference(s)" in err and doc["spark_apps"] == 1
    bad = [r for r in doc["rows"] if r["verdict"] != "equal"]
    assert [(r["site"], r["partition_id"], r["different"], r["on_spark"]) for r in bad] == [
        ("dr", target.partition_id, [["a", 108]], True)
    ]
    in_process_doc = json.loads(json.dumps(verify(env.catalog, TABLE, record=False).to_dict()))
    assert _found(doc["rows"]) == _found(in_process_doc["rows"])  # the same digests, keys and verdicts


def _found(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(
        ({k: v for k, v in r.items() if k != "on_spark"} for r in rows), key=lambda r: (r["partition_id"], r["site"])
    )


def test_only_partitions_whose_digests_differ_are_read_in_process(
    digest_env: Env, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = digest_env
    reads: list[int] = []
    real = verify_module.placement_rows

    def counted(info: Any, pf: Any) -> pa.Table:
        reads.append(pf.placement_id)
        return real(info, pf)

    monkeypatch.setattr(verify_module, "placement_rows", counted)
    submit = spark_submit_in(spark)
    clean = verify(env.catalog, TABLE, spark=SparkDigests.for_table(env.defs, TABLE, submit))
    assert clean.differences == 0 and reads == []  # every pair equal on Spark: nothing read here

    target = copy_holding(env, "dr", 108)
    rewrite_segment(env, target, change_payload(108, "tampered"))
    # in the other partition: the pairs then share no placement, each read once (the copies' list order across
    # partitions depends on which partition's fast-forward committed first)
    broken = [c for c in copies_at(env, "edge") if c.partition_id != target.partition_id][-1]
    truncate(broken.path)
    report = verify(env.catalog, TABLE, spark=SparkDigests.for_table(env.defs, TABLE, submit))

    by_pair = {(r.partition_id, r.site): r for r in report.rows}
    changed = by_pair[(target.partition_id, "dr")]
    assert (changed.verdict, changed.different, changed.on_spark) == (Verdict.DIFFERENT, (["a", 108],), True)
    unreadable = by_pair[(broken.partition_id, "edge")]
    assert unreadable.verdict == Verdict.UNREADABLE and str(broken.path) in (unreadable.detail or "")
    others = [
        r for key, r in by_pair.items() if key not in {(target.partition_id, "dr"), (broken.partition_id, "edge")}
    ]
    assert len(others) == 2 and all(r.verdict == Verdict.EQUAL and r.on_spark for r in others)
    # read in process: the two pairs Spark could not call equal (each side once), nothing else
    assert len(reads) == 4 and report.differences == 2
