"""``segrep.replication.safetime``, function by function: what one partition vouches for at a replica
(``partition_vouches``) and at its leader's site (``leader_vouches``), how far a placement's list is settled
(``settled_prefix``), and the commit step that writes checkpoints and safe times
(``update_checkpoints_and_safe_time``).

The contract, from the module's docstring and DESIGN section 2: a partition vouches for the instant before the
oldest row version the replica still lacks (or before a fork some replica holds that the leader has not
merged), else for the interval end minus one; the table's safe time at a site is the minimum over partitions;
it never moves back (the one exception, ``catalog rebuild --accept-loss``, is not this module's: see
test_catch_up_after_loss.py); a site held (DOWN/UNIDENTIFIED), joining or stalled keeps the one it had.

The vouching rules run over partition snapshots built by hand (tests/support/snapshots.py); the commit step
over a catalog on SQLite and PostgreSQL, whose locking lets concurrent commits of the same table pass.
"""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import select

from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.snapshot import snapshot
from segrep.core import hlc
from segrep.core.states import PlacementState
from segrep.data.writer import write_batch
from segrep.replication.fast_forward import fast_forward_target
from segrep.replication.plan import plan_round
from segrep.replication.round import ensure_round
from segrep.replication.safetime import (
    advance_safe_times,
    leader_vouches,
    partition_vouches,
    settled_prefix,
    update_checkpoints_and_safe_time,
)
from tests.support.checks import partitions, placement_id, safe_times
from tests.support.env import Env
from tests.support.rounds import set_leader
from tests.support.snapshots import Scenario
from tests.support.tables import REPLICAS, TABLE, batch

END = 10_000  # every segment of a scenario is committed before it unless it says otherwise


def chain_to_dr_and_edge() -> Scenario:
    """primary leads M (major) <- s1 <- s2 <- s3 (row versions 100-150, 200-250, 300-350, 400-450); dr and
    edge hold nothing and acked nothing yet."""
    sc = Scenario.placed("primary", "dr", "edge")
    sc.seg("M", None, major=True)
    sc.seg("s1", "M")
    sc.seg("s2", "s1")
    sc.seg("s3", "s2")
    sc.holds("primary", "M", "s1", "s2", "s3")
    return sc


def vouches(
    sc: Scenario, site: str, *, gave_up: tuple[str, ...] = (), down: frozenset[int] = frozenset()
) -> tuple[str | None, int, int]:
    """``partition_vouches`` for the replica at ``site``, the round ending at END."""
    part = sc.snapshot(gave_up=gave_up)
    replica = next(r for r in part.replicas if r.placement_id == sc.placements[site].placement_id)
    return partition_vouches(part, replica, END, down)


# -- partition_vouches ------------------------------------------------------------------------------------------


def test_a_replica_that_acked_the_whole_chain_is_checkpointed_at_the_root_and_vouched_to_the_end() -> None:
    sc = chain_to_dr_and_edge()
    sc.ack("primary", ["M", "s1", "s2", "s3"], "dr")
    assert vouches(sc, "dr") == ("s3", 450, END - 1)


def test_the_checkpoint_is_the_acked_prefix_and_safe_time_stops_before_the_oldest_row_missing() -> None:
    """dr acked M, s1 and s3 but not s2 (an ack out of order after a restart): the checkpoint stays at s1, the
    contiguous prefix, and the partition vouches only for the instant before s2's oldest row."""
    sc = chain_to_dr_and_edge()
    sc.ack("primary", ["M", "s1", "s3"], "dr")
    assert vouches(sc, "dr") == ("s1", 250, 300 - 1)


def test_a_replica_that_acked_nothing_has_no_checkpoint_and_is_vouched_before_the_first_row() -> None:
    assert vouches(chain_to_dr_and_edge(), "dr") == (None, 0, 100 - 1)


def test_a_segment_committed_after_the_interval_end_still_bounds_safe_time() -> None:
    """A major or merge output committed after the interval carries rows written before it."""
    sc = chain_to_dr_and_edge()
    sc.seg("s3", "s2", versions=(150, 460), committed_us=END + 5)
    sc.ack("primary", ["M", "s1", "s2"], "dr")
    assert vouches(sc, "dr") == ("s2", 350, 150 - 1)


def test_a_fork_one_replica_wrote_while_it_led_bounds_every_replica_until_the_leader_merges_it() -> None:
    sc = chain_to_dr_and_edge()
    sc.ack("primary", ["M", "s1", "s2", "s3"], "dr", "edge")
    sc.seg("x", "s1", versions=(220, 230))  # edge's own write, never at primary
    sc.holds("edge", "M", "s1", "x")
    assert vouches(sc, "dr") == ("s3", 450, 220 - 1)
    assert vouches(sc, "edge") == ("s3", 450, 220 - 1)
    sc.ack("edge", ["x"], "primary")  # merged: primary took it in as edge's push
    assert vouches(sc, "dr") == ("s3", 450, END - 1)


def test_a_fork_a_failover_gave_up_bounds_nobody_while_its_only_holder_is_down() -> None:
    """``on_return: merge``: only the old leader holds x; counted while it is down, it would freeze every
    healthy replica's safe time with it. Once it is back, x counts again until merged."""
    sc = chain_to_dr_and_edge()
    sc.ack("primary", ["M", "s1", "s2", "s3"], "dr", "edge")
    sc.seg("x", "s1", versions=(220, 230))
    sc.holds("edge", "M", "s1", "x")
    edge_down = frozenset({sc.placements["edge"].site_id})
    assert vouches(sc, "dr", gave_up=("x",), down=edge_down) == ("s3", 450, END - 1)
    assert vouches(sc, "dr", gave_up=("x",)) == ("s3", 450, 220 - 1)
    assert vouches(sc, "dr", down=edge_down) == ("s3", 450, 220 - 1)  # a fork not given up counts down or not


# -- leader_vouches ---------------------------------------------------------------------------------------------


def test_the_leaders_site_is_vouched_for_up_to_the_oldest_fork_it_has_not_merged() -> None:
    sc = chain_to_dr_and_edge()
    assert leader_vouches(sc.snapshot()) == hlc.FOREVER_US  # no fork anywhere: no bound
    sc.seg("x", "s1", versions=(220, 230))
    sc.seg("y", "s2", versions=(320, 330))
    sc.holds("edge", "M", "s1", "x")
    sc.holds("dr", "M", "s1", "s2", "y")
    assert leader_vouches(sc.snapshot()) == 220 - 1  # the oldest over the followers
    sc.ack("edge", ["x"], "primary")
    assert leader_vouches(sc.snapshot()) == 320 - 1
    edge, dr = frozenset({sc.placements["edge"].site_id}), frozenset({sc.placements["dr"].site_id})
    assert leader_vouches(sc.snapshot(gave_up=["y"]), dr) == hlc.FOREVER_US
    assert leader_vouches(sc.snapshot(gave_up=["y"]), edge) == 320 - 1  # its holder is not the one down


# -- settled_prefix ---------------------------------------------------------------------------------------------


def entry(sc: Scenario, site: str, segment_id: str) -> int:
    part = sc.snapshot()
    return part.segment(sc.placements[site].placement_id, segment_id).entry_id


def settled(sc: Scenario, site: str) -> int:
    part = sc.snapshot()
    placement = next(pl for pl in (part.leader, *part.replicas) if pl.placement_id == sc.placements[site].placement_id)
    return settled_prefix(part, placement)


def test_a_leaders_list_is_settled_up_to_the_first_segment_some_replica_lacks() -> None:
    sc = chain_to_dr_and_edge()
    assert settled(sc, "primary") == 0
    sc.ack("primary", ["M", "s1", "s3"], "dr", "edge")
    sc.ack("primary", ["s2"], "dr")
    assert settled(sc, "primary") == entry(sc, "primary", "s1")  # s2 lacks edge; s3 waits behind it
    sc.ack("primary", ["s2"], "edge")
    assert settled(sc, "primary") == entry(sc, "primary", "s3")


def test_a_leaders_fork_is_never_settled() -> None:
    sc = chain_to_dr_and_edge()
    sc.seg("f", "M")  # not on the walk from s3: a fork at the leader (a push it took in), to be merged
    sc.lists["primary"].insert(2, "f")
    sc.ack("primary", ["M", "s1", "s2", "s3", "f"], "dr", "edge")
    assert settled(sc, "primary") == entry(sc, "primary", "s1")  # nothing past the fork


def test_segments_behind_a_major_settle_once_every_replica_holds_the_major() -> None:
    sc = Scenario.placed("primary", "dr", "edge")
    sc.seg("a", None, major=True)
    sc.seg("b", "a")
    sc.seg("N", "b", included=["a", "b"], major=True)
    sc.holds("primary", "a", "b", "N")
    sc.ack("primary", ["a", "b"], "dr", "edge")
    sc.ack("primary", ["N"], "dr")
    assert settled(sc, "primary") == 0  # a and b are offered as N now, which edge lacks
    sc.ack("primary", ["N"], "edge")
    assert settled(sc, "primary") == entry(sc, "primary", "N")


def test_a_followers_list_is_settled_where_the_leader_holds_it_never_at_its_own_fork() -> None:
    sc = chain_to_dr_and_edge()
    sc.seg("x", "s1")
    sc.holds("dr", "M", "s1", "x", "s2")
    assert settled(sc, "dr") == entry(sc, "dr", "s1")
    sc.ack("dr", ["x"], "primary")  # pushed and taken in
    assert settled(sc, "dr") == entry(sc, "dr", "s2")


def test_a_watermark_set_under_an_older_epoch_counts_as_none() -> None:
    """Entries up to the watermark are not looked at again (a snapshot reads only those past it, with their
    acks), unless the watermark was set under an older leader epoch."""
    sc = chain_to_dr_and_edge()
    sc.ack("primary", ["s2"], "dr", "edge")  # M and s1 settled earlier: their acks are not read
    leader = sc.placements["primary"]
    leader.settled_entry_id, leader.settled_epoch = entry(sc, "primary", "s1"), sc.partition.epoch
    assert settled(sc, "primary") == entry(sc, "primary", "s2")
    sc.partition.epoch += 1  # a new leader since: M is not acked by every replica as far as this epoch knows
    assert settled(sc, "primary") == 0


# -- update_checkpoints_and_safe_time, on a catalog ---------------------------------------------------------------


def replicate(env: Env, *sites: str) -> int:
    """Plan a round (until now) and fast-forward ``sites`` only, without the commit; return its end."""
    plan = plan_round(env.catalog, env.defs, TABLE)
    for site in sites:
        report = fast_forward_target(env.catalog, env.defs, TABLE, site, plan.end_us)
        assert report.status == "ok", report
    return plan.end_us


def checkpoints(env: Env) -> dict[tuple[int, str], tuple[str | None, int]]:
    with env.catalog.read() as s:
        rows = s.execute(
            select(m.Checkpoint.partition_id, m.Site.name, m.Checkpoint.segment_id, m.Checkpoint.max_version)
            .join(m.Placement, m.Placement.placement_id == m.Checkpoint.target_placement_id)
            .join(m.Site, m.Site.site_id == m.Placement.site_id)
        ).all()
    return {(pid, site): (seg, version) for pid, site, seg, version in rows}


def leader_roots(env: Env) -> dict[int, tuple[str, int]]:
    """partition id -> the leader's root segment and its newest row version, for each partition of TABLE."""
    out = {}
    ids = partitions(env.catalog)
    with env.catalog.read() as s:
        for part in s.scalars(select(m.Partition).where(m.Partition.partition_id.in_(ids))):
            leader = s.get(m.Placement, part.leader_placement_id)
            assert leader is not None and leader.root_segment_id is not None
            root = s.scalars(
                select(m.Segment).where(
                    m.Segment.placement_id == leader.placement_id, m.Segment.segment_id == leader.root_segment_id
                )
            ).one()
            out[part.partition_id] = (root.segment_id, root.max_version)
    return out


def site_id(env: Env, site: str) -> int:
    with env.catalog.read() as s:
        return s.scalars(select(m.Site.site_id).where(m.Site.name == site)).one()


def set_placement(env: Env, site: str, partition_id: int, **values: Any) -> None:
    with env.catalog.write() as s:
        pl = s.get(m.Placement, placement_id(env.catalog, site, partition_id))
        assert pl is not None
        for name, value in values.items():
            setattr(pl, name, value)


PARTITION_1_KEYS = [0, 1, 4, 5, 8, 9]  # tenants a and b: partition [-inf, m)


def test_replicas_holding_everything_get_the_interval_end_checkpoints_at_the_leaders_roots_and_settle(
    env: Env,
) -> None:
    write_batch(env.catalog, TABLE, batch(range(20), "a"))
    write_batch(env.catalog, TABLE, batch(range(10, 30), "b"))
    end = replicate(env, *REPLICAS)
    assert update_checkpoints_and_safe_time(env.catalog, TABLE, end) == {"dr": end - 1, "edge": end - 1}
    assert safe_times(env.catalog) == {"dr": end - 1, "edge": end - 1}
    roots = leader_roots(env)
    assert checkpoints(env) == {(pid, site): roots[pid] for pid in partitions(env.catalog) for site in REPLICAS}
    with env.catalog.read() as s:  # every list settled: the next commit reads no partition
        assert snapshot(s, TABLE, active_only=True).partitions == []


def test_safe_time_never_moves_back_and_moves_forward_with_nothing_pending(env: Env) -> None:
    write_batch(env.catalog, TABLE, batch(range(20), "a"))
    end = replicate(env, *REPLICAS)
    update_checkpoints_and_safe_time(env.catalog, TABLE, end)
    earlier = end - 1_000_000
    with env.catalog.write() as s:
        ensure_round(s, q.table_info(s, TABLE).table_id, earlier, None)
    assert update_checkpoints_and_safe_time(env.catalog, TABLE, earlier) == {"dr": end - 1, "edge": end - 1}
    assert safe_times(env.catalog) == {"dr": end - 1, "edge": end - 1}
    later = replicate(env)  # nothing written since: both vouched for up to the new end
    assert update_checkpoints_and_safe_time(env.catalog, TABLE, later) == {"dr": later - 1, "edge": later - 1}


def test_a_commit_names_the_sites_whose_safe_time_it_moved(env: Env) -> None:
    """What the round's Asset events announce: a first safe time and a later one count, the same one does not."""
    write_batch(env.catalog, TABLE, batch(range(20), "a"))
    end = replicate(env, *REPLICAS)
    assert advance_safe_times(env.catalog, TABLE, end).advanced == ["dr", "edge"]  # first safe times
    again = advance_safe_times(env.catalog, TABLE, end)
    assert again.advanced == [] and again.times == {"dr": end - 1, "edge": end - 1}
    with env.catalog.write() as s:
        ensure_round(s, q.table_info(s, TABLE).table_id, end - 1_000_000, None)
    assert advance_safe_times(env.catalog, TABLE, end - 1_000_000).advanced == []  # never moved back
    later = replicate(env)
    held = advance_safe_times(env.catalog, TABLE, later, hold=frozenset({site_id(env, "edge")}))
    assert held.advanced == ["dr"] and held.times == {"dr": later - 1}


def test_one_partition_behind_holds_the_tables_safe_time_and_a_held_site_keeps_its_own(env: Env) -> None:
    write_batch(env.catalog, TABLE, batch(range(20), "a"))
    first = replicate(env, *REPLICAS)
    update_checkpoints_and_safe_time(env.catalog, TABLE, first)
    before = checkpoints(env)
    new = write_batch(env.catalog, TABLE, batch(PARTITION_1_KEYS, "b")).segments
    assert {seg.partition_id for seg in new} == {partitions(env.catalog)[0]}
    oldest = new[0].version  # the segment's oldest row version
    second = replicate(env, "dr")  # edge lacks partition 1's new segment; partition 2 has nothing new

    held = update_checkpoints_and_safe_time(env.catalog, TABLE, second, hold=frozenset({site_id(env, "edge")}))
    assert held == {"dr": second - 1}
    assert safe_times(env.catalog) == {"dr": second - 1, "edge": first - 1}  # held: not moved

    assert first - 1 < oldest - 1 < second - 1
    assert update_checkpoints_and_safe_time(env.catalog, TABLE, second) == {"dr": second - 1, "edge": oldest - 1}
    after = checkpoints(env)
    p1 = partitions(env.catalog)[0]
    assert after[(p1, "dr")] == leader_roots(env)[p1] != before[(p1, "dr")]
    assert after[(p1, "edge")] == before[(p1, "edge")]  # acked nothing new: the settled checkpoint stays


def test_a_site_leading_one_partition_is_bounded_by_the_writes_its_followers_hold_that_it_lacks(env: Env) -> None:
    """dr leads partition 1 after a leader change and follows partition 2: the segment primary wrote while it
    led partition 1, not yet pushed and merged at dr, bounds dr's safe time (primary's rows are not readable
    at dr), though dr holds everything of the partition it follows."""
    write_batch(env.catalog, TABLE, batch(range(20), "a"))
    first = replicate(env, *REPLICAS)
    update_checkpoints_and_safe_time(env.catalog, TABLE, first)
    p1 = partitions(env.catalog)[0]
    (fork,) = write_batch(env.catalog, TABLE, batch(PARTITION_1_KEYS, "b")).segments
    set_leader(env.catalog, "dr", partition_ids=[p1])
    end = hlc.now_us()
    with env.catalog.write() as s:
        ensure_round(s, q.table_info(s, TABLE).table_id, end, None)
    assert first - 1 < fork.version - 1 < end - 1
    assert update_checkpoints_and_safe_time(env.catalog, TABLE, end)["dr"] == fork.version - 1


def test_a_joining_replica_joins_once_it_holds_the_leaders_root_and_is_not_readable_before(env: Env) -> None:
    write_batch(env.catalog, TABLE, batch(range(20), "a"))
    first = replicate(env, *REPLICAS)
    update_checkpoints_and_safe_time(env.catalog, TABLE, first)
    write_batch(env.catalog, TABLE, batch(PARTITION_1_KEYS, "b"))
    second = replicate(env, "dr")
    p1 = partitions(env.catalog)[0]
    set_placement(env, "dr", p1, state=str(PlacementState.JOINING))  # holds the leader's root: joins now
    set_placement(env, "edge", p1, state=str(PlacementState.JOINING))  # lacks it: still joining

    assert update_checkpoints_and_safe_time(env.catalog, TABLE, second) == {"dr": second - 1}
    with env.catalog.read() as s:
        states = {site: s.get(m.Placement, placement_id(env.catalog, site, p1)).state for site in REPLICAS}
    assert states == {"dr": PlacementState.LIVE, "edge": PlacementState.JOINING}
    assert safe_times(env.catalog)["edge"] == first - 1


def test_a_site_that_needs_a_bootstrap_keeps_its_safe_time(env: Env) -> None:
    write_batch(env.catalog, TABLE, batch(range(20), "a"))
    first = replicate(env, *REPLICAS)
    update_checkpoints_and_safe_time(env.catalog, TABLE, first)
    set_placement(env, "edge", partitions(env.catalog)[0], needs_bootstrap=True)
    write_batch(env.catalog, TABLE, batch(range(20, 40), "b"))
    second = replicate(env, "dr")
    assert update_checkpoints_and_safe_time(env.catalog, TABLE, second) == {"dr": second - 1}
    assert safe_times(env.catalog)["edge"] == first - 1


def test_concurrent_commits_of_one_table_all_pass_and_leave_the_latest_safe_time(env: Env) -> None:
    """Retried commit tasks and the rounds of a backfill commit at once: the first commit of a table inserts
    its checkpoint and safe-time rows, which every one of them tries (an insert that ignores conflicts, then
    the rows read under a lock). None may fail, nor lower what another wrote."""
    write_batch(env.catalog, TABLE, batch(range(20), "a"))
    end = replicate(env, *REPLICAS)
    ends = [end - 1000 * n for n in range(6)]
    with env.catalog.write() as s:
        table_id = q.table_info(s, TABLE).table_id
        for e in ends[1:]:
            ensure_round(s, table_id, e, None)
    start = threading.Barrier(len(ends))
    results: dict[int, dict[str, int]] = {}
    errors: list[BaseException] = []

    def commit(e: int) -> None:
        start.wait()
        try:
            results[e] = update_checkpoints_and_safe_time(env.catalog, TABLE, e)
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=commit, args=(e,)) for e in ends]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert all(results[e][site] >= e - 1 for e in ends for site in REPLICAS), results
    assert safe_times(env.catalog) == {"dr": end - 1, "edge": end - 1}
    roots = leader_roots(env)
    assert checkpoints(env) == {(pid, site): roots[pid] for pid in partitions(env.catalog) for site in REPLICAS}
