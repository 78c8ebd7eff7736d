"""``segrep status``: the RPO column and flags, the new timing fields, and the aggregated pending counts (the
page's numbers) against the chain walk over ``snapshot`` they replaced, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from segrep.catalog.apply import apply_definitions
from segrep.catalog.snapshot import snapshot
from segrep.cli.views import rpo_cell, status_output
from segrep.config.definitions import load_definitions
from segrep.core import hlc
from segrep.core.chain import offer_order
from segrep.data.writer import write_batch
from segrep.replication.orchestrator import run_round
from segrep.replication.status import status_rows
from tests.support.env import ORDERS_YAML, Env, make_env
from tests.support.rounds import no_spark
from tests.support.tables import TABLE, batch

RPO_YAML = ORDERS_YAML.replace("    replicas: [dr, edge]\n", "    replicas: [dr, edge]\n    policy: {rpo: 15m}\n")


def reference_pending(env: Env, table: str) -> dict[str, tuple[int, int]]:
    """Pending segments and bytes per site as status computed them before aggregation: the leader's chain
    over ``snapshot(active_only=True)``, minus each replica's acks."""
    segs: Counter[int] = Counter()
    size: Counter[int] = Counter()
    with env.catalog.read() as s:
        snap = snapshot(s, table, active_only=True)
        for part in snap.partitions:
            chain = part.chain(part.leader)
            for replica in part.replicas:
                refs = offer_order(chain, part.acked_by(part.leader, replica))
                segs[replica.site_id] += len(refs)
                size[replica.site_id] += sum(
                    part.segment(part.leader.placement_id, r.segment_id).byte_size for r in refs
                )
        return {snap.sites[i].name: (segs[i], size[i]) for i in snap.replica_site_ids}


def test_aggregated_pending_equals_the_chain_walk(env: Env) -> None:
    def check() -> None:
        got = {r.target: (r.pending_segments, r.pending_bytes) for r in status_rows(env.catalog, TABLE)}
        assert got == reference_pending(env, TABLE)

    check()
    write_batch(env.catalog, TABLE, batch(range(40), "a"))
    write_batch(env.catalog, TABLE, batch(range(20, 60), "b"))
    check()
    assert run_round(env.catalog, env.defs, TABLE, target="edge", submit=no_spark).status == "ok"
    write_batch(env.catalog, TABLE, batch(range(50, 70), "c"))
    check()
    rows = {r.target: r for r in status_rows(env.catalog, TABLE)}
    assert rows["dr"].pending_segments == 6 and rows["edge"].pending_segments == 2  # 3 batches x 2 partitions
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).status == "ok"
    check()
    assert all(r.pending_segments == 0 and r.pending_bytes == 0 for r in status_rows(env.catalog, TABLE))


@pytest.fixture
def rpo_env(tmp_path: Path) -> Env:
    env = make_env(tmp_path, f"sqlite:///{tmp_path / 'catalog.db'}", RPO_YAML)
    write_batch(env.catalog, TABLE, batch(range(10), "a"))
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).status == "ok"
    return env


def test_status_marks_the_objective_and_its_breach(rpo_env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    defs = load_definitions(rpo_env.config)
    text = status_output(rpo_env.catalog, defs, None, as_json=False)
    header = next(line for line in text.splitlines() if line.startswith("table "))
    assert header.split()[:6] == ["table", "target", "safe", "time", "lag", "s"] and "  rpo  " in header
    events = [line for line in text.splitlines() if line.startswith(f"{TABLE} ")]
    assert len(events) == 2 and all(" 15m ok " in line for line in events)
    orders = next(line for line in text.splitlines() if line.startswith("orders "))
    assert " 15m " not in orders  # no objective: "-"

    doc = json.loads(status_output(rpo_env.catalog, defs, None, as_json=True))
    rows = {(r["table"], r["target"]): r for r in doc["replication"]}
    assert rows[(TABLE, "dr")]["rpo_s"] == 900 and rows[(TABLE, "dr")]["rpo_breached"] is False
    assert rows[("orders", "dr")]["rpo_s"] is None and rows[("orders", "dr")]["rpo_breached"] is False
    assert rows[(TABLE, "dr")]["last_round_seconds"] >= 0 and rows[(TABLE, "dr")]["backoff_until_us"] is None

    later = hlc.now_us() + 1800 * 1_000_000  # half an hour later, nothing replicated: past 15 minutes
    monkeypatch.setattr(hlc, "now_us", lambda: later)
    text = status_output(rpo_env.catalog, defs, TABLE, as_json=False)
    assert sum(" 15m BREACHED " in line for line in text.splitlines()) == 2
    doc = json.loads(status_output(rpo_env.catalog, defs, TABLE, as_json=True))
    assert all(r["rpo_breached"] and r["lag_s"] > 1800 for r in doc["replication"])
    # without definitions (a command given only --catalog) there is no objective to breach
    assert all(
        not r["rpo_breached"]
        for r in json.loads(status_output(rpo_env.catalog, None, TABLE, as_json=True))["replication"]
    )


def test_rpo_cell_reads_unknown_only_for_a_lag_nobody_can_know(rpo_env: Env) -> None:
    [row] = [r for r in status_rows(rpo_env.catalog, TABLE, rpo={TABLE: 3600}) if r.target == "dr"]
    assert rpo_cell(row) == "1h ok"
    row.safe_time_us, row.lag_s, row.behind_since_us = None, None, None  # no safe time and no start: unknown
    assert rpo_cell(row) == "1h ?"
    row.rpo_s = None
    assert rpo_cell(row) == "-"


def test_status_counts_a_never_replicated_replica_from_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No round ever ran (the replication DAG paused since apply): the replicas are behind from their start,
    not "unknown and fine"; half an hour later they breach the 15-minute objective."""
    env = make_env(tmp_path, f"sqlite:///{tmp_path / 'catalog.db'}", RPO_YAML)
    write_batch(env.catalog, TABLE, batch(range(10), "a"))
    defs = load_definitions(env.config)
    started = {r.target: r.behind_since_us for r in status_rows(env.catalog, TABLE)}
    assert all(started.values())

    lines = status_output(env.catalog, defs, TABLE, as_json=False).splitlines()
    events = [line for line in lines if line.startswith(f"{TABLE} ")]
    assert len(events) == 2 and all(" 15m ok " in line and "never replicated (behind since " in line for line in events)

    later = hlc.now_us() + 1800 * 1_000_000
    monkeypatch.setattr(hlc, "now_us", lambda: later)
    lines = status_output(env.catalog, defs, TABLE, as_json=False).splitlines()
    assert sum(" 15m BREACHED " in line for line in lines) == 2
    doc = json.loads(status_output(env.catalog, defs, TABLE, as_json=True))
    for r in doc["replication"]:
        assert r["safe_time_us"] is None and r["rpo_breached"] and r["pending_segments"] == 2
        assert r["behind_since_us"] == started[r["target"]]
        assert r["lag_s"] == round((later - started[r["target"]]) / 1e6, 1) >= 1800
        assert r["note"].startswith(f"never replicated (behind since {hlc.iso(started[r['target']])})")
    env.catalog.dispose()


def test_status_shows_the_tables_replicated_on_write(tmp_path: Path) -> None:
    text = RPO_YAML.replace("policy: {rpo: 15m}", "policy: {rpo: 4m, schedule: on_write, min_interval: 30s}")
    env = make_env(tmp_path, f"sqlite:///{tmp_path / 'catalog.db'}", text)
    defs = load_definitions(env.config)

    lines = status_output(env.catalog, defs, None, as_json=False).splitlines()
    at = lines.index("rounds on write (schedule: on_write):")
    assert (
        lines[at + 1] == f"  {TABLE}: a round after each write, rounds at least 30s apart; every 2m if an event is lost"
    )
    doc = json.loads(status_output(env.catalog, defs, None, as_json=True))
    assert doc["schedules"] == {
        TABLE: {"schedule": "on_write", "min_interval_s": 30, "fallback_s": 120},
        "orders": {"schedule": "@hourly"},
    }
    assert list(json.loads(status_output(env.catalog, defs, "orders", as_json=True))["schedules"]) == ["orders"]
    assert "rounds on write" not in status_output(env.catalog, defs, "orders", as_json=False)
    assert json.loads(status_output(env.catalog, None, None, as_json=True))["schedules"] == {}


def test_status_shows_each_sites_schema_version_beside_the_tables(tmp_path: Path) -> None:
    """After `segrep apply` adds a column: the leader shows the new version once it has written at it, a replica
    not replicated since the old one ("v1 (table v2)", not an error), and after a round the new one."""
    env = make_env(tmp_path, f"sqlite:///{tmp_path / 'catalog.db'}", RPO_YAML)
    write_batch(env.catalog, TABLE, batch(range(10), "a"))
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).status == "ok"
    assert {r.target: r.schema_text() for r in status_rows(env.catalog, TABLE)} == {"dr": "v1", "edge": "v1"}
    assert status_output(env.catalog, None, TABLE, as_json=False).splitlines()[0] == (
        f"{TABLE}: leader primary (2 partitions), epoch 1"  # columns never changed: no schema said
    )

    env.config.write_text(RPO_YAML.replace("at: timestamp}", "at: timestamp, note: string}"))
    apply_definitions(env.catalog, env.defs)
    first = status_output(env.catalog, None, TABLE, as_json=False).splitlines()[0]
    assert first == f"{TABLE}: leader primary (2 partitions), epoch 1, schema v1 (table v2)"  # nothing written at v2
    new = batch(range(10, 20), "b")
    write_batch(env.catalog, TABLE, new.append_column("note", pa.array(["n"] * new.num_rows)))

    lines = status_output(env.catalog, None, TABLE, as_json=False).splitlines()
    assert lines[0] == f"{TABLE}: leader primary (2 partitions), epoch 1, schema v2"
    assert lines[1].split()[-2:] == ["schema", "note"]  # last but the note: earlier columns keep their places
    replicas = [line for line in lines if line.startswith(f"{TABLE} ")]
    assert len(replicas) == 2 and all(" v1 (table v2) " in line for line in replicas), lines
    doc = json.loads(status_output(env.catalog, None, TABLE, as_json=True))
    for r in doc["replication"]:
        assert (r["schema_version"], r["table_schema_version"], r["schema"]) == (1, 2, "v1 (table v2)")
    [lead] = doc["leadership"]
    assert lead["schema_version"] == 2 and lead["leader_schema_versions"] == {"primary": 2}

    assert run_round(env.catalog, env.defs, TABLE, target="dr", submit=no_spark).status == "ok"
    rows = {r.target: r for r in status_rows(env.catalog, TABLE)}
    assert (rows["dr"].schema_version, rows["dr"].schema_text()) == (2, "v2")
    assert (rows["edge"].schema_version, rows["edge"].schema_text()) == (1, "v1 (table v2)")
    assert "schema" not in rows["edge"].note()  # an older version is not a problem to act on
    env.catalog.dispose()
