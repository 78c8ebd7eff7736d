"""Issue 13's acceptance run: `primary` on a local directory, `dr` on one S3 endpoint and `edge` on a second
endpoint with other credentials (two moto servers: two regions, two identities).

TPC-H `orders` written in batches with updates and deletes, rounds (fast-forwards into both stores), a fork
written while `dr` (on S3) led and merged by Spark into the local leader, a compaction, a split, then
`segrep read --site dr|edge` equal to an independent last-writer-wins replay; GC leaves no incomplete upload;
the secrets appear nowhere in the catalog, the work directory or any output.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from segrep.data import demo as demo_data
from segrep.data.writer import write_batch
from tests.support.airflow import set_leader
from tests.support.cli import cli
from tests.support.env import ORDERS_YAML, Env, make_env, sqlite_url
from tests.support.s3 import BUCKETS, S3Endpoint, s3_events_yaml, secrets_of

pytestmark = [pytest.mark.slow, pytest.mark.spark]

KEY = "o_orderkey"


def _definitions(a: S3Endpoint, b: S3Endpoint, prefix: str) -> str:
    """The S3 sites of ``s3_events_yaml`` (dr on endpoint a, edge on b, each with its env prefix) and TPC-H
    `orders` as ORDERS_YAML defines it, in two partitions, replicated to both."""
    doc = yaml.safe_load(s3_events_yaml(a, b, prefix))
    orders = yaml.safe_load(ORDERS_YAML)["tables"]["orders"]
    orders.update(split_points=[30000], replicas=["dr", "edge"], policy={"retry_delay_s": 0, "orphan_grace_s": 0})
    doc["tables"] = {"orders": orders}
    return yaml.safe_dump(doc, sort_keys=False)


def _run(env: Env, outputs: list[str], *args: str) -> str:
    code, out, err = cli(env, *args)
    outputs += [out, err]
    assert code == 0, f"segrep {' '.join(args)} exited {code}:\n{out}\n{err}"
    return out


def _rows_at(env: Env, outputs: list[str], site: str, tmp: Path) -> pa.Table:
    out_file = tmp / f"read-{site}.parquet"
    _run(env, outputs, "read", "orders", "--site", site, "-o", str(out_file), "--overwrite")
    return pq.read_table(out_file)


def test_orders_replicate_between_two_object_stores(
    s3_endpoints: tuple[S3Endpoint, S3Endpoint],
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = s3_endpoints
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    for name, value in {**a.env("DR_S3"), **b.env("EDGE_S3")}.items():
        monkeypatch.setenv(name, value)
    prefix = uuid.uuid4().hex[:12]
    env = make_env(tmp_path, sqlite_url(tmp_path), _definitions(a, b, prefix))
    outputs: list[str] = []

    source = pq.read_table(demo_data.generate_tpch("orders", 0.01, tmp_path_factory.mktemp("tpch") / "sf0.01"))
    batches = demo_data.make_batches(source, KEY, n=6, update_frac=0.05, delete_frac=0.02)  # 11: upserts, deletes

    def write(*numbers: int) -> None:
        for n in numbers:
            write_batch(env.catalog, "orders", batches[n].rows, delete=batches[n].delete)

    write(0, 1, 2, 3, 4)
    _run(env, outputs, "round", "orders")

    # A fork: `dr` (on S3) leads for a while and takes an upsert and a delete at the S3 store; leadership comes
    # back to `primary`, which takes the next batch; the round merges dr's fork into primary's chain on Spark.
    set_leader(env, "dr")
    write(5, 6)
    set_leader(env, "primary")
    write(7)
    round_out = _run(env, outputs, "round", "orders")
    assert "merges: 2/2 committed" in round_out, round_out  # one per partition the fork touched
    _run(env, outputs, "round", "orders")

    _run(env, outputs, "compact", "orders", "--force")
    write(8)
    _run(env, outputs, "round", "orders")
    split_out = _run(env, outputs, "split", "orders", "1", "--at", "15000")
    assert "rewrite(s)" in split_out, split_out
    write(9, 10)
    for _ in range(2):
        _run(env, outputs, "round", "orders")

    expected = demo_data.expected_rows(batches, KEY)
    for site in ("primary", "dr", "edge"):
        assert demo_data.compare(_rows_at(env, outputs, site, tmp_path), expected, KEY) == [], site

    gc_out = _run(env, outputs, "gc", "orders")
    assert a.multipart_uploads(BUCKETS[0]) == [] and b.multipart_uploads(BUCKETS[1]) == [], gc_out

    secrets = secrets_of(a, b)
    leaks = [s for s in secrets for text in outputs if s in text]
    assert not leaks, "a secret was printed"
    for path in tmp_path.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not [s for s in secrets if s.encode() in data], f"a secret was written to {path}"
