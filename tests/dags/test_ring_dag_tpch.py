"""Issue 15's end-to-end run on PostgreSQL (item 4): TPC-H `orders` in a three-site ring with writers at all
three sites at once, rounds through the replication DAG (``dag.test``; merges by the real spark-submit).

`writes: any_site`: `primary` leads the three partitions, `dr` and `edge` take writes too. The 11 TPC-H
batches (upserts with 5 % updates of earlier keys, and deletes) are dealt to the three sites and written by
three threads at once; a second wave follows the first round. After the DAG runs until idle every site reads
exactly an independent last-writer-wins replay of every write, by (_version, origin) as the writes returned
them (deletes kept as tombstones), and the report counts the conflicts.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from segrep.data import demo as demo_data
from segrep.data.reader import read_table
from segrep.data.writer import write_batch
from tests.support.airflow import load_dag, postgres_dag_env, rounds, ti_states
from tests.support.env import ORDERS_YAML, Env
from tests.support.tpch_failover import COMMENT, KEY, SPLIT_POINTS, TABLE, tpch_orders_batches

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.postgres]

SITES = ("primary", "dr", "edge")
SITE_IDS = {"primary": 1, "dr": 2, "edge": 3}


def ring_definitions() -> str:
    doc = yaml.safe_load(ORDERS_YAML)
    orders = doc["tables"]["orders"]
    orders.update(
        split_points=SPLIT_POINTS,
        replicas=["dr", "edge"],
        writes="any_site",
        policy={"schedule": "5m", "start_date": "2026-11-01", "retries": 1, "retry_delay_s": 0},
    )
    doc["tables"] = {TABLE: orders}
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.fixture
def ring_env(airflow_home: Path, pg_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    yield from postgres_dag_env(pg_server, tmp_path, monkeypatch, ring_definitions())


class Replay:
    """Last writer wins by (version, origin), from what each write returned: thread-safe."""

    def __init__(self, partition_ids: list[int]) -> None:
        self.partition_ids = partition_ids  # the initial partitions, in key order
        self.rows: dict[int, tuple[int, int, str | None]] = {}
        self.lock = threading.Lock()

    def write(self, env: Env, site: str, batch: demo_data.Batch) -> None:
        result = write_batch(env.catalog, TABLE, batch.rows, delete=batch.delete, site=site)
        assert {seg.site for seg in result.segments} == {site}
        version_of = {seg.partition_id: seg.version for seg in result.segments}
        keys = batch.rows[KEY].to_pylist()
        comments = [None] * len(keys) if batch.delete else batch.rows[COMMENT].to_pylist()
        with self.lock:
            for key, comment in zip(keys, comments, strict=True):
                pid = self.partition_ids[sum(key >= p for p in SPLIT_POINTS)]
                new = (version_of[pid], SITE_IDS[site], comment)
                old = self.rows.get(key)
                if old is None or new[:2] > old[:2]:
                    self.rows[key] = new

    def live(self) -> dict[int, str | None]:
        return {k: c for k, (_v, _o, c) in self.rows.items() if c is not None}


def _rows_at(env: Env, site: str) -> dict[int, str | None]:
    got = read_table(env.catalog, TABLE, site)
    return dict(zip(got[KEY].to_pylist(), got[COMMENT].to_pylist(), strict=True))


def _write_at_once(env: Env, replay: Replay, plan: dict[str, list[demo_data.Batch]]) -> None:
    errors: list[BaseException] = []

    def writer(site: str) -> None:
        try:
            for batch in plan[site]:
                replay.write(env, site, batch)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(site,)) for site in SITES]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_a_ring_of_three_sites_with_writers_everywhere_converges_through_the_dag(ring_env: Env, tmp_path: Path) -> None:
    import pendulum
    from sqlalchemy import select

    from segrep.catalog import models as m

    env = ring_env
    with env.catalog.read() as s:
        replay = Replay(sorted(s.scalars(select(m.Partition.partition_id))))
    batches = tpch_orders_batches(tmp_path / "sf0.01")
    # batch 0 (every order) at primary first; then the updates and deletes dealt round-robin to the sites
    replay.write(env, "primary", batches[0])
    first = {site: [b for i, b in enumerate(batches[1:7]) if i % 3 == n] for n, site in enumerate(SITES)}
    second = {site: [b for i, b in enumerate(batches[7:]) if i % 3 == n] for n, site in enumerate(SITES)}
    _write_at_once(env, replay, first)
    dag = load_dag("segrep_replicate_orders")
    runs = [dag.test(logical_date=pendulum.now("UTC"))]  # merges the first wave's pushes (spark-submit)
    _write_at_once(env, replay, second)  # while the merged segments are still on their way back
    want = replay.live()
    for _ in range(4):
        runs.append(dag.test(logical_date=pendulum.now("UTC")))
        if all(_rows_at(env, site) == want for site in SITES) and not rounds(env)[-1].report["merges"].get("items"):
            break
    for run in runs:
        assert run.state == "success", ti_states(run)
    for site in SITES:
        there = _rows_at(env, site)
        assert there == want, (site, len(there), len(want))
    conflicts = [c for r in rounds(env) for c in r.report["merges"].get("conflicts", [])]
    print("rounds:", len(runs), "conflicts:", conflicts)
