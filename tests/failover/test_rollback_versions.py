"""Rollback files of rows written at two schema versions (issue 35 item 3), under ``on_return: rollback``.

`primary` leads `mixed` (tests/support/versions.py) and takes writes it never replicates: some at version 1,
then the table moves to version 2 (payload renamed to body, n widened, note added with a default) and more at
version 2. `primary` goes down, `dr` is promoted; when `primary` is back, its given-up rows go to rollback
files. Those files hold exactly the given-up rows as version 2 reads them (checked against the batches
written, changed on dicts as the oracle changes them), carry version 2's field ids and version, and `segrep
rollback list` / `rollback drop` work on them. The same for a failover cut at a safe time: the rows newer than
the cut, written at both versions, go to the new leader's rollback file as version 2 reads them, and the major
built as of the cut holds the older rows at version 2.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from segrep.core.schema_versions import SchemaVersion
from segrep.data.reader import placement_files, read_table
from segrep.data.writer import write_batch
from segrep.failover.promote import Cut, failover
from segrep.replication.orchestrator import run_round
from tests.support.checks import safe_times
from tests.support.cli import cli
from tests.support.env import Env, env_fixture, sqlite_url
from tests.support.rounds import bring_up, no_spark, take_down
from tests.support.versions import MIXED, MIXED_YAML, Oracle, as_rows, assert_file_at, at_version_2, current_version

# a second table, replicated on its own schedule: its safe time at dr is the cut of a failover of both
CUT_YAML = (
    MIXED_YAML
    + """  other:
    columns: {k: int64, v: string}
    primary_key: [k]
    leader: primary
    replicas: [dr]
    policy: {retry_delay_s: 0}
"""
)


@pytest.fixture
def rollback_versions_env(tmp_path: Path) -> Iterator[Env]:
    yield from env_fixture(tmp_path, sqlite_url(tmp_path), MIXED_YAML)


@pytest.fixture
def cut_versions_env(tmp_path: Path) -> Iterator[Env]:
    yield from env_fixture(tmp_path, sqlite_url(tmp_path), CUT_YAML)


def rollback_rows(env: Env, site: str, version: SchemaVersion) -> tuple[list[str], set[tuple[Any, ...]]]:
    """`segrep rollback list`'s files of `mixed` at ``site`` (each checked to be at ``version``) and their rows
    as (tenant, seq, body, n, note, _deleted)."""
    code, out, err = cli(env, "rollback", "list", MIXED)
    assert code == 0, err
    files = [line.split() for line in out.splitlines()[1:]]
    assert {f[2] for f in files} == {site}, out
    got: set[tuple[Any, ...]] = set()
    for f in files:
        path = env.site_dir(site) / f[-1]
        assert_file_at(path, version)  # version 2's columns, field ids and version: readable as any segment
        rows = pq.read_table(path).to_pylist()
        assert int(f[4]) == len(rows), out
        got |= {(r["tenant"], r["seq"], r["body"], r["n"], r["note"], r["_deleted"]) for r in rows}
    return [f[-1] for f in files], got


def given_up(before: Oracle, after: Oracle, deleted: list[tuple[str, int]]) -> set[tuple[Any, ...]]:
    """The rows a write took from ``before`` to ``after`` (changed or new), and the tombstones, as tuples."""
    out = {(*r.values(), False) for key, r in after.rows.items() if before.rows.get(key) != r}
    return out | {(t, s, None, None, "-", True) for t, s in deleted}  # a version 1 tombstone: note's default


def test_rows_given_up_at_both_versions_are_set_aside_as_version_2_reads_them(rollback_versions_env: Env) -> None:
    env = rollback_versions_env
    kept = Oracle()
    kept.v1(env, range(0, 30), "a")
    assert run_round(env.catalog, env.defs, MIXED, submit=no_spark).status == "ok"

    lost = Oracle()  # what only primary holds, as the oracle changes it to version 2
    lost.rows = dict(kept.rows)
    lost.v1(env, range(25, 40), "lost1")  # at version 1, never replicated
    lost.delete(env, [3])
    want = given_up(kept, lost, [("a", 3)])
    at_version_2(env)
    v1_lost = Oracle()
    v1_lost.rows = dict(lost.rows)
    lost.v2(env, range(35, 45), "lost2")  # at version 2 (keys 35-39 written at both versions: both kept)
    want |= given_up(v1_lost, lost, [])
    version = current_version(env)

    aside = take_down(env, "primary")
    report = failover(env.catalog, env.defs, [MIXED])
    assert report.moves[0].assessment.rows_lost == len(want)
    kept.v2(env, range(100, 103), "after")  # at dr, the new leader
    bring_up(env, "primary", aside)
    back = run_round(env.catalog, env.defs, MIXED, submit=no_spark)  # rollback, then fast-forward from dr
    assert back.targets["primary"].status == "ok", back.targets["primary"]
    for site in ("primary", "dr"):
        assert as_rows(read_table(env.catalog, MIXED, site=site)) == kept.expected(), site

    files, got = rollback_rows(env, "primary", version)
    assert len(files) == 2  # one file per partition
    assert got == want  # exactly the given-up rows, each as version 2 reads it

    code, out, err = cli(env, "rollback", "drop", MIXED, "--site", "primary")
    assert code == 0 and out.count("dropped ") == 2, out + err
    _code, out, _ = cli(env, "rollback", "list")
    assert out.strip() == "no rollback files"


def test_a_cut_at_safe_time_sets_aside_rows_of_both_versions_as_version_2_reads_them(cut_versions_env: Env) -> None:
    env = cut_versions_env
    kept = Oracle()
    kept.v1(env, range(0, 30), "a")
    write_batch(env.catalog, "other", pa.table({"k": pa.array([1, 2], pa.int64()), "v": ["o1", "o2"]}))
    for table in (MIXED, "other"):
        assert run_round(env.catalog, env.defs, table, submit=no_spark).status == "ok"
    cut_us = safe_times(env.catalog, "other")["dr"]

    newer = Oracle()  # replicated to dr, but newer than other's safe time there: the cut sets them aside
    newer.rows = dict(kept.rows)
    newer.v1(env, range(25, 35), "after1")
    newer.delete(env, [4])
    want = given_up(kept, newer, [("b", 4)])
    at_version_2(env)
    before_v2 = Oracle()
    before_v2.rows = dict(newer.rows)
    newer.v2(env, range(30, 40), "after2")
    want |= given_up(before_v2, newer, [])
    assert run_round(env.catalog, env.defs, MIXED, submit=no_spark).status == "ok"
    assert safe_times(env.catalog, MIXED)["dr"] > cut_us
    version = current_version(env)

    report = failover(env.catalog, env.defs, [MIXED, "other"], to="dr", cut=Cut.SAFE_TIME, submit=no_spark)
    assert report.cut_us == cut_us
    (cut,) = [c for c in report.cuts if c.table == MIXED]
    assert cut.rows_set_aside == len(want)
    assert as_rows(read_table(env.catalog, MIXED)) == kept.expected()  # dr as of the cut, read at version 2
    _info, placements = placement_files(env.catalog, MIXED)
    for pf in placements:  # the major built as of the cut: at version 2
        assert_file_at(Path(pf.site.path(pf.segments[-1].relpath)), version)

    files, got = rollback_rows(env, "dr", version)
    assert sorted(f"dr:{f}" for f in files) == sorted(cut.rollback_files)
    assert got == want  # exactly the rows newer than the cut, each as version 2 reads it
    code, out, err = cli(env, "rollback", "drop", MIXED, "--site", "dr")
    assert code == 0 and out.count("dropped ") == len(files), out + err
