"""Failback under ``on_return: merge`` (issue 32, DESIGN 11): incremental, and honest while the old leader is away.

The tester's scenario: `primary` leads `events`, takes writes it never replicates and goes down; `segrep
failover` promotes `dr`, which takes writes that reach `edge`. While `primary` is down it is DOWN (never ok),
no Spark work is planned for it, and `edge`'s safe time keeps moving: the rows only `primary` holds are outside
every safe-time claim and `segrep status` names them ("unmerged at primary"). When it is back, its lost rows
are merged at `dr`; then `primary` continues from the common segment (only what it lacks past it, plus the
merge output) and `edge` receives only the merge output: no major of the whole table is built for either.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.core import hlc
from segrep.replication.fast_forward import fast_forward_target
from segrep.replication.orchestrator import run_round
from segrep.replication.overview import SiteState, build_overview
from segrep.replication.plan import plan_round
from segrep.replication.reports import RoundReport
from tests.support.checks import (
    assert_replicas_equal_leader,
    assert_safe_time_honest,
    raw_winners,
    safe_times,
    triples,
)
from tests.support.cli import cli
from tests.support.env import Env
from tests.support.failback import lose_primary
from tests.support.models import Model
from tests.support.rounds import bring_up, inprocess_submit, no_spark
from tests.support.tables import TABLE


def _dr_bytes_since(env: Env, since_us: int) -> int:
    """Bytes of the segments `dr` committed after ``since_us`` (what a replica lacks of them, at most)."""
    with env.catalog.read() as s:
        rows = s.execute(
            select(m.Segment.byte_size)
            .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
            .join(m.Site, m.Site.site_id == m.Placement.site_id)
            .where(m.Site.name == "dr", m.Segment.committed_us > since_us)
        ).all()
    return sum(size for (size,) in rows)


def test_while_the_old_leader_is_down_it_is_down_and_healthy_replicas_go_on(merge_env: Env) -> None:
    """Found by a tester: with `primary` down, every round planned majors for it (OUT_OF_ORDER, then stuck),
    reported it `ok`, and froze `edge`'s safe time (its lag grew for the whole outage, 0 segments pending):
    the forks only `primary` held bounded every site. No Spark here: none may be launched (``no_spark``)."""
    env = merge_env
    model = Model()
    kept, _lost, aside = lose_primary(env, model)
    frozen = safe_times(env.catalog).get("primary")
    reports: list[RoundReport] = []
    for n in range(3):
        kept.upsert(env, range(100 + 10 * n, 105 + 10 * n), f"after{n}")  # at dr
        reports.append(run_round(env.catalog, env.defs, TABLE, submit=no_spark))
        written = max(version for version, _origin, _deleted in raw_winners(env.catalog, TABLE).values())
        edge_safe = reports[-1].safe_time_us["edge"]
        assert edge_safe >= written, (n, edge_safe, written)  # edge's safe time covers every write at dr
        assert_safe_time_honest(env.catalog, TABLE, "edge", edge_safe)
    for rep in reports:
        assert rep.plan is not None and rep.plan.majors == [] and rep.plan.merges == []  # no Spark work
        down = rep.targets["primary"]
        assert down.status == "down", down
        assert "site primary is down" in (down.error or "") and "4 segment(s) a failover gave up" in (down.error or "")
        assert down.bytes_copied == 0 and down.outcomes == {}  # nothing offered, acked or moved there
        assert rep.targets["edge"].status == "ok"
        assert "primary" not in rep.safe_time_us
    assert safe_times(env.catalog).get("primary") == frozen  # a site that is down: its safe time does not move
    assert triples(env.catalog, "edge") == kept.snapshot()

    code, out, err = cli(env, "status", TABLE)
    assert code == 0, err
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith(f"{TABLE} ")}
    assert "unmerged at primary: 4 segments" in rows["primary"], out
    assert "unmerged at primary: 4 segments" in rows["edge"], out
    code, out, err = cli(env, "status", TABLE, "--json")
    assert code == 0, err
    records = {r["target"]: r for r in json.loads(out)["replication"]}
    assert records["edge"]["unmerged"] == {"primary": 4} and records["primary"]["last_status"] == "down"
    view = build_overview(env.catalog, tables=[TABLE], history=False)
    states = {row.site: row.state for row in view.tables[0].rows}
    assert states["primary"] == SiteState.DOWN and states["edge"] == SiteState.LIVE

    bring_up(env, "primary", aside)  # back: its merge is planned now, no major; it waits for that merge
    plan = plan_round(env.catalog, env.defs, TABLE)
    assert plan.summary.majors == [] and len(plan.summary.merges) == 2 and plan.manifest is not None
    back = fast_forward_target(env.catalog, env.defs, TABLE, "primary", plan.end_us)
    assert back.status == "waiting" and back.outcomes == {"UNMERGED": 2} and back.bytes_copied == 0, back
    assert "waits for the leader to merge 2 segment(s)" in (back.error or "")


@pytest.mark.spark
def test_failback_under_merge_copies_what_is_missing_past_the_common_segment(merge_sqlite_env: Env, spark: Any) -> None:
    """Found by a tester: the failback built majors of the whole table and copied them to `primary` and to
    every healthy replica. Now `primary` gets only `dr`'s segments written since the failover (the common
    segment is where its chain continues) plus the merge outputs, and `edge` only the merge outputs; the rows
    end as last-writer-wins says, everywhere."""
    env = merge_sqlite_env
    model = Model()
    _kept, _lost, aside = lose_primary(env, model)  # `model` keeps the lost rows: they come back
    with env.catalog.read() as s:
        failed_over_us = s.scalars(select(m.Failover.done_us)).one()
    model.upsert(env, range(100, 120), "after")
    model.upsert(env, range(50, 55), "newer")  # newer than primary's lost rows for these keys
    calls: list[str] = []
    submit = inprocess_submit(spark, calls)
    while_down = run_round(env.catalog, env.defs, TABLE, submit=submit)
    assert while_down.merges.items == 0 and while_down.plan is not None and while_down.plan.majors == []
    bring_up(env, "primary", aside)
    merged_at = hlc.now_us()
    rounds = [run_round(env.catalog, env.defs, TABLE, submit=submit) for _ in range(3)]
    assert sum(r.merges.committed for r in rounds) and all(r.plan is not None and r.plan.majors == [] for r in rounds)
    assert not calls  # merges only, in process (small merges)
    outputs = _dr_bytes_since(env, merged_at)  # the merge outputs: nothing else was written at dr since
    meanwhile = _dr_bytes_since(env, failed_over_us)  # written at dr since the failover, merge outputs included
    assert 0 < outputs < meanwhile
    to_primary = sum(r.targets["primary"].bytes_copied for r in rounds)
    to_edge = sum(r.targets["edge"].bytes_copied for r in rounds)
    assert to_primary == meanwhile, (to_primary, meanwhile)  # past the common segment, nothing else
    assert to_edge == outputs, (to_edge, outputs)
    assert triples(env.catalog) == model.snapshot()  # lost rows kept, newer writes won, deletes applied
    assert_replicas_equal_leader(env.catalog, ("primary", "edge"))
    code, out, _ = cli(env, "status", TABLE)
    assert code == 0 and "unmerged at" not in out, out
