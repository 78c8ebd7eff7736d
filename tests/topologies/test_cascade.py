"""Cascaded replicas (issue 15 item 1): `edge` is fed by `dr`, not by the leader.

Checked against the rows written (the model) and against the round reports' per-link bytes: every segment
crosses primary -> dr once and dr -> edge once, the leader sends nothing to edge; edge's safe time never
passes dr's; the leader's GC waits for edge; with `feeder_fallback` the leader feeds edge while dr is down.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from segrep.catalog.apply import apply_definitions
from segrep.config.definitions import load_definitions
from segrep.core.errors import ConfigError
from segrep.maintenance.compaction import compact
from segrep.maintenance.gc import collect
from segrep.replication.orchestrator import run_round
from tests.support.checks import assert_replicas_equal_leader, safe_times, segment_rows, triples
from tests.support.env import ORDERS_YAML, Env, env_fixture, sqlite_url
from tests.support.models import Model
from tests.support.rounds import bring_up, no_spark, take_down
from tests.support.spark import spark_submit_in
from tests.support.tables import TABLE

CASCADE_YAML = ORDERS_YAML.replace(
    "    replicas: [dr, edge]\n", "    replicas: {dr: {}, edge: {from: dr}}\n    policy: {retry_delay_s: 0}\n"
)


@pytest.fixture
def cascade(tmp_path: Any) -> Any:
    yield from env_fixture(tmp_path, sqlite_url(tmp_path), CASCADE_YAML)


def _fallback_yaml(after: str) -> str:
    return CASCADE_YAML.replace(
        "    policy: {retry_delay_s: 0}\n", f"    policy: {{retry_delay_s: 0, feeder_fallback: {after}}}\n"
    )


def test_each_segment_crosses_each_link_once(cascade: Env) -> None:
    env, model = cascade, Model()
    model.upsert(env, range(0, 50), "a")
    first = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    # in the first round dr receives the segments; edge gets them from dr in the same or the next round
    second = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    sent = {site: {} for site in ("dr", "edge")}  # type: dict[str, dict[str, int]]
    for rep in (first, second):
        for site, target in rep.targets.items():
            for source, n in target.bytes_from.items():
                sent[site][source] = sent[site].get(source, 0) + n
    assert set(sent["dr"]) == {"primary"}
    assert set(sent["edge"]) == {"dr"}, sent  # the leader never sent edge anything
    assert sent["dr"]["primary"] == sent["edge"]["dr"]  # the same segments crossed each link once
    assert triples(env.catalog, "edge") == model.snapshot()
    assert_replicas_equal_leader(env.catalog)
    stored = safe_times(env.catalog)
    assert stored["edge"] <= stored["dr"]


def test_edge_waits_for_its_feeder_and_catches_up_from_it(cascade: Env) -> None:
    env, model = cascade, Model()
    model.upsert(env, range(0, 20), "a")
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    aside = take_down(env, "dr")
    model.upsert(env, range(20, 40), "b")
    for _ in range(2):
        rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
        assert rep.targets["edge"].segments_copied == 0  # no fallback configured: edge waits for dr
    before = safe_times(env.catalog)
    bring_up(env, "dr", aside)
    for _ in range(3):
        rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert triples(env.catalog, "edge") == model.snapshot()
    assert safe_times(env.catalog)["edge"] > before["edge"]


def test_the_leader_feeds_edge_while_dr_is_down_past_the_fallback_limit(tmp_path: Any) -> None:
    env = next(env_fixture(tmp_path, sqlite_url(tmp_path), _fallback_yaml("1s")))
    model = Model()
    model.upsert(env, range(0, 20), "a")
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    aside = take_down(env, "dr")
    model.upsert(env, range(20, 40), "b")
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)  # dr fails: its back-off starts
    time.sleep(1.2)
    sources: set[str] = set()
    for _ in range(3):
        rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
        sources |= set(rep.targets["edge"].bytes_from)
    assert "primary" in sources  # fed by the leader meanwhile
    assert triples(env.catalog, "edge") == model.snapshot()
    bring_up(env, "dr", aside)
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)  # dr answers again: the fallback ends after it
    model.upsert(env, range(40, 60), "c")
    late: set[str] = set()
    for _ in range(3):
        rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
        late |= set(rep.targets["edge"].bytes_from)
    assert late == {"dr"}  # the feeder is back: it feeds edge again, the leader does not
    assert triples(env.catalog, "edge") == model.snapshot() == triples(env.catalog, "dr")
    env.catalog.dispose()


@pytest.mark.parametrize(
    ("replicas", "message"),
    [
        ("{dr: {from: edge}, edge: {from: dr}}", "cycle: dr -> edge -> dr"),
        ("{dr: {from: dr}}", "cannot be fed from itself"),
        ("{dr: {from: nowhere}}", "neither the leader nor a replica"),
        ("{dr: {via: primary}}", "unknown key(s) via"),
    ],
)
def test_bad_feeders_are_refused_by_name(tmp_path: Any, replicas: str, message: str) -> None:
    path = tmp_path / "segrep.yaml"
    path.write_text(ORDERS_YAML.replace("    replicas: [dr, edge]\n", f"    replicas: {replicas}\n"))
    with pytest.raises(ConfigError) as err:
        load_definitions(path)
    assert message in str(err.value)


def test_apply_moves_a_replica_into_a_cascade_and_back(tmp_path: Any) -> None:
    env = next(env_fixture(tmp_path, sqlite_url(tmp_path)))
    model = Model()
    model.upsert(env, range(0, 10), "a")
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    env.config.write_text(CASCADE_YAML)
    changes = [str(c) for c in apply_definitions(env.catalog, env.defs)]
    assert any("edge of table events fed from dr" in c for c in changes), changes
    model.upsert(env, range(10, 20), "b")
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert "primary" not in rep.targets["edge"].bytes_from
    assert triples(env.catalog, "edge") == model.snapshot()
    env.catalog.dispose()


@pytest.mark.spark
def test_the_leaders_gc_waits_for_the_whole_tree(cascade: Env, spark: Any) -> None:
    """After a major at the leader, the minors it folds may go only once every replica holds the major: edge
    included, although edge is fed by dr and never by the leader (the leader keeps acks for the whole tree)."""
    env, model = cascade, Model()
    for n in range(3):
        model.upsert(env, range(n * 10, n * 10 + 10), f"w{n}")
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)  # dr and edge hold the minors
    aside = take_down(env, "edge")
    compact(env.catalog, env.defs, TABLE, force=True, submit=spark_submit_in(spark))
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)  # dr takes the majors; edge is down
    minors = {seg for _p, seg, _h, _r in segment_rows(env.catalog, "primary")}
    held = collect(env.catalog, env.defs, TABLE)
    assert not {d.segment_id for d in held.deletions if d.site == "primary"}, held.deletions  # edge lacks the majors
    assert held.held, held  # and GC says why it keeps them
    bring_up(env, "edge", aside)
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)  # edge takes the majors from dr
    gone = {d.segment_id for d in collect(env.catalog, env.defs, TABLE).deletions if d.site == "primary"}
    assert gone and gone < minors  # now the folded minors go at the leader
    assert triples(env.catalog, "edge") == model.snapshot() == triples(env.catalog)
