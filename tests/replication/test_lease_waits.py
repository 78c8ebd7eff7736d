"""A round held up by another round's leases says WAITING, naming the round and when its leases lapse
(issue 32, DESIGN section 13), never "ok (nothing to offer)": in the round report (CLI and Python) and in
`segrep status`. Safe time does not pass what it waits for."""

from __future__ import annotations

import json

from sqlalchemy import select

from segrep.catalog import leases as ls
from segrep.catalog import models as m
from segrep.core import hlc
from segrep.replication.orchestrator import run_round
from segrep.replication.plan import plan_round
from segrep.replication.reports import TargetStatus
from segrep.replication.round import lease_ttl_us, round_key
from tests.support.checks import assert_safe_time_honest, safe_times, triples
from tests.support.cli import cli
from tests.support.env import Env
from tests.support.models import Model
from tests.support.rounds import no_spark, round_until_idle, set_leader
from tests.support.tables import TABLE


def _dead_round(env: Env) -> tuple[int, str]:
    """A round that planned, leased, and died: its id and its key (its leases lapse within a TTL)."""
    plan = plan_round(env.catalog, env.defs, TABLE)
    return plan.round_id, round_key(TABLE, plan.end_us)


def _lease(env: Env, key: str, placements: list[int], segments: list[str]) -> int:
    expires = hlc.now_us() + lease_ttl_us()
    with env.catalog.write() as s:
        for pl in placements:
            for seg in segments:
                assert ls.acquire(s, pl, seg, key, expires)
    return expires


def _placements(env: Env, site: str) -> dict[int, int]:
    """Partition id -> the site's placement of it (events)."""
    with env.catalog.read() as s:
        rows = s.execute(
            select(m.Placement.partition_id, m.Placement.placement_id)
            .join(m.Site, m.Site.site_id == m.Placement.site_id)
            .where(m.Site.name == site, m.Placement.removed_us.is_(None))
        ).all()
    return dict(rows)


def _leader_segments(env: Env) -> list[str]:
    with env.catalog.read() as s:
        return list(
            s.scalars(
                select(m.Segment.segment_id)
                .join(m.Partition, m.Partition.leader_placement_id == m.Segment.placement_id)
                .order_by(m.Segment.entry_id)
            )
        )


def test_offers_leased_by_a_dead_round_make_the_target_wait(outage_env: Env) -> None:
    env = outage_env
    model = Model()
    model.upsert(env, range(10), "a")
    round_until_idle(env)
    model.upsert(env, range(10), "b")
    round_id, key = _dead_round(env)
    expires = _lease(env, key, list(_placements(env, "dr").values()), _leader_segments(env))

    code, out, err = cli(env, "round", TABLE)
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("  dr: "))
    assert line.startswith("  dr: waiting (") and "nothing to offer" not in line, out
    assert f"waiting: leases held by round {round_id} until {hlc.iso(expires)}" in line, out
    code, out, err = cli(env, "status", TABLE, "--json")
    dr = next(r for r in json.loads(out)["replication"] if r["target"] == "dr")
    assert dr["last_status"] == "waiting" and dr["pending_segments"] == 2
    assert dr["note"].startswith(f"waiting: leases held by round {round_id} until "), dr["note"]
    code, out, err = cli(env, "status", TABLE)
    assert f"waiting: leases held by round {round_id} until" in out, out
    assert_safe_time_honest(env.catalog, TABLE, "dr", safe_times(env.catalog)["dr"])

    with env.catalog.write() as s:  # the dead round's leases lapse
        s.execute(m.Lease.__table__.delete())
    round_until_idle(env)
    assert triples(env.catalog, "dr") == model.snapshot()


def test_a_merge_leased_by_a_dead_round_makes_the_writer_wait_not_ok(outage_env: Env) -> None:
    """The tester's third case: dr's own writes (made while it led) wait for their merge at the leader, whose
    leases a dead round holds: the round said "dr: ok (nothing to offer)" while safe time held."""
    env = outage_env
    model = Model()
    model.upsert(env, range(8), "a")
    round_until_idle(env)
    set_leader(env.catalog, "dr")
    model.upsert(env, range(4, 12), "dr-")  # written while dr led: the primary lacks them
    set_leader(env.catalog, "primary")
    round_id, key = _dead_round(env)  # its plan leased dr's writes at the leader for its merge, then it died
    with env.catalog.read() as s:
        assert set(s.scalars(select(m.Lease.holder))) == {key}

    report = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    dr = report.targets["dr"]
    assert dr.status == TargetStatus.WAITING, dr
    assert dr.error is not None and f"waiting: leases held by round {round_id} until" in dr.error, dr
    assert not dr.backs_off
    assert_safe_time_honest(env.catalog, TABLE, "edge", safe_times(env.catalog)["edge"])
