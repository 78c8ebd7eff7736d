"""Forks merged by Spark in a replication round (DESIGN sections 6 and 8), with real ``spark-submit``.

A follower that led for a while holds segments the leader lacks; the round pushes them, one Spark application
merges them (last writer wins: newer versions win, deletes stay deleted), and the stuck follower is given a
major segment. The merge job is also crashed after its first output file (``in_merge_job``): the retried round
writes the same deterministic output and registers it once. Three Spark applications in all (~20 s each); the
repeated-merge check runs in the session's SparkSession instead. Every merge here is pinned to Spark
(``SEGREP_MERGE_ENGINE``): these forks are small enough to merge in process otherwise.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from sqlalchemy import delete, select

from segrep.catalog import models as m
from segrep.core import faults, hlc
from segrep.core.errors import SegrepError
from segrep.replication.orchestrator import run_round
from segrep.replication.plan import plan_round
from segrep.spark.manifest import Manifest
from segrep.spark.results import commit_results
from segrep.storage.workdir import manifest_path, result_path
from tests.support.checks import (
    assert_acks_are_prefixes,
    assert_each_segment_once,
    assert_files_match_catalog,
    assert_replicas_equal_leader,
    assert_safe_time_honest,
    lease_count,
    safe_times,
    segment_rows,
    triples,
)
from tests.support.env import Env
from tests.support.models import Model
from tests.support.rounds import inprocess_submit, no_spark, set_leader
from tests.support.tables import REPLICAS, TABLE

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("merge_on_spark")]


def fork(env: Env) -> Model:
    """primary leads and replicates; dr leads for a while (updates, deletes, new keys); primary leads again
    and writes over some of dr's keys. Returns the rows everyone must end with."""
    model = Model()
    model.upsert(env, range(60), "a")
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).status == "ok"
    set_leader(env.catalog, "dr")
    model.upsert(env, range(40, 70), "dr")  # 40-49 updated, 60-69 new
    model.delete(env, range(0, 5))  # deleted at dr only
    set_leader(env.catalog, "primary")
    model.upsert(env, range(50, 60), "p")  # newer than dr's 50-59: must win
    model.delete(env, range(45, 48))  # newer delete of keys dr updated: must stay deleted
    return model


def leader_files(env: Env) -> dict[str, str]:
    root = env.site_dir("primary")
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*.parquet")}


def test_fork_merged_by_spark_submit_with_a_crash_in_the_job(sqlite_env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    env = sqlite_env
    model = fork(env)
    expected = model.snapshot()
    assert [k for _t, k, _p in expected if k < 5 or 45 <= k < 48] == []
    end = hlc.now_us()

    monkeypatch.setenv(faults.FAULTS_ENV, "in_merge_job")  # passed on to spark-submit's environment
    # (the error carries the tail of Spark's log, which after spark.stop() is INFO lines, not the traceback)
    with pytest.raises(SegrepError, match="Spark job merge failed"):
        run_round(env.catalog, env.defs, TABLE, end)  # Spark application 1: dies after its first output
    monkeypatch.delenv(faults.FAULTS_ENV)
    manifest = Manifest.load(manifest_path(env.defs, TABLE, end))
    assert [it.kind for it in manifest.items] == ["merge", "merge"]  # dr wrote to both partitions
    outputs = {it.output_segment_id: it.output_relpath for it in manifest.items}
    first = manifest.items[0]
    assert (env.site_dir("primary") / first.output_relpath).exists()  # written before the crash...
    assert not (env.site_dir("primary") / manifest.items[1].output_relpath).exists()  # and it died right there
    assert not set(outputs) & {seg for _p, seg, _h, _r in segment_rows(env.catalog, "primary")}  # ...not committed
    assert not result_path(env.defs, TABLE, end).exists()

    retry = run_round(env.catalog, env.defs, TABLE, end)  # Spark application 2: the retried merge
    assert retry.spark_apps == 1, str(retry)
    assert retry.merges.committed == 2 and retry.merges.dropped == []
    # rows kept: dr's 40-44, 48-49, 60-69 and its deletes of 0-4 (its 45-47 and 50-59 lost to newer writes)
    assert retry.merges.rows_merged == 5 + 2 + 10 + 5 and retry.merges.rows_in == 35
    assert Manifest.load(manifest_path(env.defs, TABLE, end)).items == manifest.items  # the same plan again
    assert triples(env.catalog) == expected  # the leader has every winner now
    assert retry.targets["dr"].outcomes.get("UNMERGED")  # dr waits for the merge of its own fork ...

    reports = []
    for _ in range(4):  # ... then continues from the common segment (no major, no Spark); then idle
        rep = run_round(env.catalog, env.defs, TABLE)
        reports.append(rep)
        for site in REPLICAS:
            assert_safe_time_honest(env.catalog, TABLE, site, rep.safe_time_us[site])
        assert_acks_are_prefixes(env.catalog, TABLE)
        if all(not t.outcomes for t in rep.targets.values()) and not rep.merges.items:
            break
    else:
        pytest.fail("\n".join(str(r) for r in reports))
    assert sum(r.spark_apps for r in reports) == 0, [str(r) for r in reports]
    assert reports[0].plan.majors == [] and reports[0].targets["dr"].outcomes.get("FAST_FORWARD")

    assert triples(env.catalog) == expected
    assert_replicas_equal_leader(env.catalog)
    assert_each_segment_once(env.catalog, ["primary", *REPLICAS])
    assert_files_match_catalog(env)
    assert lease_count(env.catalog) == 0
    leader_ids = [seg for _p, seg, _h, _r in segment_rows(env.catalog, "primary")]
    for seg in outputs:
        assert leader_ids.count(seg) == 1  # the merged segment is registered once, crash or not
    listed = {rel for _p, _s, _h, rel in segment_rows(env.catalog, "primary")}
    assert set(leader_files(env)) == listed  # no second copy of any merge output on disk


def test_a_repeated_merge_keeps_nothing_new(sqlite_env: Env, spark: Any) -> None:
    """A lost ack makes the follower push its merged segments again: the leader's merged segment names what it
    merged, so the leader answers SEGMENT_EXISTS (no second merge); and the round's merge job run again on the
    same manifest registers nothing new (deterministic output ids)."""
    env = sqlite_env
    model = fork(env)
    calls: list[str] = []
    submit = inprocess_submit(spark, calls)
    first = run_round(env.catalog, env.defs, TABLE, submit=submit)
    assert first.merges.committed == 2 and len(calls) == 1
    assert triples(env.catalog) == model.snapshot()
    leader_before = segment_rows(env.catalog, "primary")
    files_before = leader_files(env)
    acks_before = safe_times(env.catalog)

    # the leader forgets that it merged dr's fork (a lost ack): the next round pushes the same segments again
    with env.catalog.write() as s:
        leader_ids = select(m.Placement.placement_id).join(m.Site, m.Site.site_id == m.Placement.site_id)
        dr_ids = leader_ids.where(m.Site.name == "dr")
        s.execute(
            delete(m.Ack).where(
                m.Ack.holder_placement_id.in_(dr_ids),
                m.Ack.target_placement_id.in_(leader_ids.where(m.Site.name == "primary")),
            )
        )
    plan = plan_round(env.catalog, env.defs, TABLE)
    assert plan.summary.pushes == {"SEGMENT_EXISTS": 4} and plan.summary.merges == []

    # the first round's merge job again, on the same manifest: its outputs are already registered
    mpath, rpath = manifest_path(env.defs, TABLE, first.end_us), result_path(env.defs, TABLE, first.end_us)
    submit("merge", ["--manifest", str(mpath), "--result", str(rpath)], name="again")
    again = commit_results(env.catalog, mpath, rpath)
    assert again.items == 2 and again.committed == 0 and again.dropped == []  # found present, not added
    assert segment_rows(env.catalog, "primary") == leader_before  # nothing new at the leader
    assert leader_files(env) == files_before
    assert triples(env.catalog) == model.snapshot()
    assert all(safe_times(env.catalog)[s] >= acks_before[s] for s in REPLICAS)
