"""A split of a partition whose chain holds segments of two schema versions (issue 35 item 3), on both merge
engines: the Spark job and in process.

Partition [-inf, m) of `mixed` (tests/support/versions.py) holds segments written at version 1 and at version 2
(payload renamed to body, n widened int16 -> int64, note added with a default), updates and deletes across
the change. It is split at "b" with a copy pass, finalize and an unload pass while a version 1 writer and a
version 2 writer go on. The children's rows, at the leader and at the replica, are exactly the oracle's (the
same changes on dicts: renamed names, widened values, the default), and every file the split wrote carries
version 2 (its field ids and the version in its metadata): the children never hold a version 1 file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.core.states import SplitState
from segrep.data.reader import placement_files, read_table
from segrep.replication.orchestrator import run_round
from segrep.replication.unload import finish, finish_unloaded
from segrep.split.run import run_split
from tests.support.env import Env, env_fixture, sqlite_url
from tests.support.rounds import no_spark
from tests.support.spark import merge_engine, spark_submit_in
from tests.support.versions import MIXED, MIXED_YAML, as_rows, assert_file_at, current_version, mixed_history

pytestmark = pytest.mark.spark


@pytest.fixture
def split_versions_env(tmp_path: Path) -> Iterator[Env]:
    yield from env_fixture(tmp_path, sqlite_url(tmp_path), MIXED_YAML)


def first_partition(env: Env) -> int:
    """The partition [-inf, m) (apply creates a table's partitions in key order)."""
    with env.catalog.read() as s:
        return s.scalars(select(m.Partition.partition_id).order_by(m.Partition.partition_id).limit(1)).one()


def segment_versions(env: Env, partition_ids: list[int]) -> set[int]:
    with env.catalog.read() as s:
        return set(s.scalars(select(m.Segment.schema_version).where(m.Segment.partition_id.in_(partition_ids))))


@pytest.mark.parametrize("engine", ["spark", "in_process"])
def test_a_partition_of_two_versions_splits_into_children_at_the_current_one(
    split_versions_env: Env, spark: Any, engine: str
) -> None:
    env = split_versions_env
    oracle = mixed_history(env)
    assert run_round(env.catalog, env.defs, MIXED, submit=no_spark).status == "ok"  # dr: both versions too
    parent = first_partition(env)
    assert segment_versions(env, [parent]) == {1, 2}
    version = current_version(env)

    with merge_engine(engine):
        report = run_split(env.catalog, env.defs, MIXED, parent, ["b"], submit=spark_submit_in(spark))
        assert report.finish.state == SplitState.UNLOAD, report.finish
        oracle.v1(env, [4, 7, 50], "late_v1")  # into the children now, at both versions' columns
        oracle.v2(env, [5, 8], "late_v2")
        for _ in range(2):  # the children reach dr; the parent's unload then completes
            run_round(env.catalog, env.defs, MIXED, submit=no_spark)
            finish_unloaded(env.catalog, env.defs, MIXED)
        assert finish(env.catalog, env.defs, report.split_id).state == SplitState.DONE
    apps = sum(p.commit.spark_apps for p in report.passes)
    assert (apps > 0) == (engine == "spark"), report.passes
    assert sum(p.plan.rewrites for p in report.passes) > 0  # the parent's segments were rewritten for the children

    for site in ("primary", "dr"):
        assert as_rows(read_table(env.catalog, MIXED, site=site)) == oracle.expected(), site
    children = report.children
    assert segment_versions(env, children) == {2}
    _info, placements = placement_files(env.catalog, MIXED, "primary")
    files = [pf.site.path(seg.relpath) for pf in placements if pf.partition_id in children for seg in pf.segments]
    assert len(files) >= len(children)
    for path in files:  # every child file: version 2's field ids and the version in its metadata
        assert_file_at(Path(path), version)
