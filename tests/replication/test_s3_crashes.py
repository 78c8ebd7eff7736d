"""Crashes while writing to S3 sites (issue 13), against the two moto servers on loopback.

A ``segrep round`` killed with SIGKILL in the middle of a multipart copy to an S3 replica, and a ``segrep write``
killed in the middle of the multipart upload of its segment to an S3 leader (both stopped at the ``mid_upload``
fault point: every part sent, the upload not completed), leave an incomplete upload and nothing visible; the
next round converges (the dead round's leases lapse; they never back the target off), and ``segrep gc`` (orphan
grace 0) leaves no incomplete upload and no object the catalog does not reference. A site whose endpoint cannot
be reached is one clear line naming it, nothing is written there, and the other target still replicates.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import func, select

from segrep.catalog import models as m
from segrep.core import faults, hlc
from segrep.data.writer import write_batch
from segrep.replication.orchestrator import run_round
from segrep.replication.reports import TargetStatus
from segrep.replication.round import LEASE_TTL_ENV
from segrep.storage import s3
from segrep.storage.identity import MARKER_NAME
from tests.support.checks import assert_replicas_equal_leader, lease_count, segment_rows, sorted_table
from tests.support.cli import cli
from tests.support.env import Env, make_env, sqlite_url
from tests.support.rounds import no_spark
from tests.support.s3 import S3Endpoint, free_port, s3_events_yaml, secrets_of
from tests.support.tables import TABLE

Endpoints = tuple[S3Endpoint, S3Endpoint]
PART = 5 * 1024 * 1024  # the smallest part S3 takes: a segment of ~7 MiB goes up in two parts
BIG_ROWS = 7_000  # rows of 1000 random hex characters: a Parquet segment of ~6.7 MiB
TTL_S = 2.0
HANG_TIMEOUT_S = 120.0  # a process that neither reaches the point nor dies is killed and the test fails


@pytest.fixture(autouse=True)
def _s3_process_env(s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each site's keys in its own variables (no AWS_*), small parts, short leases: for this process and the
    ``segrep`` processes it starts."""
    a, b = s3_endpoints
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", faults.FAULTS_ENV):
        monkeypatch.delenv(var, raising=False)
    for name, value in {**a.env("DR_S3"), **b.env("EDGE_S3")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(s3.PART_BYTES_ENV, str(PART))
    monkeypatch.setenv(LEASE_TTL_ENV, str(TTL_S))


def _yaml(endpoints: Endpoints, prefix: str, *, leader: str = "primary") -> str:
    """The S3 `events` table with orphan grace 0 (GC takes what the catalog does not know at once) and the
    partitions led by ``leader``."""
    text = s3_events_yaml(*endpoints, prefix)
    patched = text.replace("policy: {retry_delay_s: 0}", "policy: {retry_delay_s: 0, orphan_grace_s: 0}")
    if leader != "primary":
        replicas = ", ".join(s for s in ("primary", "dr", "edge") if s != leader)
        patched = patched.replace(
            "leader: primary\n    replicas: [dr, edge]", f"leader: {leader}\n    replicas: [{replicas}]"
        )
    assert patched.count("orphan_grace_s: 0") == 1 and f"leader: {leader}\n" in patched, patched
    return patched


@pytest.fixture
def crash_env(s3_endpoints: Endpoints, tmp_path: Path) -> Iterator[Env]:
    env = make_env(tmp_path, sqlite_url(tmp_path), _yaml(s3_endpoints, uuid.uuid4().hex[:12]))
    yield env
    env.catalog.dispose()


@pytest.fixture
def s3_leader_env(s3_endpoints: Endpoints, tmp_path: Path) -> Iterator[Env]:
    """`events` led by `dr` (endpoint a); `primary` (local) and `edge` (endpoint b) replicate it."""
    env = make_env(tmp_path, sqlite_url(tmp_path), _yaml(s3_endpoints, uuid.uuid4().hex[:12], leader="dr"))
    yield env
    env.catalog.dispose()


# -- data ----------------------------------------------------------------------------------------------------------


def _rows(seqs: range, tenant: str, payload_chars: int, seed: int) -> pa.Table:
    rnd = random.Random(seed)
    return pa.table(
        {
            "tenant": [tenant] * len(seqs),
            "seq": pa.array(list(seqs), pa.int64()),
            "payload": [rnd.randbytes(payload_chars // 2).hex() for _ in seqs],
            "at": pa.array([None] * len(seqs), pa.timestamp("us")),
        }
    )


def _big(seqs: range, seed: int) -> pa.Table:
    """Rows of partition 1 (tenant 'a' < 'm') making one segment larger than a part: a multipart upload."""
    return _rows(seqs, "a", 1000, seed)


def _small(seqs: range, tenant: str, seed: int) -> pa.Table:
    return _rows(seqs, tenant, 20, seed)


# -- what the stores hold ------------------------------------------------------------------------------------------


def _where(env: Env, site: str) -> tuple[str, str]:
    bucket, _, prefix = env.defs.site(site).uri.removeprefix("s3://").partition("/")
    return bucket, prefix


def _objects(e: S3Endpoint, env: Env, site: str) -> set[str]:
    """The objects under the site's root, as relative paths; the empty ``dir/`` markers pyarrow's delete leaves
    (so that the parent "directory" still exists) are not objects of segrep's."""
    bucket, prefix = _where(env, site)
    keys = {k.removeprefix(f"{prefix}/") for k in e.keys(bucket, f"{prefix}/") if not k.endswith("/")}
    return keys - {MARKER_NAME}  # the site's identity marker is not a segment


def _uploads(e: S3Endpoint, env: Env, site: str) -> list[str]:
    """The incomplete multipart uploads under the site's root, as relative paths."""
    bucket, prefix = _where(env, site)
    return sorted(k.removeprefix(f"{prefix}/") for k in e.multipart_uploads(bucket) if k.startswith(f"{prefix}/"))


def _referenced(env: Env, site: str) -> set[str]:
    return {relpath for _p, _s, _h, relpath in segment_rows(env.catalog, site)}


def _assert_nothing_left_behind(env: Env, stores: dict[str, S3Endpoint]) -> None:
    """No incomplete upload, no object the catalog does not reference, no referenced object missing."""
    for site, e in stores.items():
        assert _uploads(e, env, site) == [], f"{site}: incomplete uploads left after gc"
        objects, referenced = _objects(e, env, site), _referenced(env, site)
        assert referenced, f"{site}: the catalog lists no segment there"
        assert objects - referenced == set(), f"{site}: objects the catalog does not reference after gc"
        assert referenced - objects == set(), f"{site}: segments the catalog lists are missing"


def _gc(env: Env) -> str:
    code, out, err = cli(env, "gc", TABLE)
    assert code == 0, (out, err)
    return out


# -- processes stopped at a fault point ----------------------------------------------------------------------------


def _segrep(env: Env, *args: str, point: str) -> subprocess.Popen[str]:
    """A ``segrep`` command in its own process that stops (alive) at the fault point ``point``."""
    segrep = str(Path(sys.executable).with_name("segrep"))
    return subprocess.Popen(
        [segrep, "--config", str(env.config), "--catalog", env.url, *args],
        env={**os.environ, faults.FAULTS_ENV: f"{point}:hang"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_hang(proc: subprocess.Popen[str], point: str) -> None:
    """Block until the process says it stopped at ``point``; fail if it ends (or stalls) before."""
    assert proc.stderr is not None
    watchdog = threading.Timer(HANG_TIMEOUT_S, proc.kill)
    watchdog.start()
    seen: list[str] = []
    try:
        for line in proc.stderr:  # blocks until the point is reached, or EOF when the process dies
            if line.strip() == f"{faults.HANG_MARK}{point}":
                return
            seen.append(line)
    finally:
        watchdog.cancel()
    pytest.fail(f"the process ended (code {proc.wait()}) before reaching {point}: {''.join(seen)[-3000:]}")


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


def _backoffs(env: Env) -> list[tuple[int, int]]:
    with env.catalog.read() as s:
        return [(b.site_id, b.failures) for b in s.scalars(select(m.Backoff))]


def _last_lease_expiry_us(env: Env) -> int | None:
    with env.catalog.read() as s:
        return s.scalar(select(func.max(m.Lease.expires_us)))


# -- 1: a round killed in the middle of a copy to S3 ---------------------------------------------------------------


def test_a_round_killed_mid_upload_to_s3_converges_and_gc_leaves_nothing_behind(
    crash_env: Env, s3_endpoints: Endpoints
) -> None:
    a, b = s3_endpoints
    env, stores = crash_env, {"dr": a, "edge": b}
    write_batch(env.catalog, TABLE, _big(range(BIG_ROWS), seed=1))
    write_batch(env.catalog, TABLE, _small(range(100), "x", seed=2))  # partition 2: one small PUT per target
    ((big_relpath,),) = [[r for p, _s, _h, r in segment_rows(env.catalog, "primary") if p == 1]]

    proc = _segrep(env, "round", TABLE, point="mid_upload")
    try:
        _wait_for_hang(proc, "mid_upload")
        hung = {site: _uploads(e, env, site) for site, e in stores.items()}
    finally:
        _kill(proc)
    # every part went up, the upload was never completed: invisible, and left behind by the dead process
    assert [big_relpath] in hung.values(), hung
    assert all(uploads in ([], [big_relpath]) for uploads in hung.values()), hung
    for site, e in stores.items():
        assert big_relpath not in _objects(e, env, site), f"{site}: an incomplete upload is visible"

    first = run_round(env.catalog, env.defs, TABLE, submit=no_spark)  # the dead round's leases may still hold
    assert {t.status for t in first.targets.values()} <= {TargetStatus.OK, TargetStatus.WAITING}, first
    assert _backoffs(env) == [], "leases of a dead round backed the target off"
    expiry = _last_lease_expiry_us(env)
    if expiry is not None:  # a lease of the killed round's: only its lapse may stand in the next round's way
        assert (expiry - hlc.now_us()) / 1e6 <= TTL_S, "a lease of the dead round outlives its lifetime"
        while hlc.now_us() <= expiry:
            time.sleep(0.1)
    last = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert all(t.status == TargetStatus.OK for t in last.targets.values()), last
    assert _backoffs(env) == [] and lease_count(env.catalog) == 0
    leader = assert_replicas_equal_leader(env.catalog, ("dr", "edge"))
    assert leader.num_rows == BIG_ROWS + 100

    out = _gc(env)
    for site, uploads in hung.items():
        for relpath in uploads:
            assert f"aborted the incomplete upload {site}:{relpath}" in out, out
    _assert_nothing_left_behind(env, stores)
    assert sorted_table(env.catalog, "dr").equals(leader) and sorted_table(env.catalog, "edge").equals(leader)


# -- 2: a write to an S3 leader killed in the middle of its upload -------------------------------------------------


def test_a_write_to_an_s3_leader_killed_mid_upload_leaves_no_trace(
    s3_leader_env: Env, s3_endpoints: Endpoints, tmp_path: Path
) -> None:
    a, b = s3_endpoints
    env, stores = s3_leader_env, {"dr": a, "edge": b}
    write_batch(env.catalog, TABLE, _small(range(50), "b", seed=3))
    write_batch(env.catalog, TABLE, _small(range(50), "y", seed=4))
    assert all(
        t.status == TargetStatus.OK for t in run_round(env.catalog, env.defs, TABLE, submit=no_spark).targets.values()
    )
    before = sorted_table(env.catalog)
    segments_before, objects_before = segment_rows(env.catalog, "dr"), _objects(a, env, "dr")
    assert before.num_rows == 100 and len(segments_before) == 2 == len(objects_before)

    batch = tmp_path / "big.parquet"
    pq.write_table(_big(range(BIG_ROWS), seed=5), batch)
    proc = _segrep(env, "write", TABLE, str(batch), point="mid_upload")
    try:
        _wait_for_hang(proc, "mid_upload")
        hung = _uploads(a, env, "dr")
    finally:
        _kill(proc)
    assert len(hung) == 1 and hung[0].startswith(f"{TABLE}/1/"), hung  # the killed writer's upload, left behind

    # nothing of the killed write is visible: not in the catalog, not at the leader's store, not in a read
    assert segment_rows(env.catalog, "dr") == segments_before
    assert _objects(a, env, "dr") == objects_before
    assert sorted_table(env.catalog).equals(before)

    written = write_batch(env.catalog, TABLE, _big(range(BIG_ROWS, 2 * BIG_ROWS), seed=6))
    assert [(seg.partition_id, seg.site) for seg in written.segments] == [(1, "dr")]
    assert sorted_table(env.catalog).num_rows == 100 + BIG_ROWS

    report = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert all(t.status == TargetStatus.OK for t in report.targets.values()), report
    assert report.targets["edge"].segments_copied == report.targets["primary"].segments_copied == 1
    leader = assert_replicas_equal_leader(env.catalog, ("primary", "edge"))
    assert leader.num_rows == 100 + BIG_ROWS

    out = _gc(env)
    assert f"aborted the incomplete upload dr:{hung[0]}" in out, out
    _assert_nothing_left_behind(env, stores)
    assert sorted_table(env.catalog).equals(leader)


# -- 3: an endpoint that cannot be reached -------------------------------------------------------------------------


def test_an_unreachable_endpoint_is_one_line_naming_the_site_and_the_other_target_replicates(
    crash_env: Env, s3_endpoints: Endpoints
) -> None:
    """`edge`'s endpoint is a closed port on loopback (applied while it answered: apply probes every site)."""
    a, b = s3_endpoints
    env = crash_env
    closed = f"http://127.0.0.1:{free_port()}"
    text = env.config.read_text()
    assert text.count(b.url) == 1
    env.config.write_text(
        text.replace(
            f"endpoint: '{b.url}', region: {b.region}, connect_timeout_s: 2, retries: 1",
            f"endpoint: '{closed}', region: {b.region}, connect_timeout_s: 1, retries: 1",
        )
    )
    assert closed in env.config.read_text()
    write_batch(env.catalog, TABLE, _small(range(100), "a", seed=7))
    write_batch(env.catalog, TABLE, _small(range(100), "x", seed=8))

    segrep = str(Path(sys.executable).with_name("segrep"))
    started = time.monotonic()
    done = subprocess.run(
        [segrep, "--config", str(env.config), "--catalog", env.url, "round", TABLE],
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stdout + done.stderr
    for secret in secrets_of(a, b):
        assert secret not in done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f"segrep: error: round of {TABLE}: target(s) edge failed (re-run to retry)"
    ]
    (edge_line,) = [line for line in done.stdout.splitlines() if line.lstrip().startswith("edge:")]
    assert edge_line.strip().startswith("edge: failed"), edge_line
    endpoint = closed.removeprefix("http://")  # found when its identity marker is read: the store's own words
    assert "site edge: " in edge_line and "unreachable" in edge_line and endpoint in edge_line, edge_line
    assert elapsed < 30, f"an endpoint refusing connections took {elapsed:.1f} s to give up on"

    # nothing written for edge: no segment in its list, no object at its store, no lease left
    assert segment_rows(env.catalog, "edge") == []
    assert _objects(b, env, "edge") == set() and _uploads(b, env, "edge") == []
    assert lease_count(env.catalog) == 0
    # the other target replicated all the same
    assert [line.strip().split(" ")[:2] for line in done.stdout.splitlines() if line.lstrip().startswith("dr:")] == [
        ["dr:", "ok"]
    ]
    assert_replicas_equal_leader(env.catalog, ("dr",))
    assert _objects(a, env, "dr") == _referenced(env, "dr") != set()
