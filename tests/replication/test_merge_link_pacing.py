"""A merge's reads across a capped link (issue 36 item 2): with `writes: any_site`, dr's own writes are merged
into the leader at primary, reading dr's segment across dr -> primary. The round holds a round's slot on that
link while the merge runs and each remote input is paid per chunk as it is read, at the share it follows in the
merge's rate file; inputs at the leader's own site, and links not defined, are not paced."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pytest

from segrep.catalog import link_slots as lk
from segrep.catalog.link_lease import LinkLease, LinkPacing
from segrep.core import hlc
from segrep.core.links import CopyPriority
from segrep.data.reader import read_table
from segrep.data.writer import write_batch
from segrep.replication.orchestrator import run_round
from segrep.spark.link_pacing import crossing, paced_merge
from segrep.spark.manifest import Manifest
from segrep.storage.live_rates import read_rate
from segrep.storage.pacing import FollowingPacer
from tests.support.env import Env, env_fixture, sqlite_url
from tests.support.rounds import no_spark

CAP = 32 * 1024
MERGE_LINK_YAML = f"""
data_dir: data
sites:
  primary: {{id: 1, uri: sites/primary}}
  dr: {{id: 2, uri: sites/dr}}
tables:
  ring:
    columns: {{k: int64, v: string}}
    primary_key: [k]
    leader: primary
    replicas: [dr]
    writes: any_site
    policy: {{retry_delay_s: 0, merge_engine: in_process}}
links:
  - from: dr
    to: primary
    max_bytes_per_second: {CAP}
"""


@pytest.fixture
def merge_link_env(tmp_path: Path) -> Iterator[Env]:
    yield from env_fixture(tmp_path, sqlite_url(tmp_path), MERGE_LINK_YAML)


def rows(first: int, n: int) -> pa.Table:
    return pa.table({"k": pa.array(range(first, first + n), pa.int64()), "v": [os.urandom(40).hex() for _ in range(n)]})


def test_a_round_merging_dr_s_writes_reads_them_at_the_link_s_cap(
    merge_link_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = merge_link_env
    write_batch(env.catalog, "ring", rows(0, 200))
    run_round(env.catalog, env.defs, "ring", submit=no_spark)
    local = write_batch(env.catalog, "ring", rows(100, 600), site="dr")  # dr's own: merged at primary
    (seg,) = local.segments
    assert seg.byte_size > CAP  # more than a second at the cap
    taken: list[tuple[str, str, str]] = []
    manifests: list[Manifest] = []
    real_enter = LinkLease.__enter__

    def entering(lease: LinkLease) -> LinkLease:
        taken.append((lease.source, lease.target, str(lease.what)))
        return real_enter(lease)

    @contextmanager
    def spying(path: str, pacing: LinkPacing) -> Iterator[Manifest]:
        with paced_merge(path, pacing) as manifest:
            manifests.append(manifest)
            yield manifest

    paid: list[int] = []
    real_consume = FollowingPacer.consume

    def paying(pacer: FollowingPacer, n: int) -> None:
        paid.append(n)
        real_consume(pacer, n)

    monkeypatch.setattr(LinkLease, "__enter__", entering)
    monkeypatch.setattr(FollowingPacer, "consume", paying)
    monkeypatch.setattr("segrep.replication.run.paced_merge", spying)
    started = time.monotonic()
    report = run_round(env.catalog, env.defs, "ring", submit=no_spark)
    elapsed = time.monotonic() - started
    assert report.merges.committed == 1, str(report)
    assert ("dr", "primary", "round") in taken and all(t[:2] == ("dr", "primary") for t in taken), taken
    assert crossing(manifests[0]) == {("dr", "primary"): 1}
    assert elapsed >= seg.byte_size / CAP * 0.9, (seg.byte_size, elapsed)  # the input paid at its share
    assert sum(paid) == seg.byte_size  # as it was read, by the reader following the link's share
    got = read_table(env.catalog, "ring").sort_by("k")
    assert got["k"].to_pylist() == list(range(700))
    with env.catalog.read() as s:
        assert lk.slots(s, hlc.now_us()) == []  # released after the merge


def test_paced_merge_gives_each_remote_input_its_share_and_leaves_local_ones(merge_link_env: Env) -> None:
    env = merge_link_env
    write_batch(env.catalog, "ring", rows(0, 50))
    run_round(env.catalog, env.defs, "ring", submit=no_spark)
    write_batch(env.catalog, "ring", rows(10, 20), site="dr")
    write_batch(env.catalog, "ring", rows(20, 20), site="dr")
    seen: list[Manifest] = []
    rates_seen: list[tuple[str, int | None]] = []

    @contextmanager
    def keep(path: str, pacing: LinkPacing) -> Iterator[Manifest]:
        with paced_merge(path, pacing) as manifest:
            seen.append(manifest)
            seen.append(Manifest.load(path))  # what the job reads: the file itself was rewritten
            item = manifest.items[0]
            rate_file = next(r.rate_file for r in (*item.visible, *item.incoming) if r.rate_file)
            assert rate_file is not None
            rates_seen.append((rate_file, read_rate(rate_file, "dr", "primary")))
            yield manifest

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("segrep.replication.run.paced_merge", keep)
        run_round(env.catalog, env.defs, "ring", submit=no_spark)
    in_memory, on_disk = seen
    assert in_memory == on_disk
    (item,) = on_disk.items
    remote = [r for r in (*item.visible, *item.incoming) if r.site == "dr"]
    local = [r for r in (*item.visible, *item.incoming) if r.site == "primary"]
    assert len(remote) == 2 and local
    assert {r.bytes_per_s for r in remote} == {CAP // 2}  # the round's whole cap over the link's two inputs
    assert {r.bytes_per_s for r in local} == {None}
    # the readers follow the share in force while they read, in the rate file beside the manifest
    assert {(r.rate_file, r.reader_site) for r in remote} == {(rates_seen[0][0], "primary")}
    assert rates_seen[0][1] == CAP // 2
    assert {(r.rate_file, r.reader_site) for r in local} == {(None, None)}
    assert not Path(rates_seen[0][0]).exists()  # removed with the slots once the merge is done


def test_no_defined_link_takes_no_slot_and_sets_no_share(tmp_path: Path) -> None:
    env = next(env_fixture(tmp_path, sqlite_url(tmp_path), MERGE_LINK_YAML.split("links:")[0]))
    write_batch(env.catalog, "ring", rows(0, 20))
    run_round(env.catalog, env.defs, "ring", submit=no_spark)
    write_batch(env.catalog, "ring", rows(5, 10), site="dr")
    with LinkPacing(env.catalog, CopyPriority.ROUND) as pacing:  # the default: no link anywhere
        assert pacing.pacer("dr", "primary") is None
    report = run_round(env.catalog, env.defs, "ring", submit=no_spark)
    assert report.merges.committed == 1
    with env.catalog.read() as s:
        assert lk.budget(s, lk.Link(2, 1)) is None
    env.catalog.dispose()
