"""Copying a segment file between sites, verified: the bytes are hashed as they are written, the copy is
fsynced and renamed into place only if its size and sha256 equal the catalog's, else it never appears.

No row is read: a fast-forward is a byte copy (DESIGN section 6). Between local sites the kernel copies
(``storage.atomic_local_copy``: copy_file_range, then the copy is hashed while it is fsynced); where it cannot
(another file system type, a wrapped file system) the copy goes through the same writer as new segments
(``storage.atomic_local_write_stream``): a background thread hashes and writes while this one reads.

To an object store (local -> S3, S3 -> S3 on one endpoint or across two with other credentials) the bytes are
streamed: read from the source's stream, hashed, written to the target's output stream under the final key
(a multipart upload, completed only by ``close``), with no local copy. Size and sha256 are checked before
the close, so a mismatch is found without downloading the object again. pyarrow has no way to abort an
upload from Python (closing, and even dropping, the stream completes it), so on a mismatch or an error the
stream is closed and the object deleted at once: the catalog never references it; a killed process leaves
an incomplete multipart upload, which is never visible (aborting those is GC's, not built yet).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.fs as pafs

from segrep.core.errors import CorruptSegmentError
from segrep.storage.atomic import FileFacts, HashingFileWriter, atomic_local_copy, atomic_local_write_stream
from segrep.storage.site import Site
from segrep.storage.stores import STORE_ERRORS, first_line

_CHUNK = 4 * 1024 * 1024
# copy_file_range refuses some pairs of files (older kernels across file systems, some file system types)
_UNSUPPORTED = {errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS, errno.EBADF}


class _KernelCopyUnsupported(Exception):
    pass


class StoreAccessError(OSError):
    """A store could not be read or written during a copy; the message names the site and the object."""


def _kernel_copy(source: str, final: str, expected: FileFacts) -> FileFacts:
    try:
        return atomic_local_copy(source, final, expected)
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            raise _KernelCopyUnsupported from exc
        raise


def copy_verified(source: Site, target: Site, relpath: str, byte_size: int, sha256: str) -> FileFacts:
    """Copy ``relpath`` from ``source`` to the same path at ``target`` and return its facts.

    Raises CorruptSegmentError (the receiver's INVALID) if what arrived differs from ``byte_size`` and
    ``sha256``; nothing appears under the final name. OSError (a site that is down) propagates unchanged.
    """
    expected = FileFacts(byte_size, sha256)
    mismatch = (
        f"copy of {relpath} from {source.name} to {target.name} does not match the catalog "
        f"({byte_size} bytes, sha256 {sha256[:12]}...)"
    )

    def _copy(out: HashingFileWriter) -> None:
        with _reading(source, relpath) as src:
            while chunk := _read(src, source, relpath):
                out.write(chunk)

    if target.local:
        try:
            if source.local and type(source.fs) is pafs.LocalFileSystem and hasattr(os, "copy_file_range"):
                with contextlib.suppress(_KernelCopyUnsupported):
                    return _kernel_copy(source.path(relpath), target.path(relpath), expected)
            return atomic_local_write_stream(target.path(relpath), _copy, expected, sync_every=None)
        except CorruptSegmentError:
            raise CorruptSegmentError(mismatch) from None
    return _stream_to_store(source, target, relpath, expected, mismatch)


def _stream_to_store(source: Site, target: Site, relpath: str, expected: FileFacts, mismatch: str) -> FileFacts:
    """Stream ``relpath`` into the target store under its final key, hashing on the way; the upload is
    completed only if size and sha256 equal ``expected`` (see the module docstring for a failed one)."""
    digest, size = hashlib.sha256(), 0
    with _reading(source, relpath) as src:
        final = target.path(relpath)
        try:
            out = target.fs.open_output_stream(final)
        except STORE_ERRORS as exc:
            raise _access_error(target, relpath, "cannot write", exc) from None
        try:
            while chunk := _read(src, source, relpath):
                digest.update(chunk)
                size += len(chunk)
                try:
                    out.write(chunk)
                except STORE_ERRORS as exc:
                    raise _access_error(target, relpath, "cannot write", exc) from None
            facts = FileFacts(size, digest.hexdigest())
            if facts != expected:
                raise CorruptSegmentError(mismatch)
            try:
                out.close()
            except STORE_ERRORS as exc:
                raise _access_error(target, relpath, "cannot complete the upload of", exc) from None
        except BaseException:
            _discard(target, final, out)
            raise
    return facts


@contextlib.contextmanager
def _reading(source: Site, relpath: str) -> Iterator[pa.NativeFile]:
    try:
        src = source.fs.open_input_stream(source.path(relpath))
    except STORE_ERRORS as exc:
        raise _access_error(source, relpath, "cannot read", exc) from None
    with src:
        yield src


def _read(src: pa.NativeFile, source: Site, relpath: str) -> bytes:
    try:
        chunk: bytes = src.read(_CHUNK)
    except STORE_ERRORS as exc:
        raise _access_error(source, relpath, "cannot read", exc) from None
    return chunk


def _discard(target: Site, final: str, out: pa.NativeFile) -> None:
    """Get rid of a failed upload: close the stream (pyarrow offers no abort) and delete what it made."""
    with contextlib.suppress(*STORE_ERRORS):
        out.close()
    with contextlib.suppress(*STORE_ERRORS):
        target.fs.delete_file(final)


def _access_error(site: Site, relpath: str, what: str, exc: BaseException) -> StoreAccessError:
    return StoreAccessError(f"site {site.name}: {what} {site.path(relpath)}: {first_line(exc)}")
