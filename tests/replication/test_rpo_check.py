"""Lag measured from now, rounds or not (issue 34 item 4): a replica that never had a round is behind from its
start, and counts against its RPO in ``status_rows`` (so in ``segrep status``, the page and its Prometheus
gauges) and in the watchdog's check (``segrep.replication.rpo_check``), which says why each is behind.

The clock is the ``now_us`` every reader takes: no test here waits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update

from segrep.catalog import models as m
from segrep.catalog.apply import apply_definitions
from segrep.core import hlc
from segrep.core import metric_names as mn
from segrep.data.writer import write_batch
from segrep.replication.orchestrator import run_round
from segrep.replication.rpo_check import RpoBreached, check_rpo
from segrep.replication.status import rpo_breached, status_rows
from tests.support.airflow import REPO
from tests.support.env import ORDERS_YAML, Env, make_env
from tests.support.rounds import no_spark
from tests.support.tables import TABLE, batch

S = 1_000_000
RPO_S = 120  # the case: 7 minutes behind a 2-minute objective
RPO = {TABLE: RPO_S}


def _placed_us(env: Env, site: str) -> int:
    """When the site's oldest replica placement of the table was made (``segrep apply``)."""
    with env.catalog.read() as s:
        made = s.scalar(
            select(func.min(m.Placement.created_us))
            .join(m.Partition, m.Partition.partition_id == m.Placement.partition_id)
            .join(m.Table, m.Table.table_id == m.Partition.table_id)
            .join(m.Site, m.Site.site_id == m.Placement.site_id)
            .where(m.Table.name == TABLE, m.Site.name == site, m.Placement.removed_us.is_(None))
        )
    assert made is not None
    return int(made)


def _rows(env: Env, now_us: int) -> dict[str, Any]:
    return {r.target: r for r in status_rows(env.catalog, TABLE, rpo=RPO, now_us=now_us)}


def test_a_never_replicated_target_is_behind_from_its_start(env: Env) -> None:
    write_batch(env.catalog, TABLE, batch(range(20), "a"))
    start = _placed_us(env, "dr")  # apply made the placements before the write: they are the start

    early = _rows(env, start + 60 * S)
    late = _rows(env, start + 420 * S)

    for site in ("dr", "edge"):
        assert early[site].safe_time_us is None and early[site].never_replicated
        assert early[site].behind_since_us == _placed_us(env, site)
        assert early[site].lag_s == pytest.approx((start + 60 * S - _placed_us(env, site)) / S, abs=0.1)
        assert not early[site].rpo_breached  # 1 min behind a 2-minute objective
        assert late[site].lag_s == pytest.approx((start + 420 * S - _placed_us(env, site)) / S, abs=0.1)
        assert late[site].lag_s >= 419 and late[site].rpo_breached  # 7 min behind: breached, not "unknown, fine"
        assert late[site].pending_segments == 2
        assert late[site].note().startswith(f"never replicated (behind since {hlc.iso(_placed_us(env, site))})")

    # The first round gives it a safe time: from then on the lag counts from that, as for every target.
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).status == "ok"
    after = _rows(env, hlc.now_us())
    for site in ("dr", "edge"):
        safe = after[site].safe_time_us
        assert safe is not None and after[site].behind_since_us == safe and not after[site].never_replicated
        assert not after[site].rpo_breached and "never replicated" not in after[site].note()


def test_a_site_added_later_counts_from_its_join(tmp_path: Path) -> None:
    """A replica site added to a table that holds data is JOINING (a bootstrap feeds it, rounds offer it
    nothing): it is behind from when its placements were made, not from the table's creation."""
    one_replica = ORDERS_YAML.replace("    replicas: [dr, edge]\n", "    replicas: [dr]\n")
    env = make_env(tmp_path, f"sqlite:///{tmp_path / 'catalog.db'}", one_replica)
    write_batch(env.catalog, TABLE, batch(range(20), "a"))
    env.config.write_text(ORDERS_YAML)  # edge joins events, which already holds data
    apply_definitions(env.catalog, env.defs)
    joined = _placed_us(env, "edge")
    assert joined > _placed_us(env, "dr")

    rows = {r.target: r for r in status_rows(env.catalog, TABLE, rpo=RPO, now_us=joined + 60 * S)}

    assert rows["edge"].joining and rows["edge"].never_replicated and rows["edge"].pending_segments == 0
    assert rows["edge"].behind_since_us == joined and rows["edge"].lag_s == 60.0 and not rows["edge"].rpo_breached
    assert rows["dr"].behind_since_us == _placed_us(env, "dr") and rows["dr"].pending_segments == 2
    env.catalog.dispose()


def test_a_target_lacking_segments_older_than_its_placements_counts_from_the_oldest(env: Env) -> None:
    """Placements made after the data they lack (here: ``apply`` on a host whose clock ran an hour ahead of the
    writer's): the start is the commit of the oldest segment the leaders would offer the target."""
    write_batch(env.catalog, TABLE, batch(range(20), "a"))
    ahead = hlc.now_us() + 3600 * S
    with env.catalog.write() as s:
        dr = s.scalar(select(m.Site.site_id).where(m.Site.name == "dr"))
        s.execute(update(m.Placement).where(m.Placement.site_id == dr).values(created_us=ahead))
        oldest = int(s.scalar(select(func.min(m.Segment.committed_us))) or 0)

    rows = _rows(env, oldest + 420 * S)

    assert rows["dr"].behind_since_us == oldest and rows["dr"].lag_s == 420.0 and rows["dr"].rpo_breached
    assert rows["edge"].behind_since_us == _placed_us(env, "edge") < oldest  # its placements came first


def test_an_unknown_lag_is_breached_while_the_target_lacks_segments() -> None:
    """The objective's verdict on a lag that cannot be known (no safe time and no start in the catalog)."""
    assert rpo_breached(None, RPO_S, pending_segments=3)  # it lacks rows and nobody can say since when
    assert not rpo_breached(None, RPO_S, pending_segments=0)  # nothing to lose
    assert not rpo_breached(None, None, pending_segments=3)  # no objective, nothing to breach
    assert rpo_breached(RPO_S * S + 1, RPO_S) and not rpo_breached(RPO_S * S, RPO_S)


def test_the_check_names_each_breach_with_its_lag_objective_and_why(env: Env) -> None:
    write_batch(env.catalog, TABLE, batch(range(20), "a"))
    start = _placed_us(env, "dr")

    # No round ever ran (the replication DAG never unpaused): within the objective, then past it.
    fine = check_rpo(env.catalog, RPO, now_us=start + 60 * S)
    assert fine.ok and fine.failure() is None and fine.no_objective == ["orders"]
    fine.raise_on_breach()
    assert fine.lines()[0].endswith(": 3 replica(s), 0 breached")  # events at dr, edge; orders at dr (no RPO)
    assert f"  {TABLE} at dr: lag {_human(fine, 'dr')} (never replicated); RPO 2 min met" in fine.lines()
    assert "  orders at dr: lag " in "\n".join(fine.lines()) and "; no objective" in fine.lines()[-1]
    never = check_rpo(env.catalog, RPO, now_us=start + 420 * S)
    assert [(b.table, b.site) for b in never.breaches] == [(TABLE, "dr"), (TABLE, "edge")]
    for b in never.breaches:
        assert b.lag_s is not None and b.lag_s >= 419 and b.behind_since_us == _placed_us(env, b.site)
        assert b.reasons[0].startswith(f"no round of {TABLE} has finished yet (its replication DAG paused")
        assert b.reasons[1].startswith("never replicated (behind since ")
        assert b.reasons[-1] == f"lacks 2 segment(s) ({_bytes(env, b.site)})"

    # A round, then the rounds stop (the DAG paused) while writes go on.
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).status == "ok"
    write_batch(env.catalog, TABLE, batch(range(20, 30), "b"))
    now = hlc.now_us()
    assert check_rpo(env.catalog, RPO, now_us=now).ok

    check = check_rpo(env.catalog, RPO, now_us=now + 7 * 60 * S)

    assert not check.ok and [(b.table, b.site) for b in check.breaches] == [(TABLE, "dr"), (TABLE, "edge")]
    dr = check.breaches[0]
    assert dr.rpo_s == RPO_S and dr.lag_s is not None and dr.lag_s >= 420
    assert dr.reasons[0].startswith(f"no round of {TABLE} has finished for 7 min (since ")
    assert "replication DAG paused" in dr.reasons[0] and "never replicated" not in " ".join(dr.reasons)
    assert dr.reasons[-1].startswith("lacks 2 segment(s)")
    message = check.failure() or ""
    assert message.startswith("RPO breach: 2 replica(s) behind their objective: ")
    assert f"{TABLE} at dr: lag 7 min" in message and "past its RPO of 2 min" in message
    assert f"{TABLE} at edge: lag 7 min" in message
    with pytest.raises(RpoBreached) as raised:
        check.raise_on_breach()
    assert str(raised.value) == message and raised.value.breaches == check.breaches
    assert check.to_dict()["breaches"][0] == {
        "table": TABLE,
        "site": "dr",
        "lag_s": dr.lag_s,
        "rpo_s": RPO_S,
        "reasons": list(dr.reasons),
    }


def _bytes(env: Env, site: str) -> str:
    from segrep.core.human import human_bytes

    return human_bytes(next(r.pending_bytes for r in status_rows(env.catalog, TABLE) if r.target == site))


def _human(check: Any, site: str) -> str:
    from segrep.core.human import human_seconds

    return human_seconds(next(t.lag_s for t in check.targets if t.target == site))


def test_the_prometheus_gauges_count_a_never_replicated_target(
    sqlite_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page's Prometheus endpoint renders ``status_rows`` under ``metric_names``: a replica that never had
    a round has a lag (not a missing sample) and ``segrep_rpo_breached`` 1 once past the objective."""
    monkeypatch.syspath_prepend(str(REPO / "plugins"))  # as the api-server loads the plugin (no Airflow import)
    from segrep_page.metrics import exposition

    write_batch(sqlite_env.catalog, TABLE, batch(range(20), "a"))
    now = _placed_us(sqlite_env, "dr") + 420 * S
    text = exposition(status_rows(sqlite_env.catalog, TABLE, rpo=RPO, now_us=now)).decode()

    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line[:1] != "#"}
    for site in ("dr", "edge"):
        labels = f'{{site="{site}",table="{TABLE}"}}'
        assert samples[f"{mn.LAG_SECONDS.prometheus}{labels}"] == pytest.approx(
            (now - _placed_us(sqlite_env, site)) / S, abs=0.1
        )
        assert samples[f"{mn.RPO_BREACHED.prometheus}{labels}"] == 1.0
        assert samples[f"{mn.RPO_SECONDS.prometheus}{labels}"] == RPO_S
        assert f"{mn.SAFE_TIME.prometheus}{labels}" not in samples  # no safe time: left out, not 0
