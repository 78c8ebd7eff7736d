"""Honest catch-up (issue 32): a replica counts as holding a segment only if its list names it and the file is
there. After `catalog rebuild --site dr --accept-loss` dropped a segment no reachable site held, the next
plain round offers dr what it lacks, status shows it pending, and safe time does not claim the lost rows."""

from __future__ import annotations

import json

from segrep.catalog.rebuild import rebuild_site
from segrep.replication.orchestrator import run_round
from tests.support.checks import assert_acks_are_prefixes, assert_safe_time_honest, safe_times, triples
from tests.support.cli import cli
from tests.support.env import Env
from tests.support.rounds import bring_up, no_spark, round_until_idle, take_down
from tests.support.tables import TABLE
from tests.support.union import listed_at, load_events, middle_segment


def _dr_status(env: Env) -> dict:
    code, out, err = cli(env, "status", TABLE, "--json")
    assert code == 0, err
    return next(r for r in json.loads(out)["replication"] if r["target"] == "dr")


def test_a_replica_rebuilt_with_a_loss_is_offered_it_again_and_not_reported_caught_up(outage_env: Env) -> None:
    """The tester's second case: rounds said "dr: ok (nothing to offer)", status 0 pending and a lag of
    0.2 s, while dr served a fraction of the rows; only --reoffer or verify noticed."""
    env = outage_env
    model = load_events(env)
    lost = middle_segment(env, "dr")
    (env.site_dir("dr") / lost.relpath).unlink()
    away = {site: take_down(env, site) for site in ("primary", "edge")}  # no reachable site holds it
    try:
        code, out, err = cli(env, "catalog", "rebuild", "--site", "dr", "--accept-loss")
    finally:
        for site, aside in away.items():
            bring_up(env, site, aside)
    assert code == 0, err
    assert any("LOST" in x and lost.segment_id in x and "dropped" in x for x in out.splitlines()), out
    assert lost.segment_id not in {x.segment_id for x in listed_at(env, "dr")}

    state = _dr_status(env)
    assert state["pending_segments"] >= 1, state
    assert safe_times(env.catalog)["dr"] < lost.min_version  # it does not claim the rows dr lost
    assert_safe_time_honest(env.catalog, TABLE, "dr", safe_times(env.catalog)["dr"])

    report = run_round(env.catalog, env.defs, TABLE, submit=no_spark)  # a plain round: no --reoffer
    dr = report.targets["dr"]
    assert dr.segments_copied >= 1 and dr.outcomes, str(report)
    assert "nothing to offer" not in report.text(["dr"])
    round_until_idle(env)
    for site in ("primary", "dr", "edge"):
        assert triples(env.catalog, site) == model.snapshot(), site
    assert _dr_status(env)["pending_segments"] == 0
    assert_safe_time_honest(env.catalog, TABLE, "dr", safe_times(env.catalog)["dr"])
    assert_acks_are_prefixes(env.catalog, TABLE)


def test_the_newest_segment_lost_at_a_replica_is_offered_again(outage_env: Env) -> None:
    env = outage_env
    model = load_events(env)
    segs = [x for x in listed_at(env, "dr") if x.partition_id == listed_at(env, "dr")[0].partition_id]
    lost = segs[-1]
    (env.site_dir("dr") / lost.relpath).unlink()
    away = {site: take_down(env, site) for site in ("primary", "edge")}
    try:
        report = rebuild_site(env.catalog, "dr", accept_loss=True)
    finally:
        for site, aside in away.items():
            bring_up(env, site, aside)
    assert [x.segment_id for x in report.lost] == [lost.segment_id]
    assert _dr_status(env)["pending_segments"] == 1
    round_until_idle(env)
    assert triples(env.catalog, "dr") == model.snapshot()
