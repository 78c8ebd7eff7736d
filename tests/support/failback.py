"""A leader lost with rows only it holds: the start of every failback scenario (tests/failover/test_failback.py
and test_failback_merge.py)."""

from __future__ import annotations

from typing import Any

from segrep.data.writer import write_batch
from segrep.failover.promote import failover
from segrep.replication.orchestrator import run_round
from tests.support.checks import safe_times
from tests.support.env import Env
from tests.support.models import Model
from tests.support.rounds import no_spark, take_down
from tests.support.tables import TABLE, TENANTS, orders


def lose_primary(env: Env, model: Model) -> tuple[Model, set[tuple[str, int, str | None, bool]], Any]:
    """Replicated writes, then writes only `primary` holds, then `primary` down and `dr` promoted. Returns
    the model of what `dr` holds, the rows `primary` alone holds (tenant, seq, payload, deleted), the site."""
    model.upsert(env, range(0, 40), "a")
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    kept = Model()
    kept.rows = dict(model.rows)
    model.upsert(env, range(30, 60), "lost")
    model.delete(env, range(0, 3))
    lost = {(TENANTS[k % len(TENANTS)], k, f"lost{k}", False) for k in range(30, 60)}
    lost |= {(TENANTS[k % len(TENANTS)], k, None, True) for k in range(0, 3)}
    aside = take_down(env, "primary")
    report = failover(env.catalog, env.defs, [TABLE])
    assert report.moves[0].assessment.rows_lost == len(lost)
    return kept, lost, aside


def rows_past_a_cut(env: Env, model: Model) -> tuple[set[tuple[str, int, str | None, bool]], int]:
    """`events` (30 rows) and `orders` (3) replicated, then events keys 20-39 rewritten at the leader, newer than
    `orders`' safe time at dr: what the model held before them, and that safe time (a `--at safe-time` cut)."""
    model.upsert(env, range(0, 30), "a")
    write_batch(env.catalog, "orders", orders([1, 2, 3], comment="o1"))
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    run_round(env.catalog, env.defs, "orders", submit=no_spark)
    kept = model.snapshot()
    cut_us = safe_times(env.catalog, "orders")["dr"]
    model.upsert(env, range(20, 40), "after_cut")
    return kept, cut_us
