"""TPC-H `orders` at scale 0.1 (150,000 rows), written through `segrep write` in ten batches with ~5% of rows
updated and ~1% deleted, read back with `segrep read`: exactly the rows an independent replay gives."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from segrep.data import demo as demo_data
from tests.support.cli import cli as run
from tests.support.env import Env

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def orders_batches(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[demo_data.Batch], list[tuple[Path, bool]]]:
    root = tmp_path_factory.mktemp("tpch")
    source = pq.read_table(demo_data.generate_tpch("orders", 0.1, root / "sf0.1"))
    assert source.num_rows == 150_000
    batches = demo_data.make_batches(source, "o_orderkey", n=10, update_frac=0.05, delete_frac=0.01)
    return batches, demo_data.write_batch_files(batches, root / "batches")


def test_orders_written_in_batches_read_back_exactly(env: Env, orders_batches, tmp_path: Path) -> None:
    batches, files = orders_batches
    upserts = [b for b in batches if not b.delete]
    deletes = [b for b in batches if b.delete]
    assert len(upserts) == 10
    updated = sum(b.rows.num_rows for b in upserts) - 150_000
    assert 0.04 * 150_000 <= updated <= 0.06 * 150_000
    assert 0.008 * 150_000 <= sum(b.rows.num_rows for b in deletes) <= 0.012 * 150_000
    for path, delete in files:
        code, _, err = run(env, "write", "orders", str(path), *(["--delete"] if delete else []))
        assert code == 0, err
    out = tmp_path / "read.parquet"
    code, _, err = run(env, "read", "orders", "-o", str(out))
    assert code == 0, err
    expected = demo_data.expected_rows(batches, "o_orderkey")
    assert demo_data.compare(pq.read_table(out), expected, "o_orderkey") == []
    assert pq.read_metadata(out).num_rows == len(expected) < 150_000
