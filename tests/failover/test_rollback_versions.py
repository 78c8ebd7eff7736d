"""Rollback files of rows written at two schema versions (issue 35 item 3), under ``on_return: rollback``.

`primary` leads `mixed` (tests/support/versions.py) and takes writes it never replicates: some at version 1,
then the table moves to version 2 (payload renamed to body, n widened, note added with a default) and more at
version 2. `primary` goes down, `dr` is promoted; when `primary` is back, its given-up rows go to rollback
files. Those files hold exactly the given-up rows as version 2 reads them (checked against the batches
written, changed on dicts as the oracle changes them), carry version 2's field ids and version, and `segrep
rollback list` / `rollback drop` work on them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from segrep.data.reader import read_table
from segrep.failover.promote import failover
from segrep.replication.orchestrator import run_round
from tests.support.cli import cli
from tests.support.env import Env, env_fixture, sqlite_url
from tests.support.rounds import bring_up, no_spark, take_down
from tests.support.versions import MIXED, MIXED_YAML, Oracle, as_rows, assert_file_at, at_version_2, current_version


@pytest.fixture
def rollback_versions_env(tmp_path: Path) -> Iterator[Env]:
    yield from env_fixture(tmp_path, sqlite_url(tmp_path), MIXED_YAML)


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

    code, out, err = cli(env, "rollback", "list", MIXED)
    assert code == 0, err
    files = [line.split() for line in out.splitlines()[1:]]
    assert len(files) == 2 and {f[2] for f in files} == {"primary"}, out  # one file per partition
    assert sum(int(f[4]) for f in files) == len(want)
    got: set[tuple[Any, ...]] = set()
    for f in files:
        path = env.site_dir("primary") / f[-1]
        assert_file_at(path, version)  # version 2's columns, field ids and version: readable as any segment
        for r in pq.read_table(path).to_pylist():
            got.add((r["tenant"], r["seq"], r["body"], r["n"], r["note"], r["_deleted"]))
    assert got == want  # exactly the given-up rows, each as version 2 reads it

    code, out, err = cli(env, "rollback", "drop", MIXED, "--site", "primary")
    assert code == 0 and out.count("dropped ") == 2, out + err
    _code, out, _ = cli(env, "rollback", "list")
    assert out.strip() == "no rollback files"
