"""TPC-H `orders` (scale 0.1) replicated: a new replica site joins while batches keep arriving, rounds carry
every batch, updates and deletes included, and both replica sites end with exactly the rows an independent
last-writer-wins replay gives (issues 3 and 4 on real data; SQLite and PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pyarrow.parquet as pq
import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.catalog.apply import apply_definitions
from segrep.data import demo as demo_data
from segrep.data.reader import read_table
from segrep.data.writer import write_batch
from segrep.maintenance.bootstrap import bootstrap
from segrep.replication.orchestrator import run_round
from tests.support.cli import cli
from tests.support.damage import copies_at, delete, flip_bit, swap, truncate
from tests.support.env import Env

pytestmark = pytest.mark.slow


def _no_spark(*_a: Any, **_k: Any) -> None:
    raise AssertionError("a fast-forward-only replication must launch no Spark application")


def test_orders_replicate_and_a_site_joins_while_writes_continue(env: Env, tmp_path_factory: Any) -> None:
    root = tmp_path_factory.mktemp("tpch-repl")
    source = pq.read_table(demo_data.generate_tpch("orders", 0.1, root / "sf0.1"))
    batches = demo_data.make_batches(source, "o_orderkey", n=10, update_frac=0.05, delete_frac=0.01)
    half = len(batches) // 2
    for b in batches[:half]:
        write_batch(env.catalog, "orders", b.rows, delete=b.delete)
    report = run_round(env.catalog, env.defs, "orders", submit=_no_spark)
    assert report.status == "ok" and report.spark_apps == 0

    # `edge` becomes a replica of a table that holds data: JOINING, fed only after the bootstrap
    env.config.write_text(env.config.read_text().replace("    replicas: [dr]\n", "    replicas: [dr, edge]\n", 1))
    apply_definitions(env.catalog, env.defs)
    bootstrap(env.catalog, env.defs, "orders", "edge")
    for n, b in enumerate(batches[half:]):  # writes continue between the rounds that feed the new site
        write_batch(env.catalog, "orders", b.rows, delete=b.delete)
        if n % 2 == 0:
            run_round(env.catalog, env.defs, "orders", submit=_no_spark)
    for _ in range(2):
        report = run_round(env.catalog, env.defs, "orders", submit=_no_spark)
    assert report.status == "ok"

    expected = demo_data.expected_rows(batches, "o_orderkey")
    for site in (None, "dr", "edge"):
        assert demo_data.compare(read_table(env.catalog, "orders", site), expected, "o_orderkey") == [], site
    with env.catalog.read() as s:
        states = set(
            s.scalars(select(m.Placement.state).where(m.Placement.site_id == 3, m.Placement.removed_us.is_(None)))
        )
    assert states == {"LIVE"}

    # Trust the replicas (issue 12): a file flipped at the leader, one truncated at dr, one deleted at edge
    # and two swapped at dr are each named by verify --files; repair mends them all (the leader's file from
    # a replica's copy); verify is clean again and every site still reads the replay.
    leader, dr, edge = (
        copies_at(env, "primary", "orders"),
        copies_at(env, "dr", "orders"),
        copies_at(env, "edge", "orders"),
    )
    flip_bit(leader[0].path, offset=leader[0].path.stat().st_size // 2)
    truncate(dr[1].path)
    delete(edge[-1].path)
    swap(dr[2].path, dr[3].path)
    code, out, err = cli(env, "verify", "orders", "--files")
    assert code == 1, out + err
    for bad in (leader[0], dr[1], edge[-1], dr[2], dr[3]):
        assert str(bad.path) in out, f"{bad.path} not named:\n{out}"
    code, out, err = cli(env, "repair", "orders")
    assert code == 0, out + err
    code, out, err = cli(env, "verify", "orders", "--files")
    assert code == 0, out + err
    for site in (None, "dr", "edge"):
        assert demo_data.compare(read_table(env.catalog, "orders", site), expected, "o_orderkey") == [], site
