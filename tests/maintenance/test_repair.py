"""`segrep repair` (DESIGN section 13), on SQLite and PostgreSQL: bad files fetched again from an intact copy
(the leader's from a replica's), divergent copies set back to the leader's segment, replicas whose chains
differ re-bootstrapped, segments intact nowhere reported LOST with nothing deleted; --dry-run changes nothing."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import select

from segrep.catalog import link_slots as lk
from segrep.catalog import models as m
from segrep.catalog.link_lease import LinkLease
from segrep.core import hlc
from segrep.maintenance.repair import repair
from segrep.maintenance.verify import Verdict, verify
from tests.support.badinput import catalog_rows, tree_state, unchanged
from tests.support.checks import assert_files_match_catalog, assert_replicas_equal_leader, sorted_table, triples
from tests.support.cli import cli
from tests.support.damage import (
    Copy,
    change_payload,
    copies_at,
    copy_holding,
    delete,
    flip_bit,
    forget_root,
    rewrite_segment,
    swap,
    truncate,
)
from tests.support.env import Env
from tests.support.models import Model
from tests.support.rounds import no_spark, round_until_idle, set_leader
from tests.support.tables import TABLE
from tests.support.union import drop_at_leader_while_replicas_are_away, load_events


def replicated(env: Env) -> None:
    model = Model()
    model.upsert(env, range(40), "a")
    model.upsert(env, range(20, 60), "b")
    model.delete(env, range(0, 4))
    round_until_idle(env)


def _one(fn: Callable[[Path], None]) -> Callable[[list[Copy]], list[Copy]]:
    def damage(copies: list[Copy]) -> list[Copy]:
        fn(copies[0].path)
        return copies[:1]

    return damage


def _swap(copies: list[Copy]) -> list[Copy]:
    a, b = copies[0], next(c for c in copies[1:] if c.partition_id == copies[0].partition_id)
    swap(a.path, b.path)
    return [a, b]


DAMAGE = {"bit-flip": _one(flip_bit), "truncation": _one(truncate), "deletion": _one(delete), "swap": _swap}


@pytest.mark.parametrize("site", ["primary", "dr"])
@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_bad_file_is_found_then_fetched_again(env: Env, kind: str, site: str) -> None:
    replicated(env)
    before = sorted_table(env.catalog)
    damaged = DAMAGE[kind](copies_at(env, site))
    code, out, err = cli(env, "verify", TABLE, "--files")
    assert code == 1, out + err
    for c in damaged:
        assert f"{c.path} at {site}" in out, out
    assert out.count(" at primary (segment") + out.count(" at dr (segment") == len(damaged)

    with unchanged(env):
        code, out, err = cli(env, "repair", TABLE, "--dry-run")
    assert code == 1 and "dry run" in out
    assert all(f"would fetch {c.path} at {site}" in out for c in damaged), out

    code, out, err = cli(env, "repair", TABLE)
    assert code == 0, out + err
    assert all(f"fetched {c.path} at {site}" in out for c in damaged), out
    code, out, err = cli(env, "verify", TABLE, "--files")
    assert code == 0, out + err
    assert_files_match_catalog(env)
    assert sorted_table(env.catalog).equals(before)
    assert_replicas_equal_leader(env.catalog)


def test_a_divergent_replica_copy_is_set_back_to_the_leaders_segment(env: Env) -> None:
    replicated(env)
    target = copy_holding(env, "dr", 8)
    rewrite_segment(env, target, change_payload(8, "tampered"))
    code, out, _ = cli(env, "verify", TABLE, "--files")
    assert code == 1 and f"DIVERGENT: {target.path} at dr" in out and "different: ['a', 8]" in out, out
    code, out, err = cli(env, "repair", TABLE, "--site", "dr")
    assert code == 0, out + err
    assert "its catalog row set back to the leader's" in out
    code, out, err = cli(env, "verify", TABLE, "--files")
    assert code == 0, out + err
    with env.catalog.read() as s:
        shas = set(s.scalars(select(m.Segment.sha256).where(m.Segment.segment_id == target.segment_id)))
    assert len(shas) == 1
    assert_replicas_equal_leader(env.catalog)


def test_a_segment_damaged_at_every_site_is_lost_and_nothing_is_deleted(env: Env) -> None:
    replicated(env)
    leader = copy_holding(env, "primary", 8)
    held = [c for site in ("primary", "dr", "edge") for c in copies_at(env, site) if c.segment_id == leader.segment_id]
    assert len(held) == 3
    for c in held:
        flip_bit(c.path)
    files_before = set(tree_state(env.root))
    segments_before = catalog_rows(env)["segments"]
    code, out, err = cli(env, "repair", TABLE)
    assert code == 1, out + err
    assert f"LOST: segment {leader.segment_id} of partition {leader.partition_id}" in out
    assert "no intact copy at any site; bad at dr, edge, primary; nothing was deleted" in out
    assert set(tree_state(env.root)) >= files_before
    assert catalog_rows(env)["segments"] == segments_before
    assert all(c.path.exists() for c in held)


def test_a_replica_chain_missing_a_segment_is_rebootstrapped(env: Env) -> None:
    replicated(env)
    target = copy_holding(env, "dr", 8)
    forget_root(env, "dr", target.partition_id)
    report = verify(env.catalog, TABLE, site="dr")
    bad = [r for r in report.rows if r.verdict != Verdict.EQUAL]
    # the forgotten segment is the newest, the delete of keys 0..3: dr still shows its partition's two
    assert len(bad) == 1 and bad[0].only_at_replica == (["a", 0], ["b", 1]) and not bad[0].only_at_leader

    with unchanged(env):
        dry = repair(env.catalog, env.defs, TABLE, dry_run=True, submit=no_spark)
    assert [(r.site, r.partition_id) for r in dry.rebootstraps] == [("dr", target.partition_id)] and not dry.clean

    done = repair(env.catalog, env.defs, TABLE, submit=no_spark)
    assert done.clean and done.after is not None and done.after.differences == 0
    assert [(r.site, r.partition_id) for r in done.rebootstraps] == [("dr", target.partition_id)]
    code, out, err = cli(env, "verify", TABLE, "--files")
    assert code == 0, out + err
    assert_replicas_equal_leader(env.catalog)


def test_repair_mends_the_leader_from_the_replicas_and_rebuilds_no_replica_from_it(outage_env: Env) -> None:
    """The tester's first case, the repair half: the leader lost a segment both replicas hold (a rebuild
    dropped it while they were away). Repair re-bootstrapped both replicas from the leader and reported
    "all equal": the rows were gone at every site. It must fetch the segment back to the leader instead."""
    env = outage_env
    model = load_events(env)
    lost = drop_at_leader_while_replicas_are_away(env)
    assert triples(env.catalog, "primary") != model.snapshot()

    with unchanged(env):
        dry = repair(env.catalog, env.defs, TABLE, dry_run=True, submit=no_spark)
    assert [(x.segment_id, x.relinks, x.source) for x in dry.leader] == [(lost.segment_id, True, "dr")]
    # before the mend the replicas' rows differ from the leader's: held back, not re-bootstrapped from it
    assert dry.rebootstraps == [] and {r.site for r in dry.held_back} == {"dr", "edge"} and not dry.clean

    done = repair(env.catalog, env.defs, TABLE, submit=no_spark)
    text = str(done)
    assert done.rebootstraps == [] and done.clean, text
    assert f"LEADER LACKS segment {lost.segment_id}" in text and "fetched to the leader from dr" in text, text
    for site in ("primary", "dr", "edge"):
        assert triples(env.catalog, site) == model.snapshot(), site
    assert_files_match_catalog(env)
    round_until_idle(env)  # rounds have nothing to undo
    for site in ("primary", "dr", "edge"):
        assert triples(env.catalog, site) == model.snapshot(), site


def test_a_leaders_mend_over_a_capped_link_goes_at_a_failbacks_share(outage_env: Env) -> None:
    """The fetch back to the leader crosses dr -> primary: with a cap there it holds a failback's slot and is
    paced at its share (a slower link than the file: the mend takes at least size / cap)."""
    env = outage_env
    load_events(env)
    lost = drop_at_leader_while_replicas_are_away(env)
    cap = 2048  # the segment is a few kB: two seconds or so
    taken: list[tuple[str, str, str]] = []

    def capped(source: str, target: str) -> lk.Limits | None:
        return lk.Limits(cap_bytes_per_s=cap) if (source, target) == ("dr", "primary") else None

    real_enter = LinkLease.__enter__

    def entering(lease: LinkLease) -> LinkLease:
        taken.append((lease.source, lease.target, str(lease.what)))
        return real_enter(lease)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LinkLease, "__enter__", entering)
        started = time.monotonic()
        done = repair(env.catalog, env.defs, TABLE, submit=no_spark, links=capped)
        elapsed = time.monotonic() - started
    assert done.clean and [x.segment_id for x in done.leader] == [lost.segment_id], str(done)
    assert taken == [("dr", "primary", "failback")]
    assert lost.byte_size > cap and elapsed >= (lost.byte_size - cap // 4) / cap, (lost.byte_size, elapsed)
    with env.catalog.read() as s:
        assert lk.slots(s, hlc.now_us()) == []  # released


def test_a_replica_holding_a_fork_the_leader_lacks_is_never_rebootstrapped(outage_env: Env) -> None:
    """Rows dr wrote while it led, which the leader lacks (it went on writing, and no round has merged them
    yet): dr's rows differ from the leader's, and repair holds dr back instead of re-bootstrapping it from a
    leader that lacks them; the acks are left so that rounds push them (they merge on Spark)."""
    env = outage_env
    model = load_events(env)
    set_leader(env.catalog, "dr")
    model.upsert(env, range(100, 104), "dr-")
    at_dr = model.snapshot()
    set_leader(env.catalog, "primary")
    model.upsert(env, range(0, 104, 7), "p-")  # the leader goes on: dr's write is a fork of its chain
    report = repair(env.catalog, env.defs, TABLE, submit=no_spark)
    text = str(report)
    assert report.rebootstraps == [] and not report.clean, text
    assert report.leader and report.after is not None, text
    assert all(not x.relinks and x.holders == ("dr",) for x in report.leader), text
    assert "a fork of the leader's chain; rounds push it to the leader" in text, text
    assert triples(env.catalog, "dr") == at_dr  # dr's rows, its own writes included, are all there
