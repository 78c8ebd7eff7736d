"""`segrep catalog rebuild` never makes a loss permanent unnoticed (issue 11 item 3).

A catalog segment whose file is gone is named by the dry run and makes the rebuild refuse (exit 2, nothing
changed) unless `--accept-loss`, which drops it and says so. A stray well-formed file the catalog never listed
never becomes a chain head without the same flag. A listed file whose bytes are not the catalog's is refused
even with it.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.core import ids
from segrep.core.errors import CorruptSegmentError
from segrep.data.reader import read_table
from segrep.data.writer import write_batch
from segrep.storage.site import Site
from tests.support.badinput import assert_user_error, unchanged
from tests.support.cli import cli
from tests.support.env import Env, make_env, sqlite_url
from tests.support.tables import orders


def _segments(env: Env, site: str = "primary") -> list[m.Segment]:
    with env.catalog.read() as s:
        return list(
            s.scalars(
                select(m.Segment)
                .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
                .join(m.Site, m.Site.site_id == m.Placement.site_id)
                .where(m.Site.name == site)
                .order_by(m.Segment.entry_id)
            )
        )


def _listed(env: Env) -> set[str]:
    return {seg.segment_id for seg in _segments(env)}


def _keys(env: Env) -> list[int]:
    return sorted(read_table(env.catalog, "orders").column("o_orderkey").to_pylist())


def _load(env: Env) -> None:
    write_batch(env.catalog, "orders", orders([1, 2, 3]))
    write_batch(env.catalog, "orders", orders([4, 5]))
    write_batch(env.catalog, "orders", orders([150_001]))


def test_a_missing_file_is_named_by_the_dry_run_and_refused(env: Env) -> None:
    _load(env)
    lost = _segments(env)[0]
    (env.site_dir("primary") / lost.relpath).unlink()
    with unchanged(env):
        code, out, err = cli(env, "catalog", "rebuild", "--site", "primary", "--dry-run")
    assert code == 0, err
    line = next(x for x in out.splitlines() if lost.segment_id in x)
    assert "LOST" in line and "orders partition" in line and "3 row(s)" in line
    assert f"versions {lost.min_version}..{lost.max_version}" in line
    assert "would refuse" in out

    with unchanged(env):
        code, out, err = cli(env, "catalog", "rebuild", "--site", "primary")
    assert_user_error(code, out, err, lost.segment_id, "--accept-loss", "3 row(s)", "have no file")

    code, out, err = cli(env, "catalog", "rebuild", "--site", "primary", "--accept-loss")
    assert code == 0, err
    assert any("LOST" in x and lost.segment_id in x and "dropped" in x for x in out.splitlines()), out
    assert lost.segment_id not in _listed(env)
    assert _keys(env) == [4, 5, 150_001]  # the loss, accepted


def test_a_missing_segment_holding_deletes_brings_nothing_back(env: Env) -> None:
    _load(env)
    write_batch(env.catalog, "orders", pa.table({"o_orderkey": pa.array([2], pa.int64())}), delete=True)
    assert _keys(env) == [1, 3, 4, 5, 150_001]
    tombstone = _segments(env)[-1]
    assert tombstone.deleted_rows == 1
    (env.site_dir("primary") / tombstone.relpath).unlink()
    with unchanged(env):
        code, out, err = cli(env, "catalog", "rebuild", "--site", "primary")
    assert_user_error(code, out, err, tombstone.segment_id, "1 tombstone(s)")
    with pytest.raises(CorruptSegmentError, match="is missing"):  # the read fails; it does not serve key 2
        read_table(env.catalog, "orders")
    code, out, err = cli(env, "catalog", "rebuild", "--site", "primary", "--accept-loss")
    assert code == 0 and "1 tombstone(s)" in out and "dropped" in out, (out, err)


def _stray(env: Env, *, base: m.Segment, version_bump: int = 0, partition_id: int | None = None) -> Path:
    """A well-formed segment file the catalog never listed: ``base``'s rows under a new id built on ``base``."""
    site = Site("primary", str(env.site_dir("primary")))
    rows = site.read_segment(base.relpath).replace_schema_metadata(None)
    meta = site.read_meta(base.relpath)
    sid = ids.new_segment_id()
    pid = partition_id if partition_id is not None else base.partition_id
    meta |= {"segment_id": sid, "base_segment_id": base.segment_id, "partition_id": pid}
    if version_bump:
        versions = pa.array([meta["max_version"] + version_bump] * rows.num_rows, pa.int64())
        rows = rows.set_column(rows.schema.get_field_index("_version"), "_version", versions)
        meta |= {"min_version": meta["max_version"] + version_bump, "max_version": meta["max_version"] + version_bump}
    rel = f"orders/{pid}/{sid}.parquet"
    site.write_segment(rel, rows, meta)
    return env.site_dir("primary") / rel


def test_a_stray_head_never_becomes_the_root_without_the_flag(env: Env) -> None:
    _load(env)
    root = _segments(env)[1]  # the first partition's root
    stray = _stray(env, base=root)
    with unchanged(env):
        code, out, err = cli(env, "catalog", "rebuild", "--site", "primary", "--dry-run")
    assert code == 0 and "NOT IN THE CATALOG" in out and stray.stem in out, (out, err)
    with unchanged(env):
        code, out, err = cli(env, "catalog", "rebuild", "--site", "primary")
    assert_user_error(code, out, err, stray.stem, "a chain head the catalog never had", "--accept-loss")
    code, out, err = cli(env, "catalog", "rebuild", "--site", "primary", "--accept-loss")
    assert code == 0, err
    with env.catalog.read() as s:
        roots = {pl.root_segment_id for pl in s.scalars(select(m.Placement))}
    assert stray.stem in roots


def test_a_file_past_the_tables_clock_is_stray_even_in_an_empty_placement(env: Env) -> None:
    """Into a partition the catalog lists nothing for, a file whose versions no write ever committed."""
    _load(env)
    with env.catalog.read() as s:
        empty = s.scalars(select(m.Partition.partition_id).order_by(m.Partition.partition_id)).all()[2]
    stray = _stray(env, base=_segments(env)[0], version_bump=10**9, partition_id=empty)
    with unchanged(env):
        code, out, err = cli(env, "catalog", "rebuild", "--site", "primary")
    assert_user_error(code, out, err, stray.stem, "never committed")


def test_a_damaged_listed_file_is_refused_even_with_the_flag(env: Env) -> None:
    _load(env)
    path = env.site_dir("primary") / _segments(env)[0].relpath
    data = bytearray(path.read_bytes())
    data[8] ^= 1  # in the first column chunk (the middle of a small file is its footer, which names it)
    path.write_bytes(bytes(data))
    for flag in ([], ["--accept-loss"]):
        with unchanged(env):
            code, out, err = cli(env, "catalog", "rebuild", "--site", "primary", *flag)
        assert_user_error(code, out, err, str(path), "is damaged")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.lists(st.lists(st.integers(0, 599_999), min_size=1, max_size=4), min_size=1, max_size=5),
    deletes=st.lists(st.integers(0, 599_999), max_size=3),
    lose=st.sets(st.integers(0, 20), min_size=1, max_size=3),
)
def test_every_lost_segment_is_reported_and_only_the_flag_drops_them(
    batches: list[list[int]], deletes: list[int], lose: set[int]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = make_env(Path(tmp), sqlite_url(Path(tmp)))
        try:
            for keys in batches:
                write_batch(env.catalog, "orders", orders(keys))
            if deletes:
                write_batch(env.catalog, "orders", pa.table({"o_orderkey": pa.array(deletes, pa.int64())}), delete=True)
            segs = _segments(env)
            gone = {segs[i % len(segs)].segment_id for i in lose}
            for seg in segs:
                if seg.segment_id in gone:
                    (env.site_dir("primary") / seg.relpath).unlink()
            with unchanged(env):
                code, out, err = cli(env, "catalog", "rebuild", "--site", "primary", "--dry-run")
                assert code == 0, err
                assert set(re.findall(r"LOST: orders partition \d+ segment (\w+)", out)) == gone
                code, out, err = cli(env, "catalog", "rebuild", "--site", "primary")
                line = assert_user_error(code, out, err, "--accept-loss", *gone)
                assert f"{len(gone)} catalog segment(s)" in line
            code, out, err = cli(env, "catalog", "rebuild", "--site", "primary", "--accept-loss")
            assert code == 0, err
            assert _listed(env) == {seg.segment_id for seg in segs} - gone
        finally:
            env.catalog.dispose()
