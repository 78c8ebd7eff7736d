"""`segrep catalog rebuild`: a site's segment lists rebuilt from its files equal the catalog they replace."""

from __future__ import annotations

import pyarrow as pa
import pytest
from sqlalchemy import select, update

from segrep.catalog import models as m
from segrep.catalog.rebuild import rebuild_site
from segrep.core.errors import RefusedError
from segrep.data.writer import write_batch
from tests.support.checks import segment_facts
from tests.support.env import Env
from tests.support.tables import orders


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
