"""Active-active writes (issue 15 item 3): `writes: any_site`, every site takes writes to the same keys.

Each site's writes sit beside its chain and are read there at once; rounds push them to the partition's
leader, which merges them (Spark, last writer wins by (_version, origin)); the merged segment fast-forwards
back. After quiescence every site equals an independent replay of all writes in commit order, no segment was
ever offered to a site that held it already, and the concurrent overwrites are counted per site pair.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.data.writer import write_batch
from segrep.maintenance.gc import collect
from segrep.replication.orchestrator import run_round
from tests.support.checks import safe_times, triples
from tests.support.cli import cli
from tests.support.env import ORDERS_YAML, Env, env_fixture, sqlite_url
from tests.support.rounds import inprocess_submit
from tests.support.tables import TABLE, TENANTS, batch

pytestmark = pytest.mark.spark

RING_YAML = ORDERS_YAML.replace(
    "    replicas: [dr, edge]\n", "    replicas: [dr, edge]\n    writes: any_site\n    policy: {retry_delay_s: 0}\n"
)
SITES = ("primary", "dr", "edge")


class Replay:
    """Every write in commit order: the last one per key wins (the writes here commit one after another)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, int], str] = {}

    def write(self, env: Env, site: str, keys: range, tag: str) -> set[str]:
        result = write_batch(env.catalog, TABLE, batch(keys, tag), site=site)
        for k in keys:
            self.rows[(TENANTS[k % len(TENANTS)], k)] = f"{tag}{k}"
        return {seg.segment_id for seg in result.segments}

    def expected(self) -> list[tuple[str, int, str]]:
        return sorted((t, s, p) for (t, s), p in self.rows.items())


@pytest.fixture
def ring(tmp_path: Any) -> Any:
    yield from env_fixture(tmp_path, sqlite_url(tmp_path), RING_YAML)


def _rounds(env: Env, spark: Any, n: int = 4) -> list[Any]:
    calls: list[str] = []
    return [run_round(env.catalog, env.defs, TABLE, submit=inprocess_submit(spark, calls)) for _ in range(n)]


def test_every_site_converges_to_the_replay_of_all_writes(ring: Env, spark: Any) -> None:
    env, replay = ring, Replay()
    replay.write(env, "primary", range(0, 40), "p")
    _rounds(env, spark, 1)
    replay.write(env, "dr", range(20, 60), "d")  # overwrites primary's 20..39
    replay.write(env, "edge", range(50, 80), "e")  # overwrites dr's 50..59
    mine = {(t, s): p for t, s, p in triples(env.catalog, "dr")}
    assert mine[(TENANTS[25 % 4], 25)] == "d25"  # read-your-writes at dr before any round
    assert mine[(TENANTS[5 % 4], 5)] == "p5"
    replay.write(env, "primary", range(70, 90), "p2")  # the leader overwrites edge's 70..79
    reports = _rounds(env, spark)
    for site in SITES:
        assert triples(env.catalog, site) == replay.expected(), site
    assert triples(env.catalog) == replay.expected()
    _no_segment_offered_twice(env)
    assert reports[-1].status == "ok"
    stored = safe_times(env.catalog)
    assert set(stored) == {"dr", "edge"}


def test_concurrent_writes_to_the_same_keys_are_counted_per_site_pair(ring: Env, spark: Any) -> None:
    env, replay = ring, Replay()
    replay.write(env, "primary", range(0, 20), "base")
    _rounds(env, spark, 2)
    # neither dr nor edge has seen the other's write: 10..19 conflict, the later write (edge) wins
    replay.write(env, "dr", range(0, 20), "d")
    replay.write(env, "edge", range(10, 30), "e")
    reports = _rounds(env, spark)
    for site in SITES:
        assert triples(env.catalog, site) == replay.expected(), site
    conflicts = [c for rep in reports for c in rep.merges.conflicts]
    lost = {(c.site, c.by): c.rows for c in conflicts}
    assert lost == {("dr", "edge"): 10}, conflicts
    assert all(c.sample for c in conflicts)
    text = "\n".join(str(rep) for rep in reports)
    assert "conflicts: 10 row(s) written at dr overwritten by edge" in text, text
    code, out, err = cli(env, "status")
    assert code == 0, err
    assert "events: 10 row(s) written at dr overwritten by edge" in out, out
    code, out, err = cli(env, "status", "--json")
    assert [(c["site"], c["by"], c["rows"]) for c in json.loads(out)["conflicts"]] == [("dr", "edge", 10)]


def test_a_write_at_a_site_is_refused_unless_the_table_takes_writes_anywhere(tmp_path: Any) -> None:
    env = next(env_fixture(tmp_path, sqlite_url(tmp_path)))
    with pytest.raises(Exception) as err:
        write_batch(env.catalog, TABLE, batch(range(3), "x"), site="dr")
    assert "writes: any_site" in str(err.value)
    env.catalog.dispose()


def _no_segment_offered_twice(env: Env) -> None:
    """Each placement lists each segment id once: nothing was copied to a site that already had it."""
    with env.catalog.read() as s:
        rows = s.execute(select(m.Segment.placement_id, m.Segment.segment_id)).all()
    assert len(rows) == len(set(rows))


def test_gc_keeps_a_sites_own_write_until_the_merge_of_it_has_arrived(ring: Env, spark: Any) -> None:
    """Read-your-writes across GC: once the leader merged dr's write (acked), the write is off dr's chain until
    the merged segment fast-forwards there; GC must not take it before (dr would read the older row)."""
    env, replay = ring, Replay()
    replay.write(env, "primary", range(0, 10), "p")
    _rounds(env, spark, 2)
    mine = replay.write(env, "dr", range(0, 5), "d")
    _rounds(env, spark, 1)  # pushed and merged; the merged segment reaches dr in the next round
    first = collect(env.catalog, env.defs, TABLE)
    assert not mine & {d.segment_id for d in first.deletions if d.site == "dr"}, first.deletions
    assert triples(env.catalog, "dr") == replay.expected()  # dr still reads its own write
    _rounds(env, spark, 1)
    second = collect(env.catalog, env.defs, TABLE)
    assert mine <= {d.segment_id for d in second.deletions if d.site == "dr"}, second.deletions
    assert triples(env.catalog, "dr") == replay.expected()
