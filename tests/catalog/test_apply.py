"""`segrep apply`: dry run writes nothing, a second run changes nothing, data-losing changes are refused."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from segrep.catalog import models as m
from segrep.catalog.apply import apply_definitions
from segrep.config.definitions import load_definitions
from segrep.core.errors import RefusedError
from segrep.data.writer import write_batch
from tests.support.env import ORDERS_YAML, Env, make_env
from tests.support.tables import orders


def counts(env: Env) -> dict[str, int]:
    with env.catalog.read() as s:
        return {
            t.__tablename__: int(s.scalar(select(func.count()).select_from(t)) or 0)
            for t in (m.Site, m.Table, m.Partition, m.Placement, m.Segment)
        }


def test_dry_run_writes_nothing_and_apply_is_idempotent(catalog_url: str, tmp_path) -> None:
    env = make_env(tmp_path, catalog_url, apply=False)
    before = counts(env)
    planned = apply_definitions(env.catalog, env.defs, dry_run=True)
    assert counts(env) == before
    done = apply_definitions(env.catalog, env.defs)
    assert [str(c) for c in planned] == [str(c) for c in done]
    assert counts(env) == {"sites": 3, "tables": 2, "partitions": 6, "placements": 4 * 2 + 2 * 3, "segments": 0}
    assert apply_definitions(env.catalog, env.defs) == []
    env.catalog.dispose()


def _redefine(env: Env, old: str, new: str):
    assert old in ORDERS_YAML
    env.config.write_text(ORDERS_YAML.replace(old, new))
    return load_definitions(env.config)


def test_refuses_dropping_a_table_with_rows(env: Env) -> None:
    write_batch(env.catalog, "orders", orders([1]))
    defs = _redefine(env, "  orders:\n", "  orders_renamed:\n")
    before = counts(env)
    with pytest.raises(RefusedError, match="orders is not in the definitions but holds 1 segment"):
        apply_definitions(env.catalog, defs)
    assert counts(env) == before


def test_refuses_key_and_schema_changes_with_data(env: Env) -> None:
    write_batch(env.catalog, "orders", orders([1]))
    with pytest.raises(RefusedError, match="primary key"):
        apply_definitions(
            env.catalog, _redefine(env, "primary_key: [o_orderkey]", "primary_key: [o_orderkey, o_custkey]")
        )
    with pytest.raises(RefusedError, match="column o_comment: changing its type string -> int64 is refused"):
        apply_definitions(env.catalog, _redefine(env, "o_comment: string", "o_comment: int64"))
    with pytest.raises(RefusedError, match="split points"):
        apply_definitions(env.catalog, _redefine(env, "[150000, 300000, 450000]", "[100000]"))
    with pytest.raises(RefusedError, match="leader"):
        apply_definitions(
            env.catalog,
            _redefine(env, "leader: primary\n    replicas: [dr]\n", "leader: dr\n    replicas: [primary]\n"),
        )


def test_empty_table_may_change_shape(env: Env) -> None:
    changes = apply_definitions(env.catalog, _redefine(env, "[150000, 300000, 450000]", "[100000]"))
    assert [c.verb for c in changes] == ["change"]
    with env.catalog.read() as s:
        table_id = s.scalar(select(m.Table.table_id).where(m.Table.name == "orders"))
        assert s.scalar(select(func.count()).select_from(m.Partition).where(m.Partition.table_id == table_id)) == 2


def test_site_id_and_uri_changes(env: Env) -> None:
    with pytest.raises(RefusedError, match="cannot change"):
        apply_definitions(env.catalog, _redefine(env, "dr: {id: 2,", "dr: {id: 9,"))
    write_batch(env.catalog, "orders", orders([1]))
    with pytest.raises(RefusedError, match="cannot move it"):
        apply_definitions(env.catalog, _redefine(env, "uri: sites/primary", "uri: sites/elsewhere"))
    changes = apply_definitions(env.catalog, _redefine(env, "uri: sites/edge", "uri: sites/edge2"))
    assert [str(c) for c in changes] == [
        f"change  site edge uri to {env.root / 'data/sites/edge2'}",
        "claim   site edge: identity marker created",  # the new root gets the site's marker
    ]


def test_adding_and_removing_replicas(env: Env) -> None:
    write_batch(env.catalog, "orders", orders([1]))
    changes = apply_definitions(env.catalog, _redefine(env, "replicas: [dr]\n", "replicas: [dr, edge]\n"))
    joining = "add     replica edge of table orders (JOINING: run `segrep bootstrap orders edge`)"
    assert [str(c) for c in changes] == [joining]
    with env.catalog.read() as s:
        states = s.scalars(select(m.Placement.state).where(m.Placement.site_id == 3, m.Placement.partition_id <= 4))
        assert set(states) == {"JOINING"}
    changes = apply_definitions(env.catalog, _redefine(env, "replicas: [dr]\n", "replicas: []\n"))
    assert [str(c) for c in changes] == [
        "remove  replica dr of table orders (its files stay on the site)",
        "remove  replica edge of table orders (its files stay on the site)",
    ]
    with env.catalog.read() as s:
        removed = list(s.scalars(select(m.Placement).where(m.Placement.site_id == 2, m.Placement.partition_id <= 4)))
        assert {p.state for p in removed} == {"REMOVED"} and all(p.removed_us for p in removed)
