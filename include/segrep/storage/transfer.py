"""Copying a segment file between sites, verified: the bytes are hashed as they are written, the copy is
fsynced and renamed into place only if its size and sha256 equal the catalog's, else it never appears.

No row is read: a fast-forward is a byte copy (DESIGN section 6). Between local sites the kernel copies
(``storage.atomic_local_copy``: copy_file_range, then the copy is hashed while it is fsynced); where it cannot
(another file system type, a wrapped file system) the copy goes through the same writer as new segments
(``storage.atomic_local_write_stream``): a background thread hashes and writes while this one reads.
"""

from __future__ import annotations

import contextlib
import errno
import os

import pyarrow.fs as pafs

from segrep.core.errors import CorruptSegmentError
from segrep.storage.atomic import FileFacts, HashingFileWriter, atomic_local_copy, atomic_local_write_stream
from segrep.storage.site import Site

_CHUNK = 4 * 1024 * 1024
# copy_file_range refuses some pairs of files (older kernels across file systems, some file system types)
_UNSUPPORTED = {errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS, errno.EBADF}


class _KernelCopyUnsupported(Exception):
    pass


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
        with source.fs.open_input_stream(source.path(relpath)) as src:
            while chunk := src.read(_CHUNK):
                out.write(chunk)

    if target.local:
        try:
            if source.local and type(source.fs) is pafs.LocalFileSystem and hasattr(os, "copy_file_range"):
                with contextlib.suppress(_KernelCopyUnsupported):
                    return _kernel_copy(source.path(relpath), target.path(relpath), expected)
            return atomic_local_write_stream(target.path(relpath), _copy, expected, sync_every=None)
        except CorruptSegmentError:
            raise CorruptSegmentError(mismatch) from None
    # object stores and HDFS: the store's own copy, then read back to verify
    target.fs.copy_file(source.path(relpath), target.path(relpath))
    facts = target.facts(relpath)
    if facts != expected:
        target.delete(relpath)
        raise CorruptSegmentError(mismatch)
    return facts
