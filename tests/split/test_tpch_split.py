"""TPC-H `lineitem` in four partitions on PostgreSQL; one partition is split into three with a real
spark-submit while a writer keeps updating and deleting rows all over the table. Afterwards the children
together, at every site, read exactly what an independent replay of the same writes gives (issue 5); another
partition is then split async under the same writer. The suite runs it at scale 0.2 (1.2 M rows, about a
minute); `SEGREP_TPCH_SPLIT_SCALE=1` runs the full 6,001,215 rows (about four minutes). The data is generated
once into data/tpch/sf<scale> (git-ignored) and reused."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.core import hlc
from segrep.core.states import SplitState
from segrep.data import demo as demo_data
from segrep.data.reader import read_table
from segrep.data.writer import write_batch
from segrep.replication.orchestrator import run_round
from segrep.replication.unload import finish_unloaded
from segrep.split.run import run_split
from tests.support.env import Env

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.postgres]

REPO = Path(__file__).resolve().parents[2]
PK = ["l_orderkey", "l_linenumber"]
SCALE = float(os.environ.get("SEGREP_TPCH_SPLIT_SCALE", "0.2"))
KEYS = int(6_000_000 * SCALE)  # l_orderkey runs to about 6,000,000 x scale
SPLIT_POINTS = [KEYS // 4, KEYS // 2, KEYS * 3 // 4]  # four partitions
PARENT = 2  # [1/4, 1/2)
SPLIT_AT = [KEYS // 3, KEYS * 5 // 12]  # three children
ASYNC_PARENT = 3  # [1/2, 3/4), split async while the writer still runs
ASYNC_AT = [KEYS * 7 // 12, KEYS * 2 // 3]


@pytest.fixture(scope="module")
def lineitem() -> tuple[Path, pa.Table]:
    path = demo_data.generate_tpch("lineitem", SCALE, REPO / "data" / "tpch" / f"sf{SCALE:g}")
    return path, demo_data.normalized(pq.read_table(path))


@pytest.fixture
def pg_definitions(lineitem: tuple[Path, pa.Table]) -> str:
    """The definitions of ``pg_env`` (tests/conftest.py): `lineitem` in four partitions, to dr and edge."""
    return demo_data.lineitem_yaml(lineitem[0], SPLIT_POINTS, ["dr", "edge"], {"retry_delay_s": 0})


class Writer(threading.Thread):
    """Updates (a new l_comment) and deletes of random rows all over the table, until told to stop."""

    def __init__(self, env: Env, source: pa.Table) -> None:
        super().__init__(daemon=True)
        self.env, self.source = env, source
        self.batches: list[tuple[pa.Table, bool]] = []
        self.partitions: list[set[int]] = []
        self.started_us: list[int] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = np.random.default_rng(5)
        try:
            while not self.stop.is_set() or len(self.batches) < 4:
                n = len(self.batches)
                rows = self.source.take(pa.array(np.sort(rng.choice(self.source.num_rows, 5000, replace=False))))
                delete = n % 3 == 2
                if delete:
                    rows = rows.select(PK)
                else:
                    rows = rows.set_column(
                        rows.schema.get_field_index("l_comment"), "l_comment", pa.array([f"update {n}"] * rows.num_rows)
                    )
                self.started_us.append(hlc.now_us())
                result = write_batch(self.env.catalog, "lineitem", rows, delete=delete)
                self.batches.append((rows, delete))
                self.partitions.append({seg.partition_id for seg in result.segments})
                time.sleep(2.0)  # each write adds a segment to every partition: a split pass rewrites each
        except BaseException as exc:  # surfaced by the test
            self.error = exc


def replay(base: pa.Table, batches: list[tuple[pa.Table, bool]]) -> pa.Table:
    """The rows after the writes, by an independent route: the last write of each key wins (Arrow joins)."""
    parts = [base.append_column("_seq", pa.array(np.zeros(base.num_rows, np.int64)))]
    for n, (rows, delete) in enumerate(batches, start=1):
        tagged = rows.append_column("_seq", pa.array(np.full(rows.num_rows, n, np.int64)))
        parts.append(tagged.append_column("_del", pa.array(np.full(rows.num_rows, delete))))
    parts[0] = parts[0].append_column("_del", pa.array(np.zeros(base.num_rows, bool)))
    everything = pa.concat_tables(parts, promote_options="default")
    last = everything.group_by(PK).aggregate([("_seq", "max")])
    won = everything.join(last, keys=PK)
    won = won.filter(pc.and_(pc.equal(won["_seq"], won["_seq_max"]), pc.invert(won["_del"])))
    return won.select(base.column_names).sort_by([(k, "ascending") for k in PK])


def test_split_lineitem_partitions_in_three_sync_and_async_while_writes_continue(
    pg_env: Env, lineitem: tuple[Path, pa.Table]
) -> None:
    env = pg_env
    _path, source = lineitem
    third = source.num_rows // 3
    for n in range(3):  # several segments per partition
        write_batch(env.catalog, "lineitem", source.slice(n * third, third if n < 2 else None))
    run_round(env.catalog, env.defs, "lineitem")

    writer = Writer(env, source)
    writer.start()
    sync = run_split(env.catalog, env.defs, "lineitem", PARENT, SPLIT_AT)  # two spark-submits
    written_sync = len(writer.partitions)
    async_ = run_split(env.catalog, env.defs, "lineitem", ASYNC_PARENT, ASYNC_AT, is_async=True)  # one
    writer.stop.set()
    writer.join(timeout=600)
    assert writer.error is None, writer.error
    with env.catalog.read() as s:  # an async split finalizes as it starts: no later write reaches its parent
        started = s.scalar(select(m.Split.created_us).where(m.Split.parent_partition_id == ASYNC_PARENT))
    late = [parts for at, parts in zip(writer.started_us, writer.partitions, strict=True) if at > started]
    assert late and not any(ASYNC_PARENT in parts for parts in late)
    for report in (sync, async_):  # the children hold everything; dr and edge read the parents till a round
        assert report.state == SplitState.UNLOAD and report.finish.replicas_only and len(report.children) == 3
    for _ in range(2):
        run_round(env.catalog, env.defs, "lineitem")  # the children reach dr and edge
        finish_unloaded(env.catalog, env.defs, "lineitem")  # then the parents go (the DAG's commit step)
    children = set(sync.children)
    assert any(PARENT in p for p in writer.partitions[:written_sync]), "no write reached the splitting parent"
    assert any(p & children for p in writer.partitions), "no write reached the children after finalize"
    assert any(p & set(async_.children) for p in writer.partitions[written_sync:])

    with env.catalog.read() as s:
        states = {p.partition_id: p.state for p in s.scalars(select(m.Partition))}
    for parent, report in ((PARENT, sync), (ASYNC_PARENT, async_)):
        assert states[parent] == "UNLOAD_FINAL" and {states[c] for c in report.children} == {"LIVE"}
        assert not list((env.site_dir("primary") / "lineitem" / str(parent)).glob("*.parquet"))

    expected = replay(source, writer.batches)
    for site in (None, "dr", "edge"):
        got = read_table(env.catalog, "lineitem", site).sort_by([(k, "ascending") for k in PK])
        assert got.num_rows == expected.num_rows, site
        assert got.equals(expected), site
