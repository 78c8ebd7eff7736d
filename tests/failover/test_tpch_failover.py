"""Issue 14's end-to-end run on PostgreSQL (item 7): TPC-H `orders` (scale 0.01, three partitions) led by
`primary` and replicated to `dr` and `edge`, through the `segrep` command with the real spark-submit.

Replicated writes at `primary`; then writes `primary` alone holds, and `primary` goes away. `segrep failover
--dry-run` names the loss (exactly the unreplicated batches' rows) and changes nothing; `segrep failover --to
dr` promotes `dr`, which takes writes that reach `edge` while `primary` is still down. When `primary` is back
(policy `on_return: rollback`, the default), its rollback files hold exactly the unreplicated rows, checked
against those batches replayed on their own (tombstones included), and it follows `dr` again. `segrep
switchover --to primary` moves the lead back with nothing lost (RPO 0); `primary` takes more writes. Every
site then reads exactly an independent last-writer-wins replay of the writes that were kept: all but the
unreplicated ones. The same story through the `segrep_failover` DAG is tests/dags/test_failover_dag_tpch.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.core import schema as sch
from segrep.data import demo as demo_data
from segrep.data.writer import WrittenSegment, write_batch
from tests.support.checks import leaders
from tests.support.cli import cli
from tests.support.env import ORDERS_YAML, Env, make_env, pg_schema_url
from tests.support.rounds import bring_up, take_down

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.postgres]

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


@pytest.fixture(scope="module")
def tpch_batches(tmp_path_factory: pytest.TempPathFactory) -> list[demo_data.Batch]:
    return tpch_orders_batches(tmp_path_factory.mktemp("tpch") / "sf0.01")


@pytest.fixture
def pg_env(pg_server: str, tmp_path: Path) -> Iterator[Env]:
    for url in pg_schema_url(pg_server):
        env = make_env(tmp_path, url, definitions())
        yield env
        env.catalog.dispose()


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


def run_ok(env: Env, *args: str) -> str:
    code, out, err = cli(env, *args)
    assert code == 0, f"segrep {' '.join(args)} exited {code}:\n{out}\n{err}"
    return out


def read_at(env: Env, site: str, tmp: Path) -> pa.Table:
    out_file = tmp / f"read-{site}.parquet"
    out = run_ok(env, "read", TABLE, "--site", site, "-o", str(out_file), "--overwrite")
    assert f"of {TABLE} at {site} to" in out, out
    return pq.read_table(out_file)


def assert_sites_equal_replay(
    env: Env, batches: list[demo_data.Batch], numbers: list[int], sites: tuple[str, ...], tmp: Path
) -> None:
    expected = demo_data.expected_rows([batches[n] for n in numbers], KEY)
    for site in sites:
        assert demo_data.compare(read_at(env, site, tmp), expected, KEY) == [], site


def test_tpch_orders_failover_rollback_and_switchover_back_through_the_cli(
    pg_env: Env, tpch_batches: list[demo_data.Batch], tmp_path: Path
) -> None:
    env, batches = pg_env, tpch_batches
    write(env, batches, REPLICATED)
    first = run_ok(env, "round", TABLE)
    assert re.search(r"dr: ok", first) and re.search(r"edge: ok", first), first
    run_ok(env, "round", TABLE)
    assert_sites_equal_replay(env, batches, REPLICATED, ("dr", "edge"), tmp_path)

    # Writes only primary holds, then primary goes away.
    lost = write(env, batches, UNREPLICATED)
    assert {seg.site for seg in lost} == {"primary"}
    lost_rows = sum(batches[n].rows.num_rows for n in UNREPLICATED)
    assert sum(seg.rows for seg in lost) == lost_rows
    before = leaders(env.catalog, TABLE)
    assert leader_sites(env) == {"primary"} and len(before) == len(SPLIT_POINTS) + 1
    aside = take_down(env, "primary")

    # Dry run: the loss, exactly the unreplicated rows, and nothing changes.
    dry = run_ok(env, "failover", TABLE, "--dry-run")
    assert f"failover of {TABLE}: primary -> dr, at latest (dry run: nothing changed)" in dry, dry
    assert "dr is the most advanced live replica" in dry and "ties go to the lower site id" in dry, dry
    total = f"{len(lost)} segment(s), {lost_rows:,} rows, {sum(seg.byte_size for seg in lost):,} bytes"
    assert f"loss (would be given up): {total}" in dry, dry
    for pid in {seg.partition_id for seg in lost}:
        part = [seg for seg in lost if seg.partition_id == pid]
        line = f"partition {pid}: {len(part)} segment(s), {sum(seg.rows for seg in part):,} rows"
        assert line in dry, (line, dry)
    assert leaders(env.catalog, TABLE) == before

    # The failover to dr, primary still down.
    moved = run_ok(env, "failover", TABLE, "--to", "dr")
    match = re.search(
        r"failover of orders: primary -> dr, at latest: (\d+) partition\(s\) moved, epochs raised "
        r"\(failover id (\d+)\)",
        moved,
    )
    assert match and int(match.group(1)) == len(before), moved
    failover_id = int(match.group(2))
    assert f"loss (given up): {total}" in moved, moved
    after = leaders(env.catalog, TABLE)
    assert after == {pid: ("dr", epoch + 1) for pid, (_site, epoch) in before.items()}
    with env.catalog.read() as s:
        record = s.get(m.Failover, failover_id)
        assert record is not None and (record.kind, record.on_return) == ("failover", "rollback")
        assert sorted(sid for x in record.loss for sid in x["segment_ids"]) == sorted(seg.segment_id for seg in lost)

    # Writes at dr reach edge; primary, away, is DOWN.
    at_dr = write(env, batches, AT_DR)
    assert {seg.site for seg in at_dr} == {"dr"}
    code, out, err = cli(env, "round", TABLE)
    assert code == 1 and re.search(r"primary: down", out), out + err  # a failed-over leader still away is DOWN
    assert re.search(r"edge: ok", out), out
    assert_sites_equal_replay(env, batches, REPLICATED + AT_DR, ("dr", "edge"), tmp_path)

    # primary is back: its unreplicated rows go to rollback files, and it follows dr again.
    bring_up(env, "primary", aside)
    back = run_ok(env, "round", TABLE)
    assert "merges:" not in back, back  # nothing of the lost rows is pushed to dr
    n = len(at_dr)  # rewound, then fast-forwarded from dr: dr's new segments only, no bootstrap
    assert f"primary: ok (FAST_FORWARD {n}; copied {n} segments" in back, back
    run_ok(env, "round", TABLE)
    listing = json.loads(run_ok(env, "rollback", "list", TABLE, "--json"))
    assert sum(f["rows"] for f in listing) == lost_rows, listing
    assert {f["partition_id"] for f in listing} == {seg.partition_id for seg in lost}, listing
    with env.catalog.read() as s:
        primary_id = s.scalars(select(m.Site.site_id).where(m.Site.name == "primary")).one()
    check_rollback_files(env, batches, listing, failover_id, primary_id)
    assert_sites_equal_replay(env, batches, REPLICATED + AT_DR, ("primary", "dr", "edge"), tmp_path)

    # The switchover back to primary: nothing lost.
    switched = run_ok(env, "switchover", TABLE, "--to", "primary", "--timeout", "2m")
    assert f"switchover of {TABLE}: dr -> primary" in switched and "loss: none" in switched, switched
    assert leader_sites(env) == {"primary"}
    assert all(epoch == after[pid][1] + 1 for pid, (_site, epoch) in leaders(env.catalog, TABLE).items())
    with env.catalog.read() as s:
        kinds = s.scalars(select(m.Failover.kind).order_by(m.Failover.done_us)).all()
        assert kinds == ["failover", "switchover"]
        assert s.scalars(select(m.Failover.loss).order_by(m.Failover.done_us.desc())).first() == []

    write(env, batches, AFTER)
    for _ in range(2):
        run_ok(env, "round", TABLE)
    assert_sites_equal_replay(env, batches, KEPT, ("primary", "dr", "edge"), tmp_path)
    expected = demo_data.expected_rows([batches[n] for n in KEPT], KEY)
    leaders_file = tmp_path / "read-leaders.parquet"
    run_ok(env, "read", TABLE, "-o", str(leaders_file))
    assert demo_data.compare(pq.read_table(leaders_file), expected, KEY) == []
    # The rollback files are untouched by everything after the return (nothing is deleted until dropped).
    assert json.loads(run_ok(env, "rollback", "list", TABLE, "--json")) == listing
