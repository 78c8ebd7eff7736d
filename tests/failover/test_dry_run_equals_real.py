"""`segrep failover --dry-run` reports exactly what the real run sets aside (issue 32): per table and partition,
the rows and segment ids of the loss (set aside at the sites holding it when they return, under `on_return:
rollback`, and under any policy after a cut) and of the cut at the new leader (`--at safe-time`: the rows
newer than T that the real run moves to the new leader site's rollback area).

What the real run set aside is read back from the rollback area (the files' manifests) and the failover record,
never from the report of the real run itself.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, currently_in_test_context, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.core.errors import SegrepError
from segrep.data.writer import write_batch
from segrep.failover.promote import Cut, failover
from segrep.maintenance.compaction import compact
from segrep.replication.orchestrator import run_round
from segrep.replication.rollback import list_rollbacks, roll_back_returned, rollback_manifest
from segrep.storage.site import Site
from tests.support.cli import cli
from tests.support.env import OUTAGE_YAML, Env, make_env
from tests.support.models import Model
from tests.support.rounds import bring_up, inprocess_submit, no_spark, take_down
from tests.support.tables import TABLE, orders

pytestmark = pytest.mark.spark

TABLES = (TABLE, "orders")
# per table: partition id -> (rows, sorted segment ids)
PerPartition = dict[int, tuple[int, list[str]]]


def _yaml(on_return: str) -> str:
    """OUTAGE_YAML (events retries at once after an outage) with both tables' ``on_return`` policy."""
    policy = f"policy: {{retry_delay_s: 0, on_return: {on_return}}}"
    text = OUTAGE_YAML.replace("policy: {retry_delay_s: 0}", policy)
    text = text.replace("    replicas: [dr]\n", f"    replicas: [dr]\n    {policy}\n")  # orders
    assert text.count(policy) == 2
    return text


def per_partition(entries: list[dict[str, Any]]) -> PerPartition:
    """A loss's or a cut's partitions as (rows, sorted segment ids) by partition id."""
    return {x["partition_id"]: (x["rows"], sorted(x["segment_ids"])) for x in entries}


def dry_run(env: Env, at: str) -> dict[str, Any] | str:
    """The dry run's JSON report, or its one-line refusal."""
    code, out, err = cli(env, "failover", *TABLES, "--to", "dr", "--at", at, "--dry-run", "--json")
    if code == 2:
        return err.strip().removeprefix("segrep: error: ")
    assert code == 0, err
    return dict(json.loads(out))


def dry_cuts(report: dict[str, Any]) -> dict[str, PerPartition]:
    """The cuts the dry run names, per table (at the new leader, dr)."""
    out: dict[str, PerPartition] = {}
    for cut in report["cuts"]:
        assert all(p["site"] == "dr" for p in cut["partitions"]), cut
        assert cut["rows_set_aside"] == sum(p["rows"] for p in cut["partitions"]), cut
        assert cut["partitions_cut"] == len(cut["partitions"]), cut
        if cut["partitions"]:
            out[cut["table"]] = per_partition(cut["partitions"])
    return out


def dry_returns(report: dict[str, Any]) -> dict[str, PerPartition]:
    """The loss the dry run says would be set aside on return (``on_return: rollback``), per table."""
    out: dict[str, PerPartition] = {}
    for move in report["moves"]:
        a = move["assessment"]
        if move["on_return"] == "rollback" and a["loss"]:
            out[a["table"]] = per_partition(a["loss"])
    return out


def set_aside(env: Env) -> tuple[dict[str, PerPartition], list[tuple[str, int, int, list[str]]]]:
    """What the rollback area holds, from the files' manifests: the cut's files (at dr) per table and
    partition, and each returned site's files as (table, partition, rows, segment ids)."""
    with env.catalog.read() as s:
        stores = {row.name: Site(row.name, row.uri) for row in q.sites_by_id(s).values()}
    cuts: dict[str, PerPartition] = defaultdict(dict)
    returned = []
    for f in list_rollbacks(env.catalog):
        meta = rollback_manifest(stores[f.site], f.relpath)
        assert meta["rows"] == f.rows
        if f.relpath.endswith("-cut.parquet"):
            assert f.site == "dr" and f.partition_id not in cuts[f.table], f
            cuts[f.table][f.partition_id] = (f.rows, sorted(meta["segment_ids"]))
        else:
            returned.append((f.table, f.partition_id, f.rows, sorted(meta["segment_ids"])))
    return dict(cuts), returned


def recorded_losses(env: Env) -> dict[str, PerPartition]:
    """The loss each table's failover recorded (the catalog's failover record), per table."""
    with env.catalog.read() as s:
        names = {t.table_id: t.name for t in s.scalars(select(m.Table))}
        out = {}
        for f in s.scalars(select(m.Failover)):
            if f.loss:
                out[names[f.table_id]] = per_partition(f.loss)
    return out


def held_rows(env: Env) -> dict[str, int]:
    """Every segment's row count, by id (as the catalog had them before the failover)."""
    with env.catalog.read() as s:
        return {sid: n for sid, n in s.execute(select(m.Segment.segment_id, m.Segment.row_count))}


def note(what: str) -> None:
    """A hypothesis event (``--hypothesis-show-statistics``: how many histories cut rows, lost some, were
    refused), when under hypothesis."""
    if currently_in_test_context():
        event(what)


def check_dry_run_equals_real_run(env: Env, at: str, spark: Any, down: set[str]) -> None:
    """Dry run (CLI, JSON), then the real run, then every site back and the returned sites' set-aside done:
    what the dry run named is what the rollback area and the failover record hold."""
    report = dry_run(env, at)
    if isinstance(report, str):  # refused: the real run is refused alike, and changes nothing
        with pytest.raises(SegrepError) as refused:
            failover(env.catalog, env.defs, list(TABLES), to="dr", cut=Cut(at), submit=no_spark)
        assert str(refused.value) == report
        note("refused")
        with env.catalog.read() as s:
            assert s.scalars(select(m.Failover)).all() == []
        return
    sizes = held_rows(env)
    failover(env.catalog, env.defs, list(TABLES), to="dr", cut=Cut(at), submit=inprocess_submit(spark, []))
    for site in sorted(down):
        bring_up(env, site, env.root / "data" / "sites" / f"{site}.away")
    for table in TABLES:
        roll_back_returned(env.catalog, table)

    cuts, returned = set_aside(env)
    note(f"rows cut: {bool(cuts)}; rows set aside on return: {bool(returned)}; loss: {bool(recorded_losses(env))}")
    assert cuts == dry_cuts(report)  # the cuts at the new leader: exactly
    if at == "latest":
        assert cuts == {} and report["cuts"] == []
    losses = {mv["assessment"]["table"]: mv["assessment"]["loss"] for mv in report["moves"]}
    assert not any(x["rows_at_most"] for loss in losses.values() for x in loss)  # no major, no merge: exact
    assert recorded_losses(env) == {t: per_partition(loss) for t, loss in losses.items() if loss}
    # the loss set aside on return: the segments the dry run named, each at every returned site holding it
    # (a fork past a cut at edge and at primary: in both files), each file exactly their rows
    ids: dict[str, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    for table, pid, rows, seg_ids in returned:
        assert rows == sum(sizes[sid] for sid in seg_ids), (table, pid)
        ids[table][pid] |= set(seg_ids)
    expected = dry_returns(report)
    assert {t: {p: sorted(x) for p, x in parts.items()} for t, parts in ids.items()} == {
        t: {p: seg_ids for p, (_rows, seg_ids) in parts.items()} for t, parts in expected.items()
    }
    for table, parts in expected.items():
        for pid, (rows, seg_ids) in parts.items():
            assert rows == sum(sizes[sid] for sid in seg_ids), (table, pid)


def test_a_dry_run_at_safe_time_names_the_cut_at_the_new_leader(tmp_path: Path, spark: Any) -> None:
    """The tester's case: `dr` holds rows of `events` newer than T (the common safe time, held back by
    `orders`), and `primary` holds rows `dr` lacks. The dry run named the loss only (`"cuts": []`); the real
    run also set aside the 20 rows newer than T at `dr`."""
    env = make_env(tmp_path, f"sqlite:///{tmp_path}/catalog.db", _yaml("rollback"))
    model = Model()
    model.upsert(env, range(0, 30), "a")
    write_batch(env.catalog, "orders", orders([1, 2, 3]))
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    run_round(env.catalog, env.defs, "orders", submit=no_spark)
    model.upsert(env, range(20, 40), "after_cut")  # at dr, newer than orders' safe time there
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    model.upsert(env, range(50, 60), "lost")  # at primary only
    take_down(env, "primary")

    report = dry_run(env, "safe-time")
    assert isinstance(report, dict), report
    assert dry_cuts(report) != {}, report["cuts"]
    (events,) = [c for c in report["cuts"] if c["table"] == TABLE]
    assert events["rows_set_aside"] == 20 and events["partitions_cut"] == 2
    assert sum(n for n, _ids in dry_returns(report)[TABLE].values()) == 10
    code, out, err = cli(env, "failover", *TABLES, "--to", "dr", "--at", "safe-time", "--dry-run")
    assert code == 0 and "events: 2 partition(s) would be folded as of the cut, 20 newer row(s) set aside at dr" in out
    assert "on return (rollback): these rows would be set aside" in out, out + err

    check_dry_run_equals_real_run(env, "safe-time", spark, {"primary"})
    cuts, returned = set_aside(env)
    assert sum(n for n, _ids in cuts[TABLE].values()) == 20 and "orders" not in cuts
    assert {table for table, _pid, _n, _ids in returned} == {TABLE}
    assert sum(n for _table, _pid, n, _ids in returned) == 10
    env.catalog.dispose()


def test_a_lost_major_folding_what_the_new_leader_holds_is_an_upper_bound(tmp_path: Path) -> None:
    """Found writing these tests: `primary` compacts after a round, so its loss is a major folding the three
    segments `dr` holds and two it lacks. The return sets aside only the rows `dr` lacks (8 of the major's 18
    per partition pair): the dry run and the record say the loss's rows are at most that many, naming why."""
    env = make_env(tmp_path, f"sqlite:///{tmp_path}/catalog.db", _yaml("rollback"))
    model = Model()
    for i in range(3):
        model.upsert(env, range(i * 4, i * 4 + 4), f"a{i}")
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    for i in range(3, 5):
        model.upsert(env, range(i * 4 - 2, i * 4 + 2), f"b{i}")  # half of them new keys
    assert compact(env.catalog, env.defs, TABLE, force=True, submit=no_spark).commit.committed == 2
    code, out, err = cli(env, "failover", TABLE, "--to", "dr", "--dry-run")
    assert code == 0 and "loss (would be given up): 2 segment(s), at most 18 rows" in out, out + err
    assert "(at most: a lost major or merge output folds segments dr holds already" in out, out

    report = dry_run(env, "latest")
    assert isinstance(report, dict), report
    (move, _orders) = report["moves"]
    assert all(x["rows_at_most"] for x in move["assessment"]["loss"]), move
    loss = dry_returns(report)[TABLE]
    failover(env.catalog, env.defs, [TABLE], to="dr")
    with env.catalog.read() as s:
        (record,) = s.scalars(select(m.Failover)).all()
        assert all(x["rows_at_most"] for x in record.loss)
    roll_back_returned(env.catalog, TABLE)
    _cuts, returned = set_aside(env)
    assert {pid: seg_ids for _t, pid, _n, seg_ids in returned} == {pid: ids for pid, (_n, ids) in loss.items()}
    assert sum(n for _t, _pid, n, _ids in returned) == 8 < sum(n for n, _ids in loss.values()) == 18
    env.catalog.dispose()


# -- random histories ---------------------------------------------------------------------------------------

WRITE = st.tuples(st.just("write"), st.integers(0, 15), st.integers(1, 6))  # events: keys [start, start + n)
# a round of a table, to every replica site or to one (orders has none at edge); orders' rounds are rarer, so
# that dr often holds events newer than the common safe time (rows a cut sets aside)
ROUND = st.sampled_from([("round", TABLE, None)] * 2 + [("round", TABLE, "dr"), ("round", TABLE, "edge")])
STEP = st.one_of(
    WRITE,
    WRITE,
    ROUND,
    ROUND,
    st.just(("round", "orders", None)),
    st.tuples(st.just("orders"), st.integers(0, 5), st.integers(1, 3)),
    st.tuples(st.just("stop"), st.sampled_from(["dr", "edge"]), st.just(0)),  # down for the next steps
    st.tuples(st.just("start"), st.sampled_from(["dr", "edge"]), st.just(0)),
)


def replay(env: Env, steps: list[tuple[Any, ...]], primary_down: bool) -> set[str]:
    """Play the history; the sites left down at the failover (dr and edge come back; primary may stay away)."""
    model = Model()
    down: set[str] = set()
    for i, (kind, a, b) in enumerate(steps):
        if kind == "write":
            model.upsert(env, range(a, a + b), f"w{i}-")
        elif kind == "orders":
            write_batch(env.catalog, "orders", orders(list(range(a, a + b)), comment=f"w{i}-"))
        elif kind == "round":
            run_round(env.catalog, env.defs, a, target=b, submit=no_spark)
        elif kind == "stop" and a not in down:
            take_down(env, a)
            down.add(a)
        elif kind == "start" and a in down:
            bring_up(env, a, env.root / "data" / "sites" / f"{a}.away")
            down.remove(a)
    for site in sorted(down):
        bring_up(env, site, env.root / "data" / "sites" / f"{site}.away")
    if primary_down:
        take_down(env, "primary")
        return {"primary"}
    return set()


@pytest.mark.parametrize("on_return", ["rollback", "merge"])
@pytest.mark.parametrize("at", ["latest", "safe-time"])
# few examples, no shrinking (each example replays a history on a fresh catalog and may fold a cut on Spark)
@settings(
    max_examples=int(os.environ.get("SEGREP_DRY_RUN_EXAMPLES", "3")),
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@given(steps=st.lists(STEP, min_size=2, max_size=10), lag=st.none() | st.integers(0, 10), primary_down=st.booleans())
def test_the_dry_run_reports_what_the_real_run_sets_aside(
    spark: Any, at: str, on_return: str, steps: list[tuple[Any, ...]], lag: int | None, primary_down: bool
) -> None:
    # rounds of both tables first, so that most histories have safe times at dr to cut at; ``lag``: where in
    # the history events are written and replicated past orders' safe time (the tester's case: rows at dr
    # newer than T), unless a later round of orders moves T past them
    history = [("write", 0, 4), ("orders", 0, 2), ("round", TABLE, None), ("round", "orders", None), *steps]
    if lag is not None:
        history[4 + lag : 4 + lag] = [("write", 2, 6), ("round", TABLE, None)]
    with tempfile.TemporaryDirectory(prefix="segrep-dry-run-") as tmp:
        env = make_env(Path(tmp), f"sqlite:///{tmp}/catalog.db", _yaml(on_return))
        try:
            down = replay(env, history, primary_down)
            check_dry_run_equals_real_run(env, at, spark, down)
        finally:
            env.catalog.dispose()
