"""Copying a segment file between sites, verified: the bytes are hashed as they are written, the copy is
fsynced and renamed into place only if its size and sha256 equal the catalog's, else it never appears.

No row is read: a fast-forward is a byte copy (DESIGN section 6).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import Callable

from segrep.errors import CorruptSegmentError
from segrep.storage import FileFacts, Site

_CHUNK = 8 * 1024 * 1024


def copy_verified(source: Site, target: Site, relpath: str, byte_size: int, sha256: str) -> FileFacts:
    """Copy ``relpath`` from ``source`` to the same path at ``target`` and return its facts.

    Raises CorruptSegmentError (the receiver's INVALID) if what arrived differs from ``byte_size`` and
    ``sha256``; the partial copy is removed. OSError (a site that is down) propagates unchanged.
    """
    expected = FileFacts(byte_size, sha256)

    def _copy(out_path: str) -> FileFacts:
        digest = hashlib.sha256()
        size = 0
        with source.fs.open_input_stream(source.path(relpath)) as src, open(out_path, "wb") as out:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        return FileFacts(size, digest.hexdigest())

    if target.local:
        facts = _atomic_copy(target.path(relpath), _copy, expected)
    else:  # object stores and HDFS: the store's own copy, then read back to verify
        target.fs.copy_file(source.path(relpath), target.path(relpath))
        facts = target.facts(relpath)
        if facts != expected:
            target.delete(relpath)
    if facts != expected:
        raise CorruptSegmentError(
            f"copy of {relpath} from {source.name} to {target.name} does not match the catalog: "
            f"size {facts.byte_size} (expected {byte_size}), sha256 {facts.sha256[:12]}... (expected {sha256[:12]}...)"
        )
    return facts


def _atomic_copy(final: str, copy: Callable[[str], FileFacts], expected: FileFacts) -> FileFacts:
    """Copy to a temporary name beside ``final``; rename into place only if the facts match."""
    directory = os.path.dirname(final) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(final)}.tmp-{secrets.token_hex(4)}")
    try:
        facts = copy(tmp)
        if facts == expected:
            os.rename(tmp, final)
            fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
    return facts
