"""Verified writes to S3 stores (storage.s3), against the moto servers on loopback.

Parts go up in parallel with a CRC-64/NVME each; the store's answer for the whole object must equal segrep's;
a copy of a segment whose CRC the catalog knows is hashed by that CRC alone, once per byte;
a copy whose bytes are not the catalog's is never completed (the upload is aborted: nothing visible, nothing
left); within one store the copy is server-side; GC's clean-up aborts the incomplete uploads a killed
process leaves, and only those older than the cut-off.
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from segrep.config.stores import CredentialsRef, StoreOptions
from segrep.core import faults, hlc
from segrep.core.errors import CorruptSegmentError, SegrepError
from segrep.storage import s3, transfer
from segrep.storage.crc64nvme import Crc64Nvme
from segrep.storage.pacing import LINK_BURST_S, Pacer
from segrep.storage.site import Site
from segrep.storage.transfer import copy_verified
from tests.support.s3 import BUCKETS, S3Endpoint

Endpoints = tuple[S3Endpoint, S3Endpoint]
REL = "events/1/0123456789abcdef0123456789abcdef.parquet"
PART = 5 * 1024 * 1024


@pytest.fixture(autouse=True)
def _small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(s3.PART_BYTES_ENV, str(PART))
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)


def _site(e: S3Endpoint, name: str, prefix: str, monkeypatch: pytest.MonkeyPatch, bucket: str = BUCKETS[0]) -> Site:
    for var, value in e.env(prefix).items():
        monkeypatch.setenv(var, value)
    opts = StoreOptions(endpoint=e.url, region=e.region, retries=1, credentials=CredentialsRef(env_prefix=prefix))
    return Site(name, f"s3://{bucket}/{uuid.uuid4().hex[:12]}/{name}", opts)


def _local(tmp_path: Path, data: bytes) -> tuple[Site, int, str]:
    site = Site("primary", str(tmp_path / "primary"))
    path = Path(site.path(REL))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return site, len(data), hashlib.sha256(data).hexdigest()


def _objects(e: S3Endpoint, site: Site) -> list[str]:
    bucket, _, prefix = site.root.partition("/")
    return [k for k in e.keys(bucket, prefix) if not k.endswith("/")]


def _uploads(e: S3Endpoint, site: Site) -> list[str]:
    bucket, _, prefix = site.root.partition("/")
    return [k for k in e.multipart_uploads(bucket) if k.startswith(prefix)]


def test_a_large_copy_goes_up_in_verified_parts(
    s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    a, _ = s3_endpoints
    data = os.urandom(3 * PART + 12345)  # four parts, the last short
    source, size, sha = _local(tmp_path, data)
    target = _site(a, "dr", "DR_S3", monkeypatch)
    facts = copy_verified(source, target, REL, size, sha)
    assert (facts.byte_size, facts.sha256) == (size, sha)
    with target.fs.open_input_stream(target.path(REL)) as f:
        assert f.read() == data
    head = a.client().head_object(Bucket=BUCKETS[0], Key=target.s3.key(target.path(REL)), ChecksumMode="ENABLED")  # type: ignore[attr-defined, union-attr]
    # the store kept the whole object's CRC-64/NVME (a full-object checksum of the four parts)
    assert head["ChecksumCRC64NVME"] == base64.b64encode(Crc64Nvme(data).digest()).decode()
    assert _uploads(a, target) == []


def test_a_paced_upload_never_goes_faster_than_its_pacer(
    s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    a, _ = s3_endpoints
    data = os.urandom(PART + 54321)  # two parts
    source, size, sha = _local(tmp_path, data)
    target = _site(a, "dr", "DR_S3", monkeypatch)
    rate = 8 * 1024 * 1024
    pacer = Pacer(rate, burst_s=LINK_BURST_S)  # a link holder's share
    started = time.monotonic()
    facts = copy_verified(source, target, REL, size, sha, pacer=pacer)
    elapsed = time.monotonic() - started
    assert (facts.byte_size, facts.sha256) == (size, sha) and pacer.consumed == size
    assert elapsed >= (size - rate // 4) / rate  # never faster than the share, less a quarter second's burst
    with target.fs.open_input_stream(target.path(REL)) as f:
        assert f.read() == data


@pytest.mark.parametrize("size", [3 * PART + 12345, 1000])  # a multipart upload, a single PUT
def test_a_copy_of_a_segment_whose_crc_is_known_is_hashed_once(
    s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, size: int
) -> None:
    """With the catalog's CRC-64/NVME, no sha256 is computed: the parts' CRCs (which the store checks) combine
    into the whole object's, compared with the catalog's; a wrong one and nothing is visible."""
    a, _ = s3_endpoints
    data = os.urandom(size)
    source, _, sha = _local(tmp_path, data)
    crc = Crc64Nvme(data).hexdigest()
    target = _site(a, "dr", "DR_S3", monkeypatch)
    hashed: list[int] = []
    counting = Crc64Nvme.update

    def count(self: Crc64Nvme, chunk: bytes) -> None:
        hashed.append(len(chunk))
        counting(self, chunk)

    signed: list[str] = []  # what each upload request says of its body's SHA-256 (botocore's signature)

    def note(request: Any, **_: Any) -> None:
        signed.append(request.headers.get("X-Amz-Content-SHA256", b"").decode())

    assert target.s3 is not None
    target.s3.client.meta.events.register("before-send.s3.*", note)
    with monkeypatch.context() as patched:
        patched.setattr(s3.hashlib, "sha256", _no_sha256)
        patched.setattr(Crc64Nvme, "update", count)
        facts = copy_verified(source, target, REL, size, sha, crc)
        assert (facts.byte_size, facts.sha256, facts.crc64nvme) == (size, sha, crc)  # the catalog's facts
        assert sum(hashed) == size  # every byte once
        other = _site(a, "other", "DR_S3", monkeypatch, bucket=BUCKETS[1])
        with pytest.raises(CorruptSegmentError, match=r"does not match the catalog .*crc64nvme 0000000000000000"):
            copy_verified(source, other, REL, size, sha, "0" * 16)
    target.s3.client.meta.events.unregister("before-send.s3.*", note)
    uploads = [v for v in signed if v != "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"]
    assert uploads and set(uploads) == {"UNSIGNED-PAYLOAD"}  # bodies not hashed again to sign them (plain HTTP)
    with target.fs.open_input_stream(target.path(REL)) as f:
        assert f.read() == data
    assert _objects(a, other) == [] and _uploads(a, other) == [] and _uploads(a, target) == []


def _no_sha256(*args: object) -> None:
    raise AssertionError("a copy whose CRC-64/NVME the catalog knows was hashed by sha256")


def test_bytes_that_are_not_the_catalogs_never_become_visible(
    s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    a, _ = s3_endpoints
    source, size, _ = _local(tmp_path, os.urandom(2 * PART + 1))
    target = _site(a, "dr", "DR_S3", monkeypatch)
    with pytest.raises(CorruptSegmentError, match="does not match the catalog"):
        copy_verified(source, target, REL, size, "0" * 64)
    small, small_size, _ = _local(tmp_path / "small", b"y" * 1000)
    with pytest.raises(CorruptSegmentError, match="does not match the catalog"):
        copy_verified(small, target, REL, small_size, "0" * 64)
    assert _objects(a, target) == [] and _uploads(a, target) == []


def test_a_killed_upload_is_left_incomplete_and_gc_aborts_it(
    s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    a, _ = s3_endpoints
    source, size, sha = _local(tmp_path, os.urandom(PART + 10))
    target = _site(a, "dr", "DR_S3", monkeypatch)
    assert target.s3 is not None
    monkeypatch.setenv(faults.FAULTS_ENV, "mid_upload")
    with pytest.raises(faults.InjectedFault):
        copy_verified(source, target, REL, size, sha)
    assert _uploads(a, target) == []  # an error in the process aborts at once
    # a process killed there cannot abort: its upload stays, invisible, until GC
    client = a.client()
    key = target.s3.key(target.path(REL))
    client.create_multipart_upload(Bucket=BUCKETS[0], Key=key)  # type: ignore[attr-defined]
    assert _uploads(a, target) == [key] and _objects(a, target) == []
    started = hlc.now_us()  # (moto reports every upload as started in 2010: the grace is not exercised here)
    assert s3.abort_stale_uploads(target.s3, "other-table", started + 1_000_000) == []  # another table's prefix
    assert s3.abort_stale_uploads(target.s3, "events", started + 1_000_000, dry_run=True) == [REL]
    assert _uploads(a, target) == [key]
    assert s3.abort_stale_uploads(target.s3, "events", started + 1_000_000) == [REL]
    assert _uploads(a, target) == []


def test_within_one_store_the_copy_is_server_side(
    s3_endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    a, b = s3_endpoints
    data = os.urandom(PART + 99)
    local, size, sha = _local(tmp_path, data)
    crc = Crc64Nvme(data).hexdigest()  # (checked against a reference by tests/storage/test_storage.py)
    dr = _site(a, "dr", "DR_S3", monkeypatch)
    copy_verified(local, dr, REL, size, sha)
    other = _site(a, "other", "DR_S3", monkeypatch, bucket=BUCKETS[1])
    assert dr.s3 is not None and other.s3 is not None and s3.same_store(dr.s3, other.s3)

    def no_reading(*args: object) -> None:
        raise AssertionError("a server-side copy read the source through this process")

    with monkeypatch.context() as patched:
        patched.setattr(transfer, "_reading", no_reading)
        copy_verified(dr, other, REL, size, sha)
    with other.fs.open_input_stream(other.path(REL)) as f:
        assert hashlib.sha256(f.read()).hexdigest() == sha
    other.delete(REL)
    with monkeypatch.context() as patched:  # with the catalog's CRC-64/NVME: the store's CRC of the copy is checked
        patched.setattr(transfer, "_reading", no_reading)
        copy_verified(dr, other, REL, size, sha, crc)
        assert other.facts(REL).crc64nvme == crc
        other.delete(REL)
        with pytest.raises(CorruptSegmentError, match=r"site other: server-side copy .* reports crc64nvme"):
            copy_verified(dr, other, REL, size, sha, "0" * 16)  # the right bytes, a wrong CRC in the catalog
    assert _objects(a, other) == []  # the refused copy was deleted
    with pytest.raises(FileNotFoundError, match=r"site other: .* does not exist"):
        copy_verified(dr, other, "events/1/" + "f" * 32 + ".parquet", size, sha)  # no such source
    edge = _site(b, "edge", "EDGE_S3", monkeypatch, bucket=BUCKETS[1])
    assert edge.s3 is not None and not s3.same_store(dr.s3, edge.s3)  # across endpoints: streamed
    copy_verified(dr, edge, REL, size, sha)
    with edge.fs.open_input_stream(edge.path(REL)) as f:
        assert hashlib.sha256(f.read()).hexdigest() == sha


def test_the_part_size_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(s3.PART_BYTES_ENV, "1000")
    with pytest.raises(SegrepError, match=r"SEGREP_S3_PART_BYTES='1000' must be a whole number of bytes from 5242880"):
        s3.part_bytes()
