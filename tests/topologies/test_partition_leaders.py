"""Per-partition leaders (issue 15 item 2): each key range is led by its own site, every site holds all.

`events` splits at `m`: partition 0 (tenants a..l) and partition 1 (m..). Writers route each row to its
partition's leader without naming a site; rounds replicate each partition from its own leader; every site
reads the whole table and equals the rows written; safe time per site is the minimum over partitions.
Consolidation N:1 is the case where the table's `leader:` site leads nothing and holds everything.
"""

from __future__ import annotations

from typing import Any

import pytest

from segrep.config.definitions import load_definitions
from segrep.core.errors import ConfigError
from segrep.replication.orchestrator import run_round
from tests.support.badinput import unchanged
from tests.support.checks import leaders, safe_times, triples
from tests.support.cli import cli
from tests.support.env import ORDERS_YAML, Env, env_fixture, sqlite_url
from tests.support.models import Model
from tests.support.rounds import round_until_idle
from tests.support.tables import TABLE

GEO_YAML = ORDERS_YAML.replace(
    "    replicas: [dr, edge]\n", "    leaders: {1: dr}\n    replicas: [dr, edge]\n    policy: {retry_delay_s: 0}\n"
)
# edge leads nothing: primary leads partition 0, dr partition 1, and edge consolidates both
CONSOLIDATION_YAML = ORDERS_YAML.replace(
    "    leader: primary\n    replicas: [dr, edge]\n",
    "    leader: edge\n    leaders: {0: primary, 1: dr}\n    replicas: [primary, dr]\n",
)


@pytest.fixture
def geo(tmp_path: Any) -> Any:
    yield from env_fixture(tmp_path, sqlite_url(tmp_path), GEO_YAML)


def _writes(env: Env, model: Model) -> None:
    model.upsert(env, range(0, 60), "a")
    model.delete(env, range(0, 60, 7))
    model.upsert(env, range(30, 90), "b")


def test_each_partition_is_led_and_replicated_from_its_own_site(geo: Env) -> None:
    env, model = geo, Model()
    by_partition = leaders(env.catalog)
    assert sorted(site for site, _epoch in by_partition.values()) == ["dr", "primary"]
    _writes(env, model)
    reports = round_until_idle(env)
    copied_to = {site for rep in reports for site, t in rep.targets.items() if t.segments_copied}
    assert copied_to == {"primary", "dr", "edge"}  # primary and dr each receive the partition the other leads
    for site in ("primary", "dr", "edge"):
        assert triples(env.catalog, site) == model.snapshot(), site
    assert triples(env.catalog) == model.snapshot()  # reads from each partition's leader
    stored = safe_times(env.catalog)
    assert set(stored) == {"primary", "dr", "edge"}


def test_consolidation_one_site_leads_nothing_and_holds_everything(tmp_path: Any) -> None:
    env = next(env_fixture(tmp_path, sqlite_url(tmp_path), CONSOLIDATION_YAML))
    model = Model()
    assert "edge" not in {site for site, _ in leaders(env.catalog).values()}
    _writes(env, model)
    round_until_idle(env)
    assert triples(env.catalog, "edge") == model.snapshot()
    code, _out, err = cli(env, "status", "--json")
    assert code == 0, err
    env.catalog.dispose()


def test_a_leader_change_in_the_file_is_refused_as_before(geo: Env) -> None:
    env = geo
    Model().upsert(env, range(0, 5), "a")
    run_round(env.catalog, env.defs, TABLE)
    env.config.write_text(GEO_YAML.replace("    leaders: {1: dr}\n", "    leaders: {1: edge}\n"))
    with unchanged(env):
        code, _out, err = cli(env, "apply")
    assert code == 2
    assert "a leader change is a failover" in err


@pytest.mark.parametrize(
    ("leaders_", "message"),
    [("{2: dr}", "2 is not a partition index (0 to 1"), ("{1: nowhere}", "which is not one of the table's sites")],
)
def test_bad_partition_leaders_are_refused_by_name(tmp_path: Any, leaders_: str, message: str) -> None:
    path = tmp_path / "segrep.yaml"
    path.write_text(GEO_YAML.replace("    leaders: {1: dr}\n", f"    leaders: {leaders_}\n"))
    with pytest.raises(ConfigError) as err:
        load_definitions(path)
    assert message in str(err.value)
