"""`segrep catalog rebuild`: a site's segment lists rebuilt from its files equal the catalog they replace."""

from __future__ import annotations

import pyarrow as pa
import pytest
from sqlalchemy import select, update

from segrep.catalog import models as m
from segrep.catalog.rebuild import rebuild_site
from segrep.core.errors import RefusedError
from segrep.data.writer import write_batch
from tests.support.badinput import assert_user_error
from tests.support.checks import segment_facts, triples
from tests.support.cli import cli
from tests.support.env import Env
from tests.support.rounds import bring_up, take_down
from tests.support.tables import orders
from tests.support.union import listed_at, load_events, middle_segment


def snapshot(env: Env) -> tuple[list[tuple], dict[int, str | None]]:
    with env.catalog.read() as s:
        segs = [
            segment_facts(x) for x in s.scalars(select(m.Segment).order_by(m.Segment.placement_id, m.Segment.entry_id))
        ]
        roots = {p.placement_id: p.root_segment_id for p in s.scalars(select(m.Placement))}
    return segs, roots


def test_rebuild_matches_the_catalog_it_replaces(env: Env) -> None:
    for i in range(5):
        write_batch(env.catalog, "orders", orders([i, 150_000 + i, 500_000 + i], comment=f"v{i}"))
    write_batch(env.catalog, "orders", pa.table({"o_orderkey": pa.array([1, 2], pa.int64())}), delete=True)
    before = snapshot(env)
    # lose the site's catalog state: segment rows gone, roots reset
    with env.catalog.write() as s:
        s.execute(m.Segment.__table__.delete())
        s.execute(update(m.Placement).values(root_segment_id=None))
    assert snapshot(env) != before
    report = rebuild_site(env.catalog, "primary")
    assert sum(n for n, _ in report.placements.values()) == len(before[0])
    assert snapshot(env) == before


def test_rebuild_dry_run_and_foreign_files(env: Env) -> None:
    write_batch(env.catalog, "orders", orders([1]))
    before = snapshot(env)
    report = rebuild_site(env.catalog, "primary", dry_run=True)
    assert report.dry_run and snapshot(env) == before
    stray = env.site_dir("primary") / "orders" / "99" / ("ab" * 16 + ".parquet")
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"not parquet")
    with pytest.raises(RefusedError, match="unreadable segment metadata"):
        rebuild_site(env.catalog, "primary")
    assert snapshot(env) == before


# -- the union rule (issue 32): a file one site lost is fetched from any site that holds it ----------------


def test_rebuild_fetches_a_leader_file_from_a_replica_and_repair_keeps_every_row(outage_env: Env) -> None:
    """The tester's first case: a leader file is deleted while both replicas hold it. The rebuild with
    --accept-loss fetched nothing and dropped it ("LOST ... dropped"), and repair then rebuilt both replicas
    from the leader: the rows were gone at every site."""
    env = outage_env
    model = load_events(env)
    lost = middle_segment(env, "primary")
    (env.site_dir("primary") / lost.relpath).unlink()

    code, out, err = cli(env, "catalog", "rebuild", "--site", "primary", "--accept-loss")
    assert code == 0, err
    assert "LOST" not in out, out
    line = next(x for x in out.splitlines() if lost.segment_id in x)
    assert "FETCHED" in line and "fetched from dr" in line, out
    assert (env.site_dir("primary") / lost.relpath).read_bytes() == (env.site_dir("dr") / lost.relpath).read_bytes()
    assert lost.segment_id in {x.segment_id for x in listed_at(env, "primary")}

    code, out, err = cli(env, "repair", "events")
    assert code == 0, (out, err)
    for site in ("primary", "dr", "edge"):
        assert triples(env.catalog, site) == model.snapshot(), site


def test_rebuild_dry_run_says_where_it_would_fetch_from_and_changes_nothing(outage_env: Env) -> None:
    env = outage_env
    load_events(env)
    lost = middle_segment(env, "primary")
    (env.site_dir("primary") / lost.relpath).unlink()
    before = snapshot(env)
    code, out, err = cli(env, "catalog", "rebuild", "--site", "primary", "--dry-run")
    assert code == 0, err
    assert "would fetch from dr" in out and "LOST" not in out and "would refuse" not in out, out
    assert snapshot(env) == before and not (env.site_dir("primary") / lost.relpath).exists()


def test_only_what_no_reachable_site_holds_is_dropped_and_the_unreachable_sites_are_named(outage_env: Env) -> None:
    env = outage_env
    load_events(env)
    lost = middle_segment(env, "primary")
    (env.site_dir("primary") / lost.relpath).unlink()
    (env.site_dir("dr") / lost.relpath).unlink()  # dr lost it too; edge, which holds it, is down
    aside = take_down(env, "edge")
    try:
        code, out, err = cli(env, "catalog", "rebuild", "--site", "primary")
        assert_user_error(code, out, err, lost.segment_id, "nor at any reachable site", "edge could not be asked")
        code, out, err = cli(env, "catalog", "rebuild", "--site", "primary", "--accept-loss")
    finally:
        bring_up(env, "edge", aside)
    assert code == 0, err
    line = next(x for x in out.splitlines() if lost.segment_id in x)
    assert "LOST" in line and "dropped" in line and f"versions {lost.min_version}..{lost.max_version}" in line
    assert f"{lost.row_count} row(s)" in line
    assert any(x.startswith("  UNREACHABLE: site edge") for x in out.splitlines()), out
