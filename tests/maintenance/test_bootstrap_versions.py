"""Bootstrap adoption of files written at two schema versions (issue 35 item 3), without Spark.

`mixed` (tests/support/versions.py) holds segments of version 1 and version 2 (payload renamed to body, n
widened, note added with a default) at its leader. `edge`, not a replica yet, already holds copies of those
files (a site restored from a backup, or an earlier copy), and is added to the table's replicas. `segrep
bootstrap --mode adopt` compares them with the leader's rows as version 2 reads them: the version 1 files are
projected first, so they are adopted; a file one row short is refused. After the rounds `edge` reads exactly
the oracle's rows.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow.compute as pc
import pytest

from segrep.catalog.apply import apply_definitions
from segrep.core.errors import RefusedError
from segrep.data.reader import placement_files, read_table
from segrep.maintenance.bootstrap import bootstrap
from segrep.replication.orchestrator import run_round
from segrep.storage.site import Site
from tests.support.checks import catalog_state
from tests.support.cli import cli
from tests.support.env import Env, env_fixture, sqlite_url
from tests.support.rounds import no_spark
from tests.support.versions import MIXED, MIXED_YAML, as_rows, mixed_history


@pytest.fixture
def adopt_versions_env(tmp_path: Path) -> Iterator[Env]:
    yield from env_fixture(tmp_path, sqlite_url(tmp_path), MIXED_YAML)


def plant_leader_files(env: Env, site: str) -> list[str]:
    """Copies of the leader's visible files of every partition at ``site``, byte for byte; their relpaths."""
    _info, placements = placement_files(env.catalog, MIXED)
    rels = [seg.relpath for pf in placements for seg in pf.segments]
    for rel in rels:
        target = env.site_dir(site) / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(env.site_dir("primary") / rel, target)
    return rels


def file_versions(env: Env, rels: list[str]) -> set[int]:
    _info, placements = placement_files(env.catalog, MIXED)
    return {seg.schema_version for pf in placements for seg in pf.segments if seg.relpath in rels}


def test_edge_adopts_files_of_both_versions_and_reads_them_at_the_current_one(adopt_versions_env: Env) -> None:
    env = adopt_versions_env
    oracle = mixed_history(env)
    planted = plant_leader_files(env, "edge")
    assert file_versions(env, planted) == {1, 2}  # version 1 files among them, in both partitions
    env.config.write_text(env.config.read_text().replace("    replicas: [dr]\n", "    replicas: [dr, edge]\n"))
    apply_definitions(env.catalog, env.defs)

    # the oldest version 1 file rewritten without the rows only it holds (seq 4-9: no later write touched them),
    # at version 1 and under its name: the rows differ
    _info, placements = placement_files(env.catalog, MIXED)
    oldest = placements[0].segments[0]
    assert oldest.schema_version == 1
    edge = Site("edge", str(env.site_dir("edge")))
    good = (env.site_dir("edge") / oldest.relpath).read_bytes()
    short = edge.read_segment(oldest.relpath)
    meta = edge.read_meta(oldest.relpath)
    seq = short.column("seq")
    kept = short.filter(pc.or_(pc.less(seq, 4), pc.greater(seq, 9)))
    assert 0 < kept.num_rows < short.num_rows
    edge.write_segment(oldest.relpath, kept, meta)
    before = catalog_state(env)
    with pytest.raises(RefusedError, match="cannot adopt the data at edge: its rows differ"):
        bootstrap(env.catalog, env.defs, MIXED, "edge", "adopt")
    assert catalog_state(env) == before

    (env.site_dir("edge") / oldest.relpath).write_bytes(good)  # the real copy back
    code, out, err = cli(env, "bootstrap", MIXED, "edge", "--mode", "adopt")
    assert code == 0, err
    assert out.count("file(s) equal to the source") == 2, out  # both partitions adopted
    for _ in range(3):
        run_round(env.catalog, env.defs, MIXED, submit=no_spark)
    for site in ("primary", "dr", "edge"):
        assert as_rows(read_table(env.catalog, MIXED, site=site)) == oracle.expected(), site
