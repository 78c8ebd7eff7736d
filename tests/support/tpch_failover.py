"""The TPC-H `orders` failover story of issue 14 (item 7), shared by the run through the `segrep` command
(tests/failover/test_tpch_failover.py) and through the `segrep_failover` DAG (tests/dags/test_failover_dag_tpch.py),
and the TPC-H batches of the three-site ring (tests/dags/test_ring_dag_tpch.py): the definitions, the batches
and which of them each step writes, writes routed to the current leaders, and the check of the rollback files
the old leader's return leaves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.core import schema as sch
from segrep.data import demo as demo_data
from segrep.data.writer import WrittenSegment, write_batch
from tests.support.checks import leaders
from tests.support.env import ORDERS_YAML, Env

TABLE = "orders"
KEY = "o_orderkey"
COMMENT = "o_comment"
SPLIT_POINTS = [20000, 40000]  # sf 0.01 keys run to 60,000: three partitions
# make_batches(n=6): 0 upsert, then (upsert, delete) pairs: 1-2, 3-4, 5-6, 7-8, 9-10
REPLICATED = [0, 1, 2, 3, 4]  # at primary, replicated to dr and edge
UNREPLICATED = [5, 6]  # at primary only, when it goes away: given up by the failover
AT_DR = [7, 8]  # at dr, the new leader; reach edge while primary is down
AFTER = [9, 10]  # at primary again, after the switchover back
KEPT = REPLICATED + AT_DR + AFTER


def definitions() -> str:
    """ORDERS_YAML's TPC-H `orders` in three partitions, replicated to dr and edge, retried at once after a
    failed attempt (a test cannot wait out a back-off); `on_return` is the default, rollback."""
    doc = yaml.safe_load(ORDERS_YAML)
    orders = doc["tables"]["orders"]
    orders.update(split_points=SPLIT_POINTS, replicas=["dr", "edge"], policy={"retry_delay_s": 0})
    doc["tables"] = {TABLE: orders}
    return yaml.safe_dump(doc, sort_keys=False)


def tpch_orders_batches(directory: Path) -> list[demo_data.Batch]:
    """TPC-H `orders` at scale 0.01 (15,000 rows) cut into 11 batches: upserts with updates, and deletes."""
    source = pq.read_table(demo_data.generate_tpch("orders", 0.01, directory))
    batches = demo_data.make_batches(source, KEY, n=6, update_frac=0.05, delete_frac=0.02)
    assert [b.delete for b in batches] == [False] + [False, True] * 5
    return batches


def write(env: Env, batches: list[demo_data.Batch], numbers: list[int]) -> list[WrittenSegment]:
    """Write the batches (routed to the partitions' current leaders); return the segments written."""
    segments: list[WrittenSegment] = []
    for n in numbers:
        result = write_batch(env.catalog, TABLE, batches[n].rows, delete=batches[n].delete)
        assert result.rows_written == batches[n].rows.num_rows
        segments += result.segments
    return segments


def leader_sites(env: Env) -> set[str]:
    return {site for site, _epoch in leaders(env.catalog, TABLE).values()}


def placement_ids(env: Env, site: str) -> dict[int, int]:
    """partition id -> the placement id of ``site``'s replica."""
    with env.catalog.read() as s:
        site_id = s.scalars(select(m.Site.site_id).where(m.Site.name == site)).one()
        rows = s.execute(
            select(m.Placement.partition_id, m.Placement.placement_id).where(
                m.Placement.site_id == site_id, m.Placement.removed_us.is_(None)
            )
        ).all()
    return {pid: plid for pid, plid in rows}


def written_rows(batches: list[demo_data.Batch], numbers: list[int]) -> list[tuple[Any, ...]]:
    """Every row the batches wrote, as a segment holds it: (key, comment, deleted); a delete's tombstone has
    no comment. Sorted, so equal lists are equal multisets."""
    out = []
    for n in numbers:
        b = batches[n]
        comments = [None] * b.rows.num_rows if b.delete else b.rows[COMMENT].to_pylist()
        out += [(k, c, b.delete) for k, c in zip(b.rows[KEY].to_pylist(), comments, strict=True)]
    return sorted(out, key=repr)


def replay_last(batches: list[demo_data.Batch], numbers: list[int]) -> dict[Any, tuple[str | None, bool]]:
    """An independent replay of the batches alone, last writer wins, deletes kept as tombstones:
    key -> (comment, deleted)."""
    state: dict[Any, tuple[str | None, bool]] = {}
    for n in numbers:
        b = batches[n]
        for row in b.rows.to_pylist():
            state[row[KEY]] = (None, True) if b.delete else (row[COMMENT], False)
    return state


def check_rollback_files(
    env: Env, batches: list[demo_data.Batch], files: list[dict[str, Any]], failover_id: int, origin_id: int
) -> None:
    """The rollback files at `primary` (one per partition that lost something) hold exactly the rows of the
    unreplicated batches: each row as written, tombstones included, nothing else; their newest version per
    key is the replay of those batches alone; upserts carry every column as written."""
    assert files and {f["site"] for f in files} == {"primary"}, files
    assert {f["failover_id"] for f in files} == {failover_id} and {f["origin_site"] for f in files} == {"primary"}
    placements = placement_ids(env, "primary")
    with env.catalog.read() as s:
        bounds = {p.partition_id: (p.begin_key, p.end_key) for p in s.scalars(select(m.Partition))}
    tables = []
    for f in files:
        pid = f["partition_id"]
        assert f["relpath"] == f".rollback/{TABLE}/{pid}/{failover_id}-{placements[pid]}.parquet", f
        path = env.site_dir("primary") / f["relpath"]
        assert path.is_file(), path
        rows = pq.read_table(path)
        assert rows.num_rows == f["rows"], f
        lo, hi = bounds[pid]
        keys = rows[KEY].to_pylist()
        assert all((lo is None or k >= lo) and (hi is None or k < hi) for k in keys), (pid, lo, hi)
        tables.append(rows)
    rows = pa.concat_tables(tables)
    assert set(sch.INTERNAL_COLUMNS) <= set(rows.column_names), rows.column_names
    assert set(rows[sch.ORIGIN_COL].to_pylist()) == {origin_id}
    got = sorted(
        zip(rows[KEY].to_pylist(), rows[COMMENT].to_pylist(), rows[sch.DELETED_COL].to_pylist(), strict=True),
        key=repr,
    )
    assert got == written_rows(batches, UNREPLICATED)  # every row as written, once, and nothing else
    newest: dict[Any, tuple[int, tuple[str | None, bool]]] = {}
    for r in rows.to_pylist():
        if r[KEY] not in newest or r[sch.VERSION_COL] > newest[r[KEY]][0]:
            newest[r[KEY]] = (r[sch.VERSION_COL], (r[COMMENT], r[sch.DELETED_COL]))
    assert {k: v for k, (_ver, v) in newest.items()} == replay_last(batches, UNREPLICATED)
    columns = batches[UNREPLICATED[0]].rows.column_names
    upserts = {r[KEY]: {c: r[c] for c in columns} for r in rows.to_pylist() if not r[sch.DELETED_COL]}
    expected = {r[KEY]: r for n in UNREPLICATED if not batches[n].delete for r in batches[n].rows.to_pylist()}
    assert upserts == expected  # the upserts' rows are complete, every column as written
