"""Garbage collection with retention (DESIGN sections 6, 7 and 9.7), on SQLite and PostgreSQL, without Spark.

Majors are made by ``segrep.maintenance.compaction.compact``, small enough to run in process
(``spark.in_process``; tests/spark/test_in_process_merge.py shows it writes what the Spark job writes); the
commit is the real one.

What is checked: a dry run lists every file that would go with its reason and changes nothing; a real run
deletes exactly those, after which every site holds exactly the files its catalog lists and every list holds
exactly what its chain needs; orphan files (a stray valid-looking segment, a temporary file) go only after
the grace; an offline replica holds GC until the retention ends, then is marked as needing a bootstrap; a
crash between the catalog delete and the file delete leaves orphans, never a dangling catalog row, and a
later run removes them with nothing lost.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.core import hlc
from segrep.maintenance import gc as gc_mod
from segrep.maintenance.bootstrap import bootstrap
from segrep.maintenance.compaction import compact
from segrep.maintenance.gc import collect
from segrep.maintenance.repair import repair
from segrep.replication.orchestrator import run_round
from segrep.replication.status import status_rows
from segrep.storage.site import Site
from tests.support.checks import assert_files_match_catalog, catalog_state, partitions, triples
from tests.support.cli import cli
from tests.support.env import ORDERS_YAML, Env, env_fixture, sqlite_url
from tests.support.maintenance import (
    all_sites_read_the_model,
    assert_lists_hold_exactly_what_chains_need,
    assert_sites_hold_exactly_the_catalog,
    catalog_relpaths,
    chain_report,
    files_at,
)
from tests.support.models import Model
from tests.support.rounds import bring_up, no_spark, round_until_idle, set_leader, take_down
from tests.support.tables import REPLICAS, TABLE
from tests.support.union import drop_at_leader_while_replicas_are_away, load_events

GC_YAML = ORDERS_YAML.replace(
    "    replicas: [dr, edge]\n", "    replicas: [dr, edge]\n    policy: {retry_delay_s: 0, compact_min_segments: 2}\n"
)
DAY_US = 86400 * 1_000_000


# -- helpers ------------------------------------------------------------------------------------------------------


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def compacted(env: Env, model: Model) -> None:
    """Three batches and a delete at the leader, a round, a compaction of both partitions, a round."""
    model.upsert(env, range(60), "a")
    model.upsert(env, range(40, 90), "b")
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).status == "ok"
    model.upsert(env, range(80, 100), "c")
    model.delete(env, range(0, 10))
    report = compact(env.catalog, env.defs, TABLE, submit=no_spark)  # small: folded in process
    assert report.committed == 2 and report.spark_apps == 0, report
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    for site in REPLICAS:  # the c batch and the delete are behind the majors: only the majors travel
        assert rep.targets[site].outcomes == {"FAST_FORWARD": 2}, rep.targets[site]


@pytest.fixture
def gc_env(catalog_url: str, tmp_path: Path) -> Any:
    yield from env_fixture(tmp_path, catalog_url, GC_YAML)


@pytest.fixture
def gc_sqlite(tmp_path: Path) -> Any:
    yield from env_fixture(tmp_path, sqlite_url(tmp_path), GC_YAML)


# -- tests --------------------------------------------------------------------------------------------------------


def test_dry_run_lists_each_file_and_why_then_gc_leaves_exactly_the_catalog(gc_env: Env) -> None:
    env = gc_env
    model = Model()
    compacted(env, model)
    all_sites_read_the_model(env, model)
    expected = {}  # what must go: every listed segment its chain no longer needs (all are behind the majors)
    for (site, _pid), (listed, visible) in chain_report(env).items():
        for seg in set(listed) - set(visible):
            expected[(site, seg)] = "leader: " if site == "primary" else "follower: "
    assert len([k for k in expected if k[0] == "primary"]) == 8  # 4 minors in each of the 2 partitions
    assert len([k for k in expected if k[0] == "dr"]) == 4  # the replicas had the first two batches

    before = catalog_state(env)
    dry = collect(env.catalog, env.defs, TABLE, dry_run=True)
    assert catalog_state(env) == before and dry.files_removed == 0
    assert dry.held == [] and dry.needs_bootstrap == []
    reasons = {(d.site, d.segment_id): d.reason for d in dry.deletions}
    assert len(reasons) == len(dry.deletions) and set(reasons) == set(expected)
    assert all(reasons[key].startswith(prefix) for key, prefix in expected.items()), reasons
    for d in dry.deletions:
        assert d.relpath == f"{TABLE}/{_pid_of(env, d.segment_id)}/{d.segment_id}.parquet"
        assert (env.site_dir(d.site) / d.relpath).exists()

    code, out, err = cli(env, "gc", TABLE, "--dry-run")
    assert code == 0, err
    lines = out.splitlines()
    assert len([x for x in lines if x.startswith("would delete ") and "  (" in x]) == len(expected)
    assert any(x.startswith("would delete primary:events/") and "(leader: weakly referenced" in x for x in lines)
    assert lines[-1] == f"would delete {len(expected)} segment(s)/orphan(s); {len(expected)} file(s)"
    assert catalog_state(env) == before

    real = collect(env.catalog, env.defs, TABLE)
    assert sorted((d.site, d.relpath, d.reason) for d in real.deletions) == sorted(
        (d.site, d.relpath, d.reason) for d in dry.deletions
    )
    assert real.files_removed == len(expected)
    assert_sites_hold_exactly_the_catalog(env)
    assert_lists_hold_exactly_what_chains_need(env)
    assert_files_match_catalog(env)
    all_sites_read_the_model(env, model)

    after = catalog_state(env)
    again = collect(env.catalog, env.defs)  # every table; nothing more to do
    assert again.deletions == [] and again.files_removed == 0 and catalog_state(env) == after

    model.upsert(env, range(100, 110), "d")  # replication goes on after GC
    round_until_idle(env)
    all_sites_read_the_model(env, model)


def _pid_of(env: Env, segment_id: str) -> int:
    with env.catalog.read() as s:
        return s.scalars(select(m.Segment.partition_id).where(m.Segment.segment_id == segment_id)).first()


def test_orphans_go_only_after_the_grace(gc_sqlite: Env) -> None:
    env = gc_sqlite
    model = Model()
    model.upsert(env, range(30), "a")
    round_until_idle(env)
    pid = partitions(env.catalog)[0]
    real = sorted(catalog_relpaths(env, "dr"))[0]
    folder = env.site_dir("dr") / TABLE / str(pid)
    stray = folder / f"{'ab' * 16}.parquet"  # a valid segment file under a name nobody lists
    shutil.copyfile(env.site_dir("dr") / real, stray)
    temp = folder / f".{'cd' * 16}.parquet.tmp-0a1b2c3d"  # what a crashed atomic write leaves
    temp.write_bytes(b"partial")
    keep = [folder / "NOTES.txt", env.site_dir("dr") / ".replaced" / "1" / TABLE / str(pid) / f"{'ef' * 16}.parquet"]
    for path in keep:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"not ours to delete")
    grace_us = env.defs.table(TABLE).policy.orphan_grace_s * 1_000_000
    now = hlc.now_us()

    for at in (now, now + grace_us - 60_000_000):  # young orphans stay
        report = collect(env.catalog, env.defs, TABLE, now_us=at)
        assert report.deletions == [] and report.files_removed == 0
        assert stray.exists() and temp.exists()

    before = catalog_state(env)
    dry = collect(env.catalog, env.defs, TABLE, dry_run=True, now_us=now + grace_us + 60_000_000)
    assert catalog_state(env) == before
    assert sorted((d.site, d.relpath) for d in dry.deletions) == sorted(
        [("dr", str(stray.relative_to(env.site_dir("dr")))), ("dr", str(temp.relative_to(env.site_dir("dr"))))]
    )
    assert all(d.reason.startswith("orphan: not in the catalog for ") and d.placement_id is None for d in dry.deletions)

    report = collect(env.catalog, env.defs, TABLE, now_us=now + grace_us + 60_000_000)
    assert report.files_removed == 2 and not stray.exists() and not temp.exists()
    assert all(path.exists() for path in keep)
    assert files_at(env, "dr") == catalog_relpaths(env, "dr") | {str(keep[0].relative_to(env.site_dir("dr")))}
    assert_files_match_catalog(env)
    all_sites_read_the_model(env, model)


def test_an_offline_replica_holds_gc_until_retention_ends(gc_env: Env) -> None:
    env = gc_env
    model = Model()
    model.upsert(env, range(40), "a")
    round_until_idle(env)
    aside = take_down(env, "dr")
    model.upsert(env, range(30, 70), "b")
    model.delete(env, range(0, 5))
    assert compact(env.catalog, env.defs, TABLE, submit=no_spark).committed == 2
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert rep.failed == ["dr"] and rep.targets["edge"].status == "ok"
    leader_before = set(catalog_relpaths(env, "primary"))

    report = collect(env.catalog, env.defs, TABLE)
    assert report.needs_bootstrap == []
    assert len(report.held) == 2 and all("held for dr" in h for h in report.held), report.held
    assert {d.site for d in report.deletions} == {"edge"}  # edge drops what it no longer needs; dr and the
    assert catalog_relpaths(env, "primary") == leader_before  # leader keep what dr still needs
    retention_us = env.defs.table(TABLE).policy.max_retention_s * 1_000_000
    almost = collect(env.catalog, env.defs, TABLE, now_us=hlc.now_us() + retention_us - 60_000_000)
    assert almost.needs_bootstrap == [] and len(almost.held) == 2 and almost.deletions == []
    assert not any("NEEDS BOOTSTRAP" in r.note() for r in status_rows(env.catalog, TABLE))

    past = hlc.now_us() + retention_us + 60_000_000
    code, out, err = cli(env, "gc", TABLE, "--dry-run")  # (real time: still held)
    assert code == 0 and "held: partition" in out and "ALERT" not in out, (out, err)
    report = collect(env.catalog, env.defs, TABLE, now_us=past)
    assert len(report.needs_bootstrap) == 2 and all(
        " at dr " in x and "needs a bootstrap" in x for x in report.needs_bootstrap
    )
    assert {d.site for d in report.deletions} == {"primary"}
    notes = {r.target: r.note() for r in status_rows(env.catalog, TABLE)}
    assert "NEEDS BOOTSTRAP: run segrep bootstrap events dr" in notes["dr"] and "NEEDS" not in notes["edge"]
    code, out, err = cli(env, "status", TABLE)
    assert code == 0 and "NEEDS BOOTSTRAP" in out

    bring_up(env, "dr", aside)
    stale = triples(env.catalog, "dr")
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert rep.targets["dr"].outcomes == {} and triples(env.catalog, "dr") == stale  # no offers, no pushes
    assert "dr" not in rep.safe_time_us
    assert_files_match_catalog(env)
    all_sites_read_the_model(env, model, ("primary", "edge"))


def test_a_crash_between_the_catalog_delete_and_the_file_delete(gc_env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    env = gc_env
    model = Model()
    compacted(env, model)
    dry = collect(env.catalog, env.defs, TABLE, dry_run=True)
    doomed = {(d.site, d.relpath) for d in dry.deletions}
    assert doomed

    calls = []
    real_delete = Site.delete

    def dying_delete(self: Site, relpath: str) -> None:  # the process dies after the first file went
        calls.append(relpath)
        if len(calls) == 2:
            raise RuntimeError("killed")
        real_delete(self, relpath)

    monkeypatch.setattr(Site, "delete", dying_delete)
    with pytest.raises(RuntimeError, match="killed"):
        collect(env.catalog, env.defs, TABLE)
    monkeypatch.setattr(Site, "delete", real_delete)
    assert_files_match_catalog(env)  # no catalog row points at a missing file
    all_sites_read_the_model(env, model)
    first_partition_left = {(s, r) for s, r in doomed if (env.site_dir(s) / r).exists()}
    assert len(first_partition_left) == len(doomed) - 1  # only the first file went before the crash

    def dying_files(catalog: Any, deletions: list[Any], *args: Any) -> int:
        if deletions:  # partition 5 has nothing left to delete; partition 6's rows are committed first
            raise RuntimeError("killed before any file")
        return 0

    monkeypatch.setattr(gc_mod, "_remove_files", dying_files)
    with pytest.raises(RuntimeError, match="killed before any file"):
        collect(env.catalog, env.defs, TABLE)  # the second partition's rows go; no file does
    monkeypatch.undo()
    assert_files_match_catalog(env)
    all_sites_read_the_model(env, model)

    rerun = collect(env.catalog, env.defs, TABLE)  # nothing left in the catalog to delete; orphans are young
    assert rerun.deletions == [] and rerun.files_removed == 0
    grace_us = env.defs.table(TABLE).policy.orphan_grace_s * 1_000_000
    left = {x for x in doomed if (env.site_dir(x[0]) / x[1]).exists()}
    assert left == first_partition_left
    later = collect(env.catalog, env.defs, TABLE, now_us=hlc.now_us() + grace_us + 1_000_000)
    assert {(d.site, d.relpath) for d in later.deletions} == left
    assert all(d.reason.startswith("orphan") for d in later.deletions)
    assert_sites_hold_exactly_the_catalog(env)
    assert_lists_hold_exactly_what_chains_need(env)
    all_sites_read_the_model(env, model)
    model.upsert(env, range(200, 210), "z")
    round_until_idle(env)
    all_sites_read_the_model(env, model)


def test_gc_with_a_site_down_spares_it_and_finishes_the_others(gc_sqlite: Env) -> None:
    env = gc_sqlite
    model = Model()
    compacted(env, model)
    aside = take_down(env, "edge")
    try:
        report = collect(env.catalog, env.defs, TABLE)
    finally:
        bring_up(env, "edge", aside)
    assert {d.site for d in report.deletions} == {"primary", "dr", "edge"}
    assert any(h.startswith("edge:events/") and "not removed" in h for h in report.held), report.held
    for site in ("primary", "dr"):
        assert files_at(env, site) == catalog_relpaths(env, site)
    assert_files_match_catalog(env)
    all_sites_read_the_model(env, model)
    grace_us = env.defs.table(TABLE).policy.orphan_grace_s * 1_000_000
    collect(env.catalog, env.defs, TABLE, now_us=hlc.now_us() + grace_us + 1_000_000)
    assert_sites_hold_exactly_the_catalog(env)
    assert_lists_hold_exactly_what_chains_need(env)


def test_a_caught_up_replica_is_never_out_of_retention(gc_sqlite: Env) -> None:
    """Replicas that took the majors never received the minors folded before they came: they need nothing,
    however long the table stays quiet, so GC neither holds for them nor sends them to a bootstrap."""
    env = gc_sqlite
    model = Model()
    compacted(env, model)
    retention_us = env.defs.table(TABLE).policy.max_retention_s * 1_000_000
    report = collect(env.catalog, env.defs, TABLE, now_us=hlc.now_us() + 10 * retention_us)
    assert report.needs_bootstrap == [] and report.held == []
    assert not any(r.note() for r in status_rows(env.catalog, TABLE))
    assert_lists_hold_exactly_what_chains_need(env)
    model.upsert(env, range(100, 120), "d")
    reports = round_until_idle(env)
    assert reports[0].targets["dr"].outcomes == {"FAST_FORWARD": 2}  # one new minor per partition
    all_sites_read_the_model(env, model)


def test_a_leader_change_does_not_send_caught_up_replicas_to_a_bootstrap(gc_sqlite: Env) -> None:
    """The new leader has recorded no acks yet; the replicas hold its newest majors all the same (the same
    segment ids in their own lists), so however old their last ack, they need nothing and stay."""
    env = gc_sqlite
    model = Model()
    compacted(env, model)
    set_leader(env.catalog, "dr")
    far = hlc.now_us() + 10 * env.defs.table(TABLE).policy.max_retention_s * 1_000_000
    report = collect(env.catalog, env.defs, TABLE, now_us=far)
    assert report.needs_bootstrap == [], report.needs_bootstrap
    assert not any("NEEDS BOOTSTRAP" in r.note() for r in status_rows(env.catalog, TABLE))
    assert {d.site for d in report.deletions} == {"primary", "edge"}  # the new leader waits for acks
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)  # they answer SEGMENT_EXISTS: acks
    assert rep.status == "ok" and rep.targets["edge"].outcomes == {"SEGMENT_EXISTS": 2}
    report = collect(env.catalog, env.defs, TABLE, now_us=far)
    # dr drops what its majors cover; primary the minors it kept because dr never had them (folded into the
    # majors first), which the round's pushes had dr answer SEGMENT_EXISTS for
    assert report.needs_bootstrap == [] and {d.site for d in report.deletions} == {"dr", "primary"}
    assert_sites_hold_exactly_the_catalog(env)
    assert_lists_hold_exactly_what_chains_need(env)
    model.upsert(env, range(300, 310), "n")  # written at dr, the leader now
    round_until_idle(env)
    assert triples(env.catalog, "primary") == triples(env.catalog) == model.snapshot()
    assert triples(env.catalog, "edge") == model.snapshot()


def test_compact_cli_selects_partitions_and_launches_nothing_when_nothing_is_due(gc_sqlite: Env) -> None:
    env = gc_sqlite
    model = Model()
    compacted(env, model)  # both partitions end with a major: nothing is due, even forced
    p0, p1 = partitions(env.catalog)
    model.upsert(env, range(0, 40, 4), "d")  # tenant a only: one minor in p0
    code, out, err = cli(env, "compact", TABLE, "--partition", str(p1), "--force")
    assert (code, out.strip()) == (0, f"{TABLE}: no partition is due for compaction"), err
    code, out, err = cli(env, "compact", TABLE)  # one minor < compact_min_segments 2
    assert (code, out.strip()) == (0, f"{TABLE}: no partition is due for compaction"), err
    report = compact(env.catalog, env.defs, TABLE, partitions=[p0], force=True, submit=no_spark)
    assert [c.partition_id for c in report.candidates] == [p0] and report.committed == 1
    code, _out, err = cli(env, "compact", "nope")
    assert code == 2 and err.startswith("segrep: error: unknown table 'nope'")
    round_until_idle(env)
    all_sites_read_the_model(env, model)


def test_gc_never_deletes_a_returning_sites_copy_of_what_the_leader_lost(outage_env: Env) -> None:
    """The union rule and GC (issue 32): the leader lost a segment while dr and edge, which hold it, were
    away (a rebuild dropped it). Once back, GC keeps their copies, even where dr's placement was replaced
    meanwhile (a re-bootstrap, as repair did before it mended leaders first): an ack saying the leader held
    the segment used to let GC delete the replaced placement's copy, the last one at that site. Repair then
    brings the rows back from a replica."""
    env = outage_env
    model = load_events(env)
    lost = drop_at_leader_while_replicas_are_away(env)
    with env.catalog.write() as s:  # dr's placements need a bootstrap: replaced by new ones from the leader
        site_id = s.scalars(select(m.Site.site_id).where(m.Site.name == "dr")).one()
        for pl in s.scalars(select(m.Placement).where(m.Placement.site_id == site_id)):
            pl.needs_bootstrap = True
    bootstrap(env.catalog, env.defs, TABLE, "dr", "auto")

    report = collect(env.catalog, env.defs, TABLE, now_us=hlc.now_us() + 10**12)  # past every grace
    assert lost.relpath not in {d.relpath for d in report.deletions}, report.deletions
    assert any(lost.segment_id in x and "the leader lacks it" in x for x in report.held), report.held
    for site in ("dr", "edge"):
        assert (env.site_dir(site) / lost.relpath).exists(), site

    done = repair(env.catalog, env.defs, TABLE, submit=no_spark)
    assert [(x.segment_id, x.fetched) for x in done.leader] == [(lost.segment_id, True)]
    assert triples(env.catalog, "primary") == model.snapshot()
