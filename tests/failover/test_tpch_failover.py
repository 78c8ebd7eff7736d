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
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.data import demo as demo_data
from tests.support.checks import leaders
from tests.support.cli import cli
from tests.support.env import Env
from tests.support.rounds import bring_up, take_down
from tests.support.tpch_failover import (
    AFTER,
    AT_DR,
    KEPT,
    KEY,
    REPLICATED,
    SPLIT_POINTS,
    TABLE,
    UNREPLICATED,
    check_rollback_files,
    definitions,
    leader_sites,
    tpch_orders_batches,
    write,
)

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.postgres]


@pytest.fixture(scope="module")
def tpch_batches(tmp_path_factory: pytest.TempPathFactory) -> list[demo_data.Batch]:
    return tpch_orders_batches(tmp_path_factory.mktemp("tpch") / "sf0.01")


@pytest.fixture
def pg_definitions() -> str:
    """The definitions of ``pg_env`` (tests/conftest.py): the story's."""
    return definitions()


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
