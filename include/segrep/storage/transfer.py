"""Copying a segment file between sites, verified: the bytes are hashed as they are written, the copy is
fsynced and renamed into place only if its size and digest equal the catalog's, else it never appears. The
digest is the cheapest the catalog's row allows, CRC-64/NVME where it is recorded, else sha256
(``storage.atomic.check_copy``): each byte of a copy is hashed once, outside the GIL.

No row is read: a fast-forward is a byte copy (DESIGN section 6). Between local sites the kernel copies
(``storage.atomic_local_copy``: copy_file_range, then the copy is hashed while it is fsynced); where it cannot
(another file system type, a wrapped file system) the copy goes through the same writer as new segments
(``storage.atomic_local_write_stream``): a background thread hashes and writes while this one reads.

To an object store the bytes go through ``storage.s3``: within one store (same endpoint and credentials) a
server-side copy, verified by the checksum the store computes; otherwise (local -> S3, S3 -> S3 across
endpoints) streamed: read from the source, uploaded in parts in parallel with a CRC-64/NVME per part that the
store checks, completed only if size and digest equal the catalog's (else aborted). No local copy is made
and the object is not downloaded again. Failures name the site and the object and are classified
(``storage.store_errors``): refused (credentials, permissions, missing bucket) or unreachable.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.fs as pafs

from segrep.core.errors import CorruptSegmentError
from segrep.storage.atomic import FileFacts, HashingFileWriter, atomic_local_copy, atomic_local_write_stream
from segrep.storage.pacing import Pacer
from segrep.storage.s3 import put_verified, same_store, server_side_copy
from segrep.storage.site import Site
from segrep.storage.store_errors import classify_os, file_in_the_way
from segrep.storage.stores import STORE_ERRORS

_CHUNK = 4 * 1024 * 1024
# copy_file_range refuses some pairs of files (older kernels across file systems, some file system types)
_UNSUPPORTED = {errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS, errno.EBADF}


class _KernelCopyUnsupported(Exception):
    pass


def _kernel_copy(source: str, final: str, expected: FileFacts, root: str) -> FileFacts:
    try:
        return atomic_local_copy(source, final, expected, root=root)
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            raise _KernelCopyUnsupported from exc
        raise


def copy_verified(
    source: Site,
    target: Site,
    relpath: str,
    byte_size: int,
    sha256: str,
    crc64nvme: str | None = None,
    pacer: Pacer | None = None,
) -> FileFacts:
    """Copy ``relpath`` from ``source`` to the same path at ``target`` and return its facts.

    Raises CorruptSegmentError (the receiver's INVALID) if what arrived differs from ``byte_size`` and
    ``crc64nvme`` when the catalog has it (``storage.crc64nvme`` says why that suffices), else ``sha256``;
    nothing appears under the final name.
    OSError (a site that is down) propagates unchanged.

    With ``pacer`` (a link's share, ``storage.pacing``), every chunk read from the source is paced, and a local
    copy goes through the stream writer rather than the kernel's copy (which cannot be paced); a server-side
    copy within one store crosses no link and is not paced.
    """
    source.ensure_identified()
    target.ensure_identified()
    expected = FileFacts(byte_size, sha256, crc64nvme)
    mismatch = (
        f"copy of {relpath} from {source.name} to {target.name} does not match the catalog "
        f"({byte_size} bytes, sha256 {sha256[:12]}...{f', crc64nvme {crc64nvme}' if crc64nvme else ''})"
    )

    def _copy(out: HashingFileWriter) -> None:
        with _reading(source, relpath) as src:
            for chunk in _chunks(src, source, relpath, pacer):
                out.write(chunk)

    if target.local:
        try:
            kernel = source.local and type(source.fs) is pafs.LocalFileSystem and hasattr(os, "copy_file_range")
            if kernel and (pacer is None or not pacer.paced):
                with contextlib.suppress(_KernelCopyUnsupported):
                    return _kernel_copy(source.path(relpath), target.path(relpath), expected, target.root)
            return atomic_local_write_stream(target.path(relpath), _copy, expected, sync_every=None, root=target.root)
        except CorruptSegmentError:
            raise CorruptSegmentError(mismatch) from None
        except (NotADirectoryError, FileExistsError) as exc:  # a plain file where a directory must be
            blocked = file_in_the_way(target.name, target.path(relpath), exc)
            if blocked is exc and source.local:
                blocked = file_in_the_way(source.name, source.path(relpath), exc)
            raise blocked from None
    try:
        return _to_store(source, target, relpath, expected, pacer)
    except CorruptSegmentError as exc:
        raise CorruptSegmentError(f"{mismatch}: {exc}") from None


def _to_store(source: Site, target: Site, relpath: str, expected: FileFacts, pacer: Pacer | None) -> FileFacts:
    """Into an S3 target: a server-side copy when one client can read the source and write the target, else
    the source's bytes streamed into a verified upload (``storage.s3.put_verified``)."""
    assert target.s3 is not None
    if source.s3 is not None and same_store(source.s3, target.s3):
        return server_side_copy(source.s3, target.s3, source.path(relpath), target.path(relpath), expected)
    with _reading(source, relpath) as src:
        return put_verified(target.s3, target.path(relpath), _chunks(src, source, relpath, pacer), expected)


def _chunks(src: pa.NativeFile, source: Site, relpath: str, pacer: Pacer | None) -> Iterator[bytes]:
    """The source's bytes, a chunk at a time, each paid for at the pacer's rate once read."""
    while chunk := _read(src, source, relpath, _CHUNK if pacer is None else pacer.chunk_bytes(_CHUNK)):
        if pacer is not None:
            pacer.consume(len(chunk))
        yield chunk


@contextlib.contextmanager
def _reading(source: Site, relpath: str) -> Iterator[pa.NativeFile]:
    try:
        src = source.fs.open_input_stream(source.path(relpath))
    except STORE_ERRORS as exc:
        raise _access_error(source, relpath, "read", exc) from None
    with src:
        yield src


def _read(src: pa.NativeFile, source: Site, relpath: str, size: int) -> bytes:
    try:
        chunk: bytes = src.read(size)
    except STORE_ERRORS as exc:
        raise _access_error(source, relpath, "read", exc) from None
    return chunk


def _access_error(site: Site, relpath: str, what: str, exc: BaseException) -> Exception:
    """The store's failure, naming the site and the object, classified (refused, unreachable, or other)."""
    if site.local and isinstance(exc, OSError):
        blocked = file_in_the_way(site.name, site.path(relpath), exc)
        if blocked is not exc:
            return blocked
    where = site.path(relpath) if site.local else f"s3://{site.path(relpath)}"
    return classify_os(exc, site.name, where, what)
