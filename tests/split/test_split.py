"""Partition splits (issue 5, EventQL 3.8) on the `events` table, with the Spark job run in this process's
SparkSession (the real spark-submit path runs in the TPC-H split test and the split DAG's e2e test). Every merge
here is pinned to Spark (``SEGREP_MERGE_ENGINE``): these splits are small enough to run in process otherwise.

Partition [-inf, m) holds tenants 'a' and 'b'; it is split at 'b' (two children) or at 'aa' and 'b' (three,
one of them empty at first). Every test ends with every site reading exactly the model's rows and the
parent retired: UNLOAD_FINAL, no segment rows, no files.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.core import faults
from segrep.core.errors import SegrepError, SplitIncompleteError
from segrep.core.states import SplitState
from segrep.replication.orchestrator import run_round
from segrep.replication.unload import FinishReport, finish, finish_unloaded
from segrep.spark.jobs import run_manifest
from segrep.spark.manifest import Manifest
from segrep.split.progress import progress_text, split_progress
from segrep.split.run import run_split
from segrep.split.workflow import commit_pass, finalize, plan_pass, start_split
from segrep.storage.atomic import write_json_atomic
from tests.support.checks import assert_replicas_equal_leader, assert_safe_time_honest, safe_times, triples
from tests.support.cli import cli
from tests.support.env import Env
from tests.support.models import Model
from tests.support.rounds import bring_up, no_spark, set_leader, take_down
from tests.support.tables import REPLICAS, TABLE

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("merge_on_spark")]


PARENT = 5  # events [-inf, m): tenants "a" and "b" (orders has partitions 1-4)


def inprocess(spark: Any, manifests: list[Manifest]) -> Any:
    """A ``submit`` running the job in this process's SparkSession; keeps each manifest it ran."""

    def submit(app: str, args: Sequence[str], *, name: str, master: str | None = None) -> None:
        assert app == "merge", app
        manifest = Manifest.load(args[args.index("--manifest") + 1])
        manifests.append(manifest)
        write_json_atomic(args[args.index("--result") + 1], run_manifest(spark, manifest))

    return submit


def partition_states(env: Env) -> dict[int, str]:
    with env.catalog.read() as s:
        return {pid: state for pid, state in s.execute(select(m.Partition.partition_id, m.Partition.state))}


def converge(env: Env) -> None:
    """Rounds until the children are at every replica site (the round's commit step then retires a parent in
    UNLOAD, as the replication DAG and `segrep round` do); then every site reads the leader's rows."""
    for _ in range(2):
        run_round(env.catalog, env.defs, TABLE, submit=no_spark)
        finish_unloaded(env.catalog, env.defs, TABLE)
    assert_replicas_equal_leader(env.catalog)


def assert_unloaded(env: Env, finished: FinishReport) -> None:
    """The children hold everything at their leaders, but the parent stays until the replicas hold them too:
    meanwhile each replica site reads the parent's rows from its parent placement, so no site loses a row its
    safe time vouches for (retiring the parent at once did exactly that, until the next round)."""
    assert finished.state == SplitState.UNLOAD and finished.replicas_only, finished
    assert partition_states(env)[PARENT] == "UNLOAD"
    for site, safe in safe_times(env.catalog).items():
        assert_safe_time_honest(env.catalog, TABLE, site, safe)


def assert_parent_retired(env: Env, parent: int = PARENT) -> None:
    states = partition_states(env)
    assert states[parent] == "UNLOAD_FINAL"
    with env.catalog.read() as s:
        left = s.scalars(select(m.Segment).where(m.Segment.partition_id == parent)).all()
        active = s.scalars(
            select(m.Placement).where(m.Placement.partition_id == parent, m.Placement.removed_us.is_(None))
        ).all()
    assert left == [] and active == []
    for site in ("primary", *REPLICAS):
        assert list((env.site_dir(site) / TABLE / str(parent)).glob("*.parquet")) == [], site


def rewritten(manifests: list[Manifest]) -> list[tuple[int, str]]:
    return [(it.partition_id, it.output_segment_id) for mf in manifests for it in mf.items if it.kind == "split"]


def test_split_while_writes_continue(env: Env, spark: Any) -> None:
    model = Model()
    for n in range(3):
        model.upsert(env, range(n * 40, n * 40 + 40), f"w{n}")
    model.delete(env, range(0, 8))
    converge(env)

    ref = start_split(env.catalog, TABLE, PARENT, ["b"])
    assert ref.state == SplitState.SPLITTING and len(ref.children) == 2
    assert start_split(env.catalog, TABLE, PARENT, ["b"]).split_id == ref.split_id  # re-run: the same split
    with pytest.raises(SegrepError, match="already has split"):
        start_split(env.catalog, TABLE, PARENT, ["c"])
    model.upsert(env, range(100, 140), "during")  # SPLITTING: the parent still takes writes
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)  # and replicates them (children are LOADING)

    assert plan_pass(env.catalog, env.defs, ref.split_id, "unload").manifest is None  # not that phase yet
    plan = plan_pass(env.catalog, env.defs, ref.split_id)
    assert plan.phase == "copy" and plan.rewrites == 2 * 5 and plan.merges == 0  # 5 parent segments, 2 children
    assert plan.cut_entry_id > 0 and "copy-" in Path(str(plan.manifest)).name
    model.upsert(env, range(0, 20), "after_cut")  # after the cut: reaches the children through UNLOAD
    manifests: list[Manifest] = []
    inprocess(spark, manifests)("merge", ["--manifest", str(plan.manifest), "--result", str(plan.result)], name="t")
    summary = commit_pass(env.catalog, plan)
    assert summary.committed == 10 and summary.dropped == []
    assert commit_pass(env.catalog, plan).committed == 0  # a second commit records nothing twice
    with pytest.raises(SegrepError, match="still lack"):
        finalize(env.catalog, ref.split_id)  # without the cut: the after_cut segment is missing
    assert finalize(env.catalog, ref.split_id, plan.cut_entry_id).state == SplitState.UNLOAD
    states = partition_states(env)
    assert states[PARENT] == "UNLOAD" and {states[c] for c in ref.children} == {"LIVE"}

    written = model.upsert(env, range(10, 30), "after_finalize")  # newer than the after_cut rows
    assert written > 0
    with env.catalog.read() as s:
        parts = s.scalars(select(m.Segment.partition_id).order_by(m.Segment.entry_id.desc()).limit(3)).all()
    assert PARENT not in parts and set(parts) & set(ref.children)  # the writer routes to the children now
    assert "lacking" in progress_text(split_progress(env.catalog, TABLE))

    unload = plan_pass(env.catalog, env.defs, ref.split_id)
    assert unload.phase == "unload" and unload.rewrites == 0 and unload.merges == 2  # after_cut, per child
    inprocess(spark, manifests)("merge", ["--manifest", str(unload.manifest), "--result", str(unload.result)], name="t")
    commit_pass(env.catalog, unload)
    assert_unloaded(env, finish(env.catalog, env.defs, ref.split_id))
    assert triples(env.catalog) == model.snapshot()  # after_finalize rows kept over the older after_cut ones
    converge(env)
    done = finish(env.catalog, env.defs, ref.split_id)
    assert done.state == SplitState.DONE
    assert_parent_retired(env)
    assert split_progress(env.catalog, TABLE) == []


def test_finalize_waits_for_every_segment_up_to_the_cut(sqlite_env: Env, spark: Any) -> None:
    env = sqlite_env
    model = Model()
    for n in range(2):
        model.upsert(env, range(n * 30, n * 30 + 30), f"w{n}")
    converge(env)
    ref = start_split(env.catalog, TABLE, PARENT, ["b"])
    with env.catalog.read() as s:
        first = s.scalars(
            select(m.Segment).where(m.Segment.partition_id == PARENT).order_by(m.Segment.entry_id).limit(1)
        ).one()
    path = env.site_dir("primary") / first.relpath
    good = path.read_bytes()
    path.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # the parent's oldest file rots before the copy
    manifests: list[Manifest] = []
    submit = inprocess(spark, manifests)
    plan = plan_pass(env.catalog, env.defs, ref.split_id)
    submit("merge", ["--manifest", str(plan.manifest), "--result", str(plan.result)], name="t")
    summary = commit_pass(env.catalog, plan)
    assert len(summary.invalid) == 2 and summary.committed == 0  # its rewrite for each child; the
    # second segment continues the first, so neither child could take it: nothing else was registered
    with pytest.raises(SplitIncompleteError, match="still lack segments"):
        finalize(env.catalog, ref.split_id, plan.cut_entry_id)
    assert partition_states(env)[PARENT] == "SPLITTING"

    path.write_bytes(good)  # repaired (in real life: a re-bootstrap from a replica's copy)
    report = run_split(env.catalog, env.defs, TABLE, PARENT, submit=submit)
    assert_unloaded(env, report.finish)
    assert report.passes[0].plan.rewrites == 2 * 2
    assert triples(env.catalog) == model.snapshot()
    converge(env)
    assert_parent_retired(env)


def test_async_split_finalizes_at_once_and_converges(env: Env, spark: Any) -> None:
    model = Model()
    model.upsert(env, range(0, 60), "a")
    model.delete(env, range(0, 4))
    converge(env)
    model.upsert(env, range(60, 70), "late")  # only the parent's leader holds these when the split starts
    ref = start_split(env.catalog, TABLE, PARENT, ["aa", "b"], is_async=True)
    assert ref.state == SplitState.UNLOAD and len(ref.children) == 3
    model.upsert(env, range(0, 12), "new")  # straight into the children, newer than everything in the parent
    assert triples(env.catalog) == model.snapshot()  # reads add the unloading parent's rows: nothing is missing
    report = run_round(env.catalog, env.defs, TABLE, submit=no_spark)  # the children's new rows reach dr, edge
    for site in REPLICAS:  # but not the parent's late rows: no site's safe time may claim them yet
        assert_safe_time_honest(env.catalog, TABLE, site, report.safe_time_us[site])
        late = [p for _t, k, p in triples(env.catalog, site) if 60 <= k < 70]
        assert late == [p for _t, k, p in model.snapshot() if 60 <= k < 70 and _t in ("x", "y")], site
    manifests: list[Manifest] = []
    report = run_split(env.catalog, env.defs, TABLE, PARENT, submit=inprocess(spark, manifests))
    assert_unloaded(env, report.finish)
    assert len(manifests) == 1 and rewritten(manifests) == []  # async: everything reached the children as merges
    # Every parent placement pushes, and dr and edge hold most of the leader's segments too: each child still
    # reads and merges each segment once (the one ack, by any parent placement, answers for every copy)
    pushed = Counter((it.partition_id, ref.segment_id) for it in manifests[0].items for ref in it.incoming)
    assert pushed and set(pushed.values()) == {1}, pushed
    assert triples(env.catalog) == model.snapshot()
    converge(env)
    assert_parent_retired(env)


def test_bad_split_requests_name_the_problem_and_change_nothing(env: Env) -> None:
    Model().upsert(env, range(0, 10), "a")
    before = partition_states(env)
    for keys, match in [([], "at least one split key"), (["zz"], "not inside"), (["b", "b"], "distinct")]:
        with pytest.raises(SegrepError, match=match):
            start_split(env.catalog, TABLE, PARENT, keys)
    with pytest.raises(SegrepError, match="no partition 99"):
        start_split(env.catalog, TABLE, 99, ["b"])
    with pytest.raises(SegrepError, match="not a valid int64"):
        start_split(env.catalog, "orders", 1, ["abc"])
    assert partition_states(env) == before
    with env.catalog.read() as s:
        assert s.scalars(select(m.Split)).all() == []


SPLIT_POINTS = [x for x in faults.POINTS if x.startswith("split_")]


@pytest.mark.parametrize("point", ["in_merge_job", *SPLIT_POINTS])
def test_a_crash_at_each_step_then_a_rerun_converges(
    sqlite_env: Env, spark: Any, point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = sqlite_env
    model = Model()
    for n in range(3):
        model.upsert(env, range(n * 30, n * 30 + 30), f"w{n}")
    converge(env)
    manifests: list[Manifest] = []
    submit = inprocess(spark, manifests)
    monkeypatch.setenv(faults.FAULTS_ENV, point)
    with pytest.raises(faults.InjectedFault):
        run_split(env.catalog, env.defs, TABLE, PARENT, ["b"], submit=submit)
        converge(env)  # the parent goes (split_before_parent_files) after a round carried the children
    monkeypatch.delenv(faults.FAULTS_ENV)
    model.upsert(env, range(0, 10), "between")
    report = run_split(env.catalog, env.defs, TABLE, PARENT, ["b"], submit=submit)
    if point == "split_before_parent_files":  # the parent was retired; the re-run removes its files
        assert report.state == SplitState.DONE and report.finish.files_removed > 0
    else:
        assert_unloaded(env, report.finish)
    done = rewritten(manifests)
    if point != "in_merge_job":  # a job that died before its result file is re-run; nothing else is
        assert len(done) == len(set(done)) >= 2 * 3
    assert triples(env.catalog) == model.snapshot()
    converge(env)
    assert_parent_retired(env)


def test_a_leader_change_mid_split_resumes_from_the_acks(env: Env, spark: Any) -> None:
    model = Model()
    for n in range(2):
        model.upsert(env, range(n * 30, n * 30 + 30), f"w{n}")
    converge(env)
    ref = start_split(env.catalog, TABLE, PARENT, ["b"])
    manifests: list[Manifest] = []
    submit = inprocess(spark, manifests)
    first = plan_pass(env.catalog, env.defs, ref.split_id)
    submit("merge", ["--manifest", str(first.manifest), "--result", str(first.result)], name="t")
    commit_pass(env.catalog, first)
    assert len(rewritten(manifests)) == 2 * 2
    model.upsert(env, range(60, 90), "old_leader")  # not yet rewritten for the children
    converge(env)
    set_leader(env.catalog, "dr", partition_ids=[PARENT])  # the parent's leader fails over to dr
    model.upsert(env, range(90, 100), "new_leader")
    report = run_split(env.catalog, env.defs, TABLE, PARENT, submit=submit)
    assert_unloaded(env, report.finish)
    done = rewritten(manifests)
    assert len(done) == len(set(done)) == 2 * 4  # the two acked segments were never rewritten again
    assert triples(env.catalog) == model.snapshot()
    converge(env)
    assert_parent_retired(env)


def test_a_replica_offline_during_the_split_pushes_when_back(outage_env: Env, spark: Any) -> None:
    env = outage_env
    model = Model()
    model.upsert(env, range(0, 60), "a")
    converge(env)
    set_leader(env.catalog, "edge", partition_ids=[PARENT])  # edge leads a while: a fork nobody else has
    model.upsert(env, range(40, 80), "edge")
    model.delete(env, range(0, 6))
    set_leader(env.catalog, "primary", partition_ids=[PARENT])
    aside = take_down(env, "edge")  # ... and goes away before anyone merged it

    manifests: list[Manifest] = []
    submit = inprocess(spark, manifests)
    report = run_split(env.catalog, env.defs, TABLE, PARENT, ["b"], submit=submit)
    assert report.state == SplitState.UNLOAD and report.waiting  # edge could not push
    model.upsert(env, range(50, 60), "after_split")  # newer than edge's fork for these keys
    assert partition_states(env)[PARENT] == "UNLOAD"
    code, out, err = cli(env, "status", TABLE)
    assert code == 0, err
    assert f"split {report.split_id} of {TABLE} partition {PARENT} at ['b'] (sync): UNLOAD" in out
    assert "pushing from dr, edge, primary" in out and "lacking" in out

    bring_up(env, "edge", aside)
    report = run_split(env.catalog, env.defs, TABLE, PARENT, submit=submit)
    assert_unloaded(env, report.finish)
    assert triples(env.catalog) == model.snapshot()  # edge's fork merged; after_split rows kept
    assert {p for _t, k, p in triples(env.catalog) if 50 <= k < 60} == {f"after_split{k}" for k in range(50, 60)}
    converge(env)
    assert_parent_retired(env)


def test_split_through_the_cli_with_spark_submit_and_status(sqlite_env: Env) -> None:
    """`segrep split` end to end, the rewrite run by a real spark-submit; `segrep status` shows the split."""
    env = sqlite_env
    model = Model()
    model.upsert(env, range(0, 40), "a")
    code, _out, err = cli(env, "split", TABLE, str(PARENT), "--at", "zz")
    assert code == 2 and "not inside" in err and "Traceback" not in err
    code, out, err = cli(env, "split", TABLE, str(PARENT), "--at", "b", "--async")
    assert code == 0, err
    assert "unload pass: 0 rewrite(s), 2 merge(s)" in out and ": UNLOAD, parent UNLOAD," in out
    assert "the parent is retired once rounds carry the children to their replicas (" in out
    code, out, err = cli(env, "round", TABLE)
    assert code == 0 and "every replica holds the children; parent retired" in out, out + err
    assert_parent_retired(env)
    assert triples(env.catalog, "dr") == model.snapshot()
    code, out, err = cli(env, "status", TABLE)  # the retired parent is no longer counted as a led partition
    assert code == 0 and out.startswith("events: leader primary (3 partitions), epoch 1\n"), out + err
    code, out, err = cli(env, "status")
    assert code == 0 and "split" not in out  # a finished split leaves the status

    code, out, err = cli(env, "split", TABLE, "6", "--at", "y")
    assert code == 0, err
    model.upsert(env, range(40, 60), "b")
    code, out, err = cli(env, "split", TABLE, "6", "--at", "x")
    assert code == 2 and "already has split" in err
