"""Compaction on Spark (DESIGN sections 7 and 9): majors, fast-forward to replicas, GC after them, tombstones.

One test runs the real ``spark-submit`` path through ``segrep compact`` (one Spark application); the others run
the merge job (:func:`segrep.spark.jobs.run_manifest`) in the session's SparkSession. Every merge here is pinned
to Spark (``SEGREP_MERGE_ENGINE``): these folds are small enough to run in process otherwise. Checked: compaction leaves
every site's resolved rows unchanged; replicas take each major by fast-forward (no merge, no Spark); after GC
each site holds exactly the files its catalog lists, and each list exactly what its chain needs; a crash in
the job or before its commit is repaired by a re-run (the dead outputs are orphans GC removes after the
grace); tombstones within the grace defeat a late fork; past the grace a replica with an old fork is sent to
a bootstrap instead of being allowed to push (its rows would resurrect deleted ones).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.core import faults, hlc
from segrep.core import schema as sch
from segrep.maintenance import compaction as compaction_mod
from segrep.maintenance.bootstrap import bootstrap
from segrep.maintenance.compaction import compact, plan_compaction
from segrep.maintenance.gc import collect
from segrep.replication.orchestrator import run_round
from segrep.replication.status import status_rows
from segrep.spark import jobs as merge_mod
from segrep.spark.in_process import item_rows
from segrep.spark.manifest import Manifest
from segrep.spark.merge_items import segment_table
from segrep.spark.results import CommitSummary
from tests.support.checks import assert_files_match_catalog, partitions, triples
from tests.support.cli import cli
from tests.support.env import ORDERS_YAML, Env, make_env
from tests.support.maintenance import (
    all_sites_read_the_model,
    assert_lists_hold_exactly_what_chains_need,
    assert_sites_hold_exactly_the_catalog,
    files_at,
)
from tests.support.models import Model
from tests.support.rounds import no_spark, round_until_idle, set_leader
from tests.support.spark import spark_submit_in
from tests.support.tables import TABLE

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("merge_on_spark")]


SITES = ("primary", "dr", "edge")
YAML = ORDERS_YAML.replace(
    "    replicas: [dr, edge]\n", "    replicas: [dr, edge]\n    policy: {retry_delay_s: 0, compact_min_segments: 3}\n"
)
SHORT_GRACE_YAML = ORDERS_YAML.replace(
    "    replicas: [dr, edge]\n",
    "    replicas: [dr, edge]\n    policy: {retry_delay_s: 0, tombstone_grace_s: 1, max_retention_s: 1}\n",
)


def env_of(tmp_path: Path, yaml_text: str = YAML) -> Env:
    return make_env(tmp_path, f"sqlite:///{tmp_path}/catalog.db", yaml_text)


DELETED = (6, 4)  # tombstones of keys 0-9 per partition: tenants a, b (k % 4 in 0, 1) and x, y


def pid_index(env: Env, pid: int) -> int:
    return partitions(env.catalog).index(pid)


def history(env: Env, model: Model) -> None:
    """Per partition: a major (the first batch) and three minors (an overlapping batch, deletes, a batch)."""
    model.upsert(env, range(60), "a")
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).status == "ok"
    model.upsert(env, range(40, 90), "b")
    model.delete(env, range(0, 10))
    model.upsert(env, range(85, 100), "c")
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).status == "ok"


def leader_rows(env: Env) -> dict[int, tuple[m.Placement, list[m.Segment]]]:
    with env.catalog.read() as s:
        out = {}
        for pid in partitions(env.catalog):
            part = s.get(m.Partition, pid)
            leader = s.get(m.Placement, part.leader_placement_id)
            segs = list(
                s.scalars(
                    select(m.Segment).where(m.Segment.placement_id == leader.placement_id).order_by(m.Segment.entry_id)
                )
            )
            out[pid] = (leader, segs)
        s.expunge_all()
    return out


def roots(env: Env, site: str) -> dict[int, str | None]:
    with env.catalog.read() as s:
        return dict(
            s.execute(
                select(m.Placement.partition_id, m.Placement.root_segment_id)
                .join(m.Site, m.Site.site_id == m.Placement.site_id)
                .where(
                    m.Site.name == site,
                    m.Placement.removed_us.is_(None),
                    m.Placement.partition_id.in_(partitions(env.catalog)),
                )
            ).all()
        )


def assert_majors_fast_forwarded(env: Env, rep: dict[str, Any], expected_majors: dict[int, str]) -> None:
    for site in ("dr", "edge"):
        assert rep.targets[site].outcomes == {"FAST_FORWARD": len(expected_majors)}, rep.targets[site]
        assert roots(env, site) == expected_majors
    assert rep.merges == CommitSummary() and rep.spark_apps == 0


# -- the real spark-submit path -------------------------------------------------------------------------------------


def test_compact_with_spark_submit_then_gc_through_the_cli(tmp_path: Path) -> None:
    env = env_of(tmp_path)
    model = Model()
    history(env, model)
    before = leader_rows(env)
    all_sites_read_the_model(env, model, SITES)

    code, out, err = cli(env, "compact", TABLE)  # one Spark application (~20 s) for both partitions
    assert code == 0, err
    lines = out.splitlines()
    assert sum("3 minor segment(s)" in x and "(3 minor segments >= 3)" in x for x in lines) == 2, out
    assert lines[-1] == "committed 2 major segment(s); dropped: none", out

    majors = {}
    for pid, (leader, segs) in leader_rows(env).items():
        old_leader, old_segs = before[pid]
        major = segs[-1]
        assert major.is_major and leader.root_segment_id == major.segment_id and major.origin_site_id == 1
        assert major.base_segment_id == old_leader.root_segment_id  # the newest folded minor
        assert list(major.included_segment_ids) == [x.segment_id for x in old_segs]  # the whole visible chain
        assert (major.row_count, major.deleted_rows) == (50, DELETED[pid_index(env, pid)])  # tombstones kept
        majors[pid] = major.segment_id
    all_sites_read_the_model(env, model, SITES)  # nothing changed for any reader

    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert_majors_fast_forwarded(env, rep, majors)
    all_sites_read_the_model(env, model, SITES)

    code, out, err = cli(env, "gc", TABLE, "--dry-run")
    assert code == 0 and out.count("would delete primary:") == 8 and out.count("would delete dr:") == 8, out
    code, out, err = cli(env, "gc", TABLE)
    assert code == 0 and out.splitlines()[-1] == "deleted 24 segment(s)/orphan(s); 24 file(s)", out
    assert_sites_hold_exactly_the_catalog(env, SITES)
    assert_lists_hold_exactly_what_chains_need(env)
    assert_files_match_catalog(env)
    all_sites_read_the_model(env, model, SITES)
    code, out, err = cli(env, "compact", TABLE)
    assert code == 0 and out.strip() == f"{TABLE}: no partition is due for compaction"
    env.catalog.dispose()


# -- in the session's SparkSession ----------------------------------------------------------------------------------


def test_spark_major_rows_equal_the_in_process_ones(tmp_path: Path, spark: Any) -> None:
    """Small compactions fold in process elsewhere; the Spark row step must produce the very same rows."""
    env = env_of(tmp_path)
    history(env, Model())
    later = hlc.now_us() + 30 * 86400 * 1_000_000  # every tombstone is past the grace then
    plan = plan_compaction(env.catalog, env.defs, TABLE, force=True, now_us=later)
    assert plan.manifest is not None and plan.needs_bootstrap == []
    for item in Manifest.load(plan.manifest).items:
        for it in (item, replace(item, tombstone_cutoff_us=None)):  # tombstones dropped, then kept
            on_spark, in_process = merge_mod._item_rows(spark, it), item_rows(it)
            got = segment_table(on_spark.rows, it.versions.target, it.primary_key)
            want = segment_table(in_process.rows, it.versions.target, it.primary_key)
            assert on_spark.rows_in == in_process.rows_in and got.equals(want), it.tombstone_cutoff_us
            deleted = sum(got[sch.DELETED_COL].to_pylist())
            assert deleted == (0 if it.tombstone_cutoff_us else DELETED[pid_index(env, it.partition_id)])
    env.catalog.dispose()


def test_crashes_in_and_after_the_job_then_a_rerun_converges(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = env_of(tmp_path)
    model = Model()
    history(env, model)
    submit = spark_submit_in(spark)
    catalog_before = leader_rows(env)

    monkeypatch.setenv(faults.FAULTS_ENV, "in_merge_job")  # dies after the first major file was written
    with pytest.raises(faults.InjectedFault):
        compact(env.catalog, env.defs, TABLE, submit=submit)
    monkeypatch.delenv(faults.FAULTS_ENV)
    assert {pid: [x.segment_id for x in segs] for pid, (_l, segs) in leader_rows(env).items()} == {
        pid: [x.segment_id for x in segs] for pid, (_l, segs) in catalog_before.items()
    }
    assert len(files_at(env, "primary")) == 8 + 1  # one uncommitted output: an orphan

    def killed(*args: Any) -> None:
        raise RuntimeError("killed between the job and its commit")

    monkeypatch.setattr(compaction_mod, "commit_results", killed)
    with pytest.raises(RuntimeError, match="killed"):
        compact(env.catalog, env.defs, TABLE, submit=submit)
    monkeypatch.undo()
    assert len(files_at(env, "primary")) == 8 + 3
    assert_files_match_catalog(env)
    all_sites_read_the_model(env, model, SITES)

    report = compact(env.catalog, env.defs, TABLE, submit=submit)  # the re-run plans afresh and commits
    assert report.committed == 2 and report.dropped == []
    majors = {pid: leader.root_segment_id for pid, (leader, _s) in leader_rows(env).items()}
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert_majors_fast_forwarded(env, rep, majors)
    all_sites_read_the_model(env, model, SITES)
    gc = collect(env.catalog, env.defs, TABLE)
    assert not any(d.reason.startswith("orphan") for d in gc.deletions)  # the dead outputs are young
    grace_us = env.defs.table(TABLE).policy.orphan_grace_s * 1_000_000
    gc = collect(env.catalog, env.defs, TABLE, now_us=hlc.now_us() + grace_us + 1_000_000)
    assert sorted(d.site for d in gc.deletions if d.reason.startswith("orphan")) == ["primary"] * 3
    assert_sites_hold_exactly_the_catalog(env, SITES)
    assert_lists_hold_exactly_what_chains_need(env)
    all_sites_read_the_model(env, model, SITES)
    env.catalog.dispose()


def _fork_at_dr_then_deletes_at_primary(env: Env, model: Model) -> tuple[list[int], list[int]]:
    """dr leads for a while and updates keys 0-9 (a fork nobody has merged); primary leads again and deletes
    keys 0-4 (newer than dr's updates). Returns (keys deleted, keys dr updated and nobody deleted)."""
    model.upsert(env, range(20), "a")
    round_until_idle(env)
    set_leader(env.catalog, "dr")
    Model().upsert(env, range(10), "dr")
    set_leader(env.catalog, "primary")
    model.delete(env, range(5))
    return list(range(5)), list(range(5, 10))


def test_tombstones_within_the_grace_defeat_a_late_fork(tmp_path: Path, spark: Any) -> None:
    env = env_of(tmp_path)
    model = Model()
    deleted, updated = _fork_at_dr_then_deletes_at_primary(env, model)
    submit = spark_submit_in(spark)
    report = compact(env.catalog, env.defs, TABLE, force=True, submit=submit)
    assert report.committed == 2 and report.needs_bootstrap == []
    assert sum(segs[-1].deleted_rows for _l, segs in leader_rows(env).values()) == len(deleted)

    reports = round_until_idle(env, submit=submit)  # dr pushes its fork; the merge meets the tombstones
    assert reports[0].merges.committed == 2
    assert reports[0].merges.rows_merged == len(updated)  # its updates of 0-4 lost to the deletes
    for k in updated:
        model.rows[(("a", "b", "x", "y")[k % 4], k)] = f"dr{k}"
    all_sites_read_the_model(env, model, SITES)
    assert not {k for _t, k, _p in triples(env.catalog)} & set(deleted)
    env.catalog.dispose()


def test_past_the_grace_a_replica_with_an_old_fork_is_rebootstrapped_not_merged(tmp_path: Path, spark: Any) -> None:
    env = env_of(tmp_path, SHORT_GRACE_YAML)
    model = Model()
    deleted, _updated = _fork_at_dr_then_deletes_at_primary(env, model)
    time.sleep(1.2)  # the deletes are now older than the grace (1 s); dr has been away as long
    submit = spark_submit_in(spark)
    report = compact(env.catalog, env.defs, TABLE, force=True, submit=submit)
    assert report.committed == 2
    assert len(report.needs_bootstrap) == 2 and all(
        "older than the tombstone grace" in x for x in report.needs_bootstrap
    )
    assert sum(segs[-1].deleted_rows for _l, segs in leader_rows(env).values()) == 0  # tombstones dropped
    note = {r.target: r.note() for r in status_rows(env.catalog, TABLE)}
    assert "NEEDS BOOTSTRAP" in note["dr"] and "NEEDS BOOTSTRAP" not in note["edge"]

    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)  # no push from dr, so no merge
    assert rep.plan is not None and rep.plan.pushes == {} and rep.merges == CommitSummary()
    assert rep.targets["dr"].outcomes == {}
    all_sites_read_the_model(env, model, ("primary", "edge"))
    assert not {k for _t, k, _p in triples(env.catalog)} & set(deleted)

    boot = bootstrap(env.catalog, env.defs, TABLE, "dr")
    assert all("fell out of retention; REMOVED" in a for a in boot.actions)
    round_until_idle(env, submit=no_spark)  # the new placements join from the majors: no merge at all
    all_sites_read_the_model(env, model, SITES)  # dr's fork is not in the table...
    gc = collect(env.catalog, env.defs, TABLE)
    held = [h for h in gc.held if "the leader lacks it" in h]
    assert len(held) == 2, gc.held  # ...and not deleted either: it stays on dr's disk, listed as held
    assert_files_match_catalog(env)
    assert_sites_hold_exactly_the_catalog(env, SITES)  # dr's files include the fork (its removed placement's)
    env.catalog.dispose()
