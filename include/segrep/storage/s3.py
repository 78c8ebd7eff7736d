"""Writing, copying and cleaning up objects on an S3-compatible store, verified by the store (DESIGN 14).

Reads go through ``pyarrow.fs`` (Parquet reads its footers and pages there); writes go through boto3, because
pyarrow's S3 file system offers none of what a verified write needs: no additional checksums, no abort of a
multipart upload, no listing of incomplete uploads, no server-side copy with a checksum in the answer.

What is verified, and by whom:
- every PUT and every part carries its CRC-64/NVME (``ChecksumCRC64NVME``; a multipart upload's checksum type
  is FULL_OBJECT), which the store checks against the bytes it received (a part damaged on the way is
  refused); each part's CRC is computed by the thread that uploads it, and the whole object's is combined
  from the parts' (``Crc64Nvme.extend``), so no byte is hashed twice for it;
- segrep compares the whole with the catalog's before the object is made visible (a single PUT is not sent,
  a multipart upload is aborted instead of completed): by that CRC-64/NVME where the catalog recorded one
  (``atomic.check_copy``; the copy is then hashed once per byte, outside the GIL), else by a sha256 of the
  stream (a segment written before revision 0008, or a new file, whose sha256 the catalog is to record);
- the store's answer for the whole object (its CRC-64/NVME of what it assembled) must equal segrep's, and
  completing the upload with the whole object's CRC has the store check it too: no download of the object;
- a server-side copy (same endpoint, same credentials) is verified by the checksum the store computes of the
  new object: its CRC-64/NVME (S3's own full-object checksum, ``storage.crc64nvme``) against the catalog's,
  or its SHA-256 for a segment whose CRC-64/NVME the catalog does not know (written before revision 0008).
Request bodies are not signed (``payload_signing_enabled`` off): over HTTPS botocore signs none of these
anyway (a checksum header rides along), and over plain HTTP signing would be one more SHA-256 of every byte
sent while the store's answers and every read stay unsigned; a body is checked by its signed checksum header.
Throttled requests (503 SlowDown, 429) are retried and counted inside botocore's request loop, and every
request waits for the site's request rate (``storage.s3_hooks``, ``storage.throttle``).
An object is visible under its final key only once complete (S3 never shows a part-finished upload); a killed
upload is an incomplete multipart upload, which GC aborts (``abort_stale_uploads``) as it deletes orphans.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import botocore.exceptions

from segrep.config.stores import StoreOptions
from segrep.core import faults
from segrep.core.errors import CorruptSegmentError
from segrep.core.settings import bytes_from_env
from segrep.storage import s3_hooks, throttle
from segrep.storage.atomic import FileFacts, check_copy
from segrep.storage.crc64nvme import Crc64Nvme
from segrep.storage.store_errors import StoreRefusedError, StoreUnreachableError, classify_boto

PART_BYTES_ENV = "SEGREP_S3_PART_BYTES"
PART_BYTES = 16 * 1024 * 1024  # a multipart upload's part, and the size up to which one PUT is used
_MIN_PART, _MAX_PART = 5 * 1024 * 1024, 5 * 1024**3  # S3's bounds for a part (but the last)
PARTS_IN_FLIGHT = 4  # parallel part uploads per object; bounds memory at PARTS_IN_FLIGHT + 1 parts
_MAX_POOL = 16
_BOTO_ERRORS = (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)


@dataclass(frozen=True)
class Secrets:
    access_key: str
    secret_key: str
    session_token: str | None = None


@dataclass(frozen=True)
class S3Target:
    """One site's bucket and key prefix on one store, with a boto3 client signed with the site's identity.

    ``identity`` tells two sites apart for server-side copies: same endpoint and same credentials reference
    means one client may read the source and write the target."""

    site: str
    bucket: str
    prefix: str
    client: Any
    identity: tuple[str | None, str | None, str]

    def key(self, path: str) -> str:
        """The object key of a pyarrow-style ``bucket/key`` path under this site."""
        bucket, _, key = path.partition("/")
        if bucket != self.bucket:
            raise ValueError(f"{path} is not in bucket {self.bucket}")
        return key


_clients_lock = threading.Lock()
_clients: dict[tuple[str, StoreOptions, Secrets | None], Any] = {}


def s3_target(site: str, root: str, opts: StoreOptions, secrets: Secrets | None) -> S3Target:
    """The boto3 side of site ``site`` whose pyarrow root is ``bucket/prefix``. Clients are cached per site,
    options and identity: making one costs tens of milliseconds, using one from many threads is safe. Each
    carries the site's request limits (``storage.s3_hooks``)."""
    bucket, _, prefix = root.partition("/")
    cache_key = (site, opts, secrets)
    with _clients_lock:
        client = _clients.get(cache_key)
        if client is None:
            client = _make_client(opts, secrets)
            s3_hooks.install(client, throttle.limits_for(site, opts))
            _clients[cache_key] = client
    ref = opts.credentials.describe() if opts.credentials is not None else "default chain"
    return S3Target(site, bucket, prefix.strip("/"), client, (opts.endpoint, opts.region, ref))


def _make_client(opts: StoreOptions, secrets: Secrets | None) -> Any:
    # Imported here, by the first S3 site a process opens: boto3 costs about 0.15 s to import, which every
    # ``segrep`` command would pay otherwise (this module is on the import path of every site's code).
    import boto3
    import botocore.config

    config = botocore.config.Config(
        # request bodies are not hashed again to sign them (the module's docstring says why)
        s3={"addressing_style": "path" if opts.path_style else "virtual", "payload_signing_enabled": False},
        connect_timeout=opts.connect_timeout_s or 60,
        read_timeout=opts.request_timeout_s or 60,
        # ``retries`` counts the attempts after the first, as pyarrow's retry strategy does (0: one attempt)
        retries={"mode": "standard", "total_max_attempts": (3 if opts.retries is None else opts.retries) + 1},
        max_pool_connections=_MAX_POOL,
        # the checksums are ours (ChecksumCRC64NVME on every PUT and part); botocore adds no second one
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    kwargs: dict[str, Any] = {"config": config}
    if opts.endpoint is not None:
        kwargs["endpoint_url"] = opts.endpoint
    if opts.region is not None:
        kwargs["region_name"] = opts.region
    if secrets is not None:
        kwargs.update(aws_access_key_id=secrets.access_key, aws_secret_access_key=secrets.secret_key)
        if secrets.session_token is not None:
            kwargs["aws_session_token"] = secrets.session_token
    # A session per client: boto3's default session is not safe to share between threads that create clients.
    return boto3.session.Session().client("s3", **kwargs)


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def put_verified(target: S3Target, path: str, chunks: Iterator[bytes], expected: FileFacts | None) -> FileFacts:
    """Store the bytes of ``chunks`` under ``path`` (``bucket/key``), visible only once complete and equal to
    ``expected`` (when given, ``atomic.check_copy``); return their size and digests (for a copy, those
    ``check_copy`` gives).

    Up to PART_BYTES: one PUT. Larger: a multipart upload, PARTS_IN_FLIGHT parts at once, aborted on any
    failure. CorruptSegmentError if the bytes are not ``expected`` (nothing is made visible);
    StoreRefusedError / StoreUnreachableError naming the site and object if the store says no or cannot be
    reached."""
    key = target.key(path)
    # a sha256 of the stream only where the catalog is to record it, or can check nothing cheaper
    reader = _PartReader(chunks, part_bytes(), sha256=expected is None or expected.crc64nvme is None)
    first = reader.next_part()
    if reader.done:
        crc = Crc64Nvme(first)
        facts = _check(reader.facts(crc), expected, target, path)
        answer = _call(
            target,
            path,
            "write",
            target.client.put_object,
            Bucket=target.bucket,
            Key=key,
            Body=first,
            ChecksumCRC64NVME=_b64(crc.digest()),
        )
        _check_store_sum(answer.get("ChecksumCRC64NVME"), _b64(crc.digest()), target, path)
        return facts
    return _multipart(target, path, key, first, reader, expected)


def _multipart(
    target: S3Target, path: str, key: str, first: bytes, reader: _PartReader, expected: FileFacts | None
) -> FileFacts:
    created = _call(
        target,
        path,
        "write",
        target.client.create_multipart_upload,
        Bucket=target.bucket,
        Key=key,
        ChecksumAlgorithm="CRC64NVME",
        ChecksumType="FULL_OBJECT",
    )
    upload_id = created["UploadId"]
    try:
        parts = _upload_parts(target, path, key, upload_id, first, reader)
        whole = Crc64Nvme()
        for part in parts:
            whole.extend(part.crc, part.size)
        facts = _check(reader.facts(whole), expected, target, path)
        faults.point("mid_upload")
        listing = [
            {"PartNumber": n, "ETag": part.etag, "ChecksumCRC64NVME": _b64(part.crc.digest())}
            for n, part in enumerate(parts, 1)
        ]
        answer = _call(
            target,
            path,
            "complete the upload of",
            target.client.complete_multipart_upload,
            Bucket=target.bucket,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={"Parts": listing},
            ChecksumCRC64NVME=_b64(whole.digest()),
            ChecksumType="FULL_OBJECT",
        )
    except BaseException:
        _abort(target, key, upload_id)
        raise
    _check_store_sum(answer.get("ChecksumCRC64NVME"), _b64(whole.digest()), target, path)
    return facts


@dataclass(frozen=True)
class _Part:
    etag: str
    crc: Crc64Nvme  # of the part's bytes, computed by the thread that uploaded it
    size: int


def _upload_parts(
    target: S3Target, path: str, key: str, upload_id: str, first: bytes, reader: _PartReader
) -> list[_Part]:
    """Upload every part (the first already read), PARTS_IN_FLIGHT at a time, each with its CRC-64/NVME."""

    def upload(number: int, body: bytes) -> _Part:
        crc = Crc64Nvme(body)  # here, in the part's own thread (the GIL is released while it hashes)
        answer = _call(
            target,
            path,
            "write",
            target.client.upload_part,
            Bucket=target.bucket,
            Key=key,
            UploadId=upload_id,
            PartNumber=number,
            Body=body,
            ChecksumCRC64NVME=_b64(crc.digest()),
        )
        _check_store_sum(answer.get("ChecksumCRC64NVME"), _b64(crc.digest()), target, path)
        return _Part(str(answer["ETag"]), crc, len(body))

    futures: list[Future[_Part]] = []
    slots = threading.BoundedSemaphore(PARTS_IN_FLIGHT)
    failed = threading.Event()  # a part failed: read no more of the source

    def finished(future: Future[_Part]) -> None:
        if future.exception() is not None:
            failed.set()
        slots.release()

    with ThreadPoolExecutor(max_workers=PARTS_IN_FLIGHT) as pool:
        body: bytes | None = first
        while body and not failed.is_set():
            slots.acquire()
            future = pool.submit(upload, len(futures) + 1, body)
            future.add_done_callback(finished)
            futures.append(future)
            body = None if reader.done else reader.next_part()
        return [f.result() for f in futures]


def part_bytes() -> int:
    """The size of a multipart upload's part: ``$SEGREP_S3_PART_BYTES`` (5 MiB to 5 GiB), else 16 MiB."""
    return bytes_from_env(PART_BYTES_ENV, PART_BYTES, _MIN_PART, _MAX_PART)


class _PartReader:
    """Cuts a stream of chunks into parts of ``size`` bytes, counting them and, if asked, hashing the whole
    by sha256 on the way (the CRC-64/NVME is the parts')."""

    def __init__(self, chunks: Iterator[bytes], size: int, *, sha256: bool) -> None:
        self._chunks = chunks
        self.part_size = size
        self._rest = b""
        self.done = False
        self.size = 0
        self._digest = hashlib.sha256() if sha256 else None

    def next_part(self) -> bytes:
        pieces, have = [self._rest] if self._rest else [], len(self._rest)
        self._rest = b""
        while have < self.part_size:
            chunk = next(self._chunks, b"")
            if not chunk:
                self.done = True
                break
            pieces.append(chunk)
            have += len(chunk)
        data = b"".join(pieces)
        part, self._rest = data[: self.part_size], data[self.part_size :]
        if self._rest:
            self.done = False
        elif not self.done:
            self.done = self._peek_end()
        self.size += len(part)
        if self._digest is not None:
            self._digest.update(part)
        return part

    def facts(self, crc: Crc64Nvme) -> FileFacts:
        """Size and digests of every byte read so far, given their CRC-64/NVME (an empty sha256 if not hashed)."""
        return FileFacts(self.size, self._digest.hexdigest() if self._digest is not None else "", crc.hexdigest())

    def _peek_end(self) -> bool:
        """True if the stream has nothing more (what it had is kept for the next part)."""
        chunk = next(self._chunks, b"")
        self._rest = chunk
        return not chunk


def server_side_copy(source: S3Target, target: S3Target, src_path: str, path: str, expected: FileFacts) -> FileFacts:
    """Copy an object within one store (CopyObject: no byte leaves the store), verified by the checksum the
    store computes of the new object: CRC-64/NVME where the catalog knows the file's (S3's own full-object
    checksum: the store need not hash a SHA-256 for it), else SHA-256. CorruptSegmentError (and the copy
    deleted) if it differs."""
    key = target.key(path)
    algorithm, wanted = (
        ("CRC64NVME", expected.crc64nvme) if expected.crc64nvme is not None else ("SHA256", expected.sha256)
    )
    answer = _call(
        target,
        path,
        "copy to",
        target.client.copy_object,
        Bucket=target.bucket,
        Key=key,
        CopySource={"Bucket": source.bucket, "Key": source.key(src_path)},
        ChecksumAlgorithm=algorithm,
    )
    reported = (answer.get("CopyObjectResult") or {}).get(f"Checksum{algorithm}")
    got = None if reported is None else base64.b64decode(reported).hex()
    if got != wanted:
        delete_quietly(target, path)
        what = "no checksum" if got is None else f"{algorithm.lower()} {got[:16]}"
        raise CorruptSegmentError(
            f"site {target.site}: server-side copy of {src_path} to {path} is not the catalog's file: the store "
            f"reports {what} (expected {wanted[:16]})"
        )
    return expected


def same_store(a: S3Target, b: S3Target) -> bool:
    """Whether one client may copy from ``a`` to ``b`` on the server: same endpoint, region and credentials."""
    return a.identity == b.identity


def delete_quietly(target: S3Target, path: str) -> None:
    with contextlib.suppress(*_BOTO_ERRORS):
        target.client.delete_object(Bucket=target.bucket, Key=target.key(path))


def abort_stale_uploads(target: S3Target, under: str, older_than_us: int, *, dry_run: bool = False) -> list[str]:
    """Abort the incomplete multipart uploads under ``under`` (relative to the site's root) started before
    ``older_than_us``: a killed copy or write leaves them, invisible but costing storage. Returns their
    relative paths (``dry_run``: only lists them)."""
    root = f"{target.prefix}/" if target.prefix else ""
    aborted = []
    paginator = target.client.get_paginator("list_multipart_uploads")
    try:
        for page in paginator.paginate(Bucket=target.bucket, Prefix=f"{root}{under.strip('/')}/"):
            for upload in page.get("Uploads", []):
                if int(upload["Initiated"].timestamp() * 1_000_000) < older_than_us:
                    if not dry_run:
                        _abort(target, upload["Key"], upload["UploadId"])
                    aborted.append(str(upload["Key"])[len(root) :])
    except _BOTO_ERRORS as exc:
        raise classify_boto(exc, target.site, f"s3://{target.bucket}/{root}{under}", "list the uploads under") from None
    return aborted


def _abort(target: S3Target, key: str, upload_id: str) -> None:
    with contextlib.suppress(*_BOTO_ERRORS):  # GC aborts what is left
        target.client.abort_multipart_upload(Bucket=target.bucket, Key=key, UploadId=upload_id)


def _call(target: S3Target, path: str, what: str, fn: Any, **kwargs: Any) -> Any:
    try:
        return fn(**kwargs)
    except _BOTO_ERRORS as exc:
        raise classify_boto(exc, target.site, f"s3://{path}", what) from None


def _check(facts: FileFacts, expected: FileFacts | None, target: S3Target, path: str) -> FileFacts:
    """``facts`` for a new object; for a copy, the catalog's facts if the bytes are its file's."""
    if expected is None:
        return facts
    return check_copy(facts, expected, f"site {target.site}: s3://{path}", "the bytes")


def _check_store_sum(reported: str | None, wanted: str, target: S3Target, path: str) -> None:
    """The store's own CRC-64/NVME of what it received must be ours; a store that reports none checked the
    ChecksumCRC64NVME we sent (S3 refuses a request whose checksum does not match). (A store that suffixes a
    whole object's sum with ``-<parts>``, as S3 does for composite checksums, is compared without it.)"""
    if reported is not None and reported.split("-")[0] != wanted.split("-")[0]:
        raise CorruptSegmentError(
            f"site {target.site}: the store received other bytes for s3://{path} than were sent (its CRC-64/NVME "
            f"{reported}, sent {wanted})"
        )


__all__ = [
    "PART_BYTES",
    "S3Target",
    "Secrets",
    "StoreRefusedError",
    "StoreUnreachableError",
    "abort_stale_uploads",
    "delete_quietly",
    "put_verified",
    "s3_target",
    "same_store",
    "server_side_copy",
]
