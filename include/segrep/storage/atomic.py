"""Atomic local files: written to a temporary name beside the final one, hashed, fsynced, renamed.

A file visible under its final name is complete and its sha256 is known before anything references it; on
any error the temporary file is removed and the final name never appears. The directory is fsynced after the
rename so the name survives a crash too (or once for a batch of files, ``batched_directory_syncs``).

Local segment files are hashed as their bytes go out (``HashingFileWriter``), not by reading the file back: see
``atomic_local_write_stream`` for why that verifies as much as a re-read would.

A new file hashed here gets two digests: sha256, the catalog's identity of the file, and CRC-64/NVME, the fast
check (``storage.crc64nvme`` says what it checks and why that suffices). A copy of a segment whose CRC-64/NVME
the catalog knows is hashed once, by that CRC alone, whichever way it is made (``atomic_local_copy``, a copy
streamed through ``atomic_local_write_stream``; ``check_copy`` compares): on two cores a copy's sha256 cost as
much CPU as the rest of a local round, and it is seven times the CRC's.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import mmap
import os
import queue
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from segrep.core import faults
from segrep.core.errors import CorruptSegmentError, SegrepError, SiteUnidentifiedError
from segrep.storage.crc64nvme import Crc64Nvme

CHUNK = 4 * 1024 * 1024
_BATCH = 1024 * 1024  # small writes (Parquet page headers) are gathered up to this size before going out
_SYNC_EVERY = 8 * 1024 * 1024  # start written bytes on their way to disk every this many bytes


@dataclass(frozen=True)
class FileFacts:
    """A file's size and digests. Equality is size and sha256 (the catalog's identity of the file);
    ``crc64nvme`` (hex) rides along where the bytes were hashed here, and is None where it is not known."""

    byte_size: int
    sha256: str
    crc64nvme: str | None = field(default=None, compare=False)


# Directories whose fsync is owed by an open ``batched_directory_syncs`` block (None: sync each one at once)
_owed_dir_syncs: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar("segrep_owed_dir_syncs", default=None)


@contextlib.contextmanager
def batched_directory_syncs() -> Iterator[None]:
    """Within this block, an atomic write or copy that renames its file into place leaves the directory's
    fsync to the end of the block, which syncs each directory once: a batch of N files in one directory
    costs one directory sync instead of N (each one a journal commit to wait for).

    Until the block has exited without error, the new names are not durable, so nothing may reference them
    (no catalog commit) before then; the files' own bytes are fsynced as always. Threads the block's
    caller starts take part if they run in a copy of its context (``contextvars.copy_context``). An error
    from a directory's fsync is raised at the end of the block."""
    owed: set[str] = set()
    token = _owed_dir_syncs.set(owed)
    try:
        yield
    finally:
        _owed_dir_syncs.reset(token)
    for directory in sorted(owed):
        fsync_dir(directory)


def atomic_local_write(final: str, write: Callable[[str], None]) -> FileFacts:
    """Run ``write(tmp_path)``, fsync and hash the result, then rename it to ``final``: readers see the
    complete file or none. Returns the size and sha256 of what is on disk."""
    os.makedirs(os.path.dirname(final) or ".", exist_ok=True)
    tmp = tmp_name(final)
    try:
        write(tmp)
        faults.point("disk_full")
        facts = hash_local(tmp, fsync=True)
        os.rename(tmp, final)
        fsync_dir(os.path.dirname(final) or ".")
    except BaseException:
        remove_quietly(tmp)
        raise
    return facts


def atomic_local_write_stream(
    final: str,
    write: Callable[[HashingFileWriter], None],
    expected: FileFacts | None = None,
    *,
    sync_every: int | None = _SYNC_EVERY,
    root: str | None = None,
) -> FileFacts:
    """Run ``write(stream)`` onto a temporary file beside ``final``, then fsync it, rename it to ``final`` and
    fsync the directory: readers see the complete file or none. Returns the size and digests of the file.

    The sha256 is computed once, from the very bytes handed to write(2) (every one of them: short writes are
    continued), not by reading the file back. After a successful fsync those bytes are what the file holds
    on stable storage; the file's size is checked against the count. A re-read at this point would not check
    anything more: it would be served from the same page cache the bytes were just written into, never from
    the disk, so it cannot see a bad write to the medium either. Corruption after the fact (a flipped bit at
    rest, a truncated or replaced file) is what ``Site.verify`` catches, from the bytes, whenever a file is
    checked against its catalog entry. Any error from write(2), fdatasync or fsync fails the write and
    removes the temporary file, so nothing unverified ever gets the final name. With ``expected`` (a copy of
    a known file), the bytes are hashed by the one digest ``check_copy`` compares (CRC-64/NVME when the
    catalog has it, else sha256), facts that differ raise CorruptSegmentError before the rename, and the
    facts ``check_copy`` gives are returned. With ``root`` (a site's),
    directories are made below it only: a vanished root is never made again (``ensure_dirs_below``, below).
    """
    only_crc = expected is not None and expected.crc64nvme is not None
    with _temporary_beside(final, root) as (tmp, fd):
        with HashingFileWriter(fd, tmp, sync_every=sync_every, sha256=not only_crc) as out:
            write(out)
            facts = out.finish()
        return _publish(tmp, final, facts, expected, "the bytes written")


def atomic_local_copy(source: str, final: str, expected: FileFacts, *, root: str | None = None) -> FileFacts:
    """Copy a local file to ``final`` inside the kernel (copy_file_range: no trip through Python, as cp
    does), then hash the copy's bytes while it is fsynced, and rename it into place only if they equal
    ``expected`` (else CorruptSegmentError and nothing appears): by CRC-64/NVME where ``expected`` has it
    (``storage.crc64nvme`` says why that suffices), else by sha256 (``check_copy``). The hash is of the
    destination file as the kernel holds it, so a bad source and a bad copy are both caught. OSError if the
    kernel cannot copy between these files (the caller falls back to a streamed copy) or a site is
    unreachable."""
    with _temporary_beside(final, root) as (tmp, out):
        with open(source, "rb", buffering=0) as src:
            left = os.fstat(src.fileno()).st_size
            while left > 0:
                n = os.copy_file_range(src.fileno(), out, left)
                if n == 0:  # the source shrank under us: the size check below reports it
                    break
                left -= n
        synced: list[BaseException | None] = []
        flusher = threading.Thread(target=lambda: synced.append(_call(os.fsync, out)), name="segrep-copy-fsync")
        flusher.start()  # write-back runs while this thread hashes the same bytes from the page cache
        try:
            facts = _hash_mapped(tmp, fast=expected.crc64nvme is not None)
        finally:
            flusher.join()
        if synced[0] is not None:
            raise synced[0]
        return _publish(tmp, final, facts, expected, "the copy")


@contextlib.contextmanager
def _temporary_beside(final: str, root: str | None = None) -> Iterator[tuple[str, int]]:
    """A new temporary file beside ``final``, open for writing; removed on any error (``_publish`` renames it).
    Its directory is made if missing: below ``root`` only, when a site root is given."""
    if root is None:
        os.makedirs(os.path.dirname(final) or ".", exist_ok=True)
    else:
        ensure_dirs_below(root, os.path.dirname(final))
    tmp = tmp_name(final)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        faults.point("disk_full")  # where a full disk stops every write: the temporary file is removed
        yield tmp, fd
    except BaseException:
        remove_quietly(tmp)
        raise
    finally:
        os.close(fd)


def check_copy(facts: FileFacts, expected: FileFacts, where: str, what: str = "the copy") -> FileFacts:
    """A copy's facts if they (``facts``, of the bytes it hashed) match the catalog's (``expected``), compared by
    size and the cheapest digest both have: CRC-64/NVME when the catalog recorded one (equal CRCs of the
    writer's bytes and of the copy mean the copy is the bytes the sha256 names: ``storage.crc64nvme``; the
    catalog's facts are returned, sha256 included), else sha256 (the copy's facts are returned, with the CRC
    it computed, if any). CorruptSegmentError, naming ``where`` and ``what``, if they differ."""
    by_crc = expected.crc64nvme is not None and facts.crc64nvme is not None
    if by_crc:
        got, want = f"crc64nvme {facts.crc64nvme}", f"crc64nvme {expected.crc64nvme}"
        same = (facts.byte_size, facts.crc64nvme) == (expected.byte_size, expected.crc64nvme)
    else:
        got, want = f"sha256 {facts.sha256[:12]}...", f"sha256 {expected.sha256[:12]}..."
        same = facts == expected
    if not same:
        raise CorruptSegmentError(
            f"{where}: {what} ({facts.byte_size} bytes, {got}) does not match the catalog "
            f"({expected.byte_size} bytes, {want})"
        )
    return expected if by_crc else facts


def _publish(tmp: str, final: str, facts: FileFacts, expected: FileFacts | None, what: str) -> FileFacts:
    """Give a synced temporary file its final name (then sync the directory), unless it is not what the
    catalog expects: CorruptSegmentError, and the caller's ``_temporary_beside`` removes it. Returns the
    file's facts (the catalog's, for a copy)."""
    if expected is not None:
        facts = check_copy(facts, expected, final, what)
    os.rename(tmp, final)
    directory = os.path.dirname(final) or "."
    owed = _owed_dir_syncs.get()
    if owed is None:
        fsync_dir(directory)
    else:
        owed.add(directory)  # synced once, when the caller's batched_directory_syncs block ends
    return facts


def _call(fn: Callable[..., Any], *args: Any) -> BaseException | None:
    try:
        fn(*args)
    except BaseException as exc:  # handed to the waiting thread
        return exc
    return None


class WriteOnlyStream:
    """The answers pyarrow asks of a write-only Python stream it writes a file to (beside write, tell, close)."""

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False


class HashingFileWriter(WriteOnlyStream):
    """A write-only binary stream onto an open file that hashes every byte exactly once, on its way out: by
    sha256 and CRC-64/NVME (a new file: the catalog records both), or by CRC-64/NVME alone (``sha256=False``:
    a copy of a file whose CRC the catalog knows; ``finish`` then gives an empty sha256).

    ``write`` (called by pyarrow's Parquet writer from the encoding thread) only gathers bytes; a background
    thread hashes them, writes them to the file and, every ``_SYNC_EVERY`` bytes, fdatasyncs so they start
    towards the disk while encoding goes on. Hashing and most of the I/O thus overlap with encoding (on
    another core), and ``finish`` (the closing fsync) only waits for the tail. An error in the background
    thread is raised by the next ``write`` and by ``finish``; the file descriptor stays the caller's.
    """

    def __init__(self, fd: int, name: str = "", *, sync_every: int | None = _SYNC_EVERY, sha256: bool = True) -> None:
        self.name = name
        # While pyarrow encodes, early fdatasyncs overlap the disk with the CPU; a plain copy has no CPU work
        # to overlap, and there one fsync at the end lets the kernel write the file back in one go.
        self._sync_every = sync_every
        self._fd = fd
        self._digest = hashlib.sha256() if sha256 else None
        self._crc = Crc64Nvme()
        self._pending = bytearray()
        self._queued = 0  # bytes accepted by write()
        self._written = 0  # bytes written to the file by the background thread
        self._error: BaseException | None = None
        self._closed = False
        self._facts: FileFacts | None = None
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=64)
        self._thread = threading.Thread(target=self._drain, name="segrep-hash-write", daemon=True)
        self._thread.start()

    # -- the file-like surface pyarrow uses ------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def tell(self) -> int:
        return self._queued

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._closed:
            raise ValueError("write to a closed HashingFileWriter")
        if self._error is not None:
            raise self._error
        n = len(data) if not isinstance(data, memoryview) else data.nbytes
        if n >= _BATCH and not self._pending and isinstance(data, bytes):
            self._queue.put(data)  # bytes are immutable: queued as they are, no copy
        else:
            self._pending += data
            if len(self._pending) >= _BATCH:
                self._queue.put(bytes(self._pending))
                self._pending.clear()
        self._queued += n
        return n

    def flush(self) -> None:
        """Bytes reach the file in the background; ``finish`` is what makes them durable."""

    def close(self) -> None:
        """Stop accepting bytes and wait until every accepted byte is hashed and written (not yet fsynced)."""
        if self._closed:
            return
        self._closed = True
        if self._pending:
            self._queue.put(bytes(self._pending))
            self._pending.clear()
        self._queue.put(None)
        self._thread.join()

    def finish(self) -> FileFacts:
        """Close, fsync the file and return the size and digests of what it holds."""
        if self._facts is None:
            self.close()
            if self._error is not None:
                raise self._error
            os.fsync(self._fd)
            size = os.fstat(self._fd).st_size
            if size != self._written or size != self._queued:
                raise OSError(f"{self.name or 'file'} holds {size} bytes after fsync, {self._queued} were written")
            sha256 = self._digest.hexdigest() if self._digest is not None else ""
            self._facts = FileFacts(size, sha256, self._crc.hexdigest())
        return self._facts

    def __enter__(self) -> HashingFileWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- background thread -----------------------------------------------------------------------------------
    def _drain(self) -> None:
        unsynced = 0
        while (chunk := self._queue.get()) is not None:
            if self._error is not None:
                continue  # keep taking chunks so that write() never blocks on a full queue
            try:
                if self._digest is not None:
                    self._digest.update(chunk)  # releases the GIL for large buffers, as os.write does
                self._crc.update(chunk)  # so does the CRC (awscrt, for more than 5 KiB)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(self._fd, view) :]
                self._written += len(chunk)
                unsynced += len(chunk)
                if self._sync_every is not None and unsynced >= self._sync_every:
                    _fdatasync(self._fd)
                    unsynced = 0
            except BaseException as exc:
                self._error = exc


def _fdatasync(fd: int) -> None:
    (getattr(os, "fdatasync", None) or os.fsync)(fd)


def tmp_name(final: str) -> str:
    head, tail = os.path.split(final)
    return os.path.join(head, f".{tail}.tmp-{secrets.token_hex(4)}")


def hash_local(path: str, *, fsync: bool) -> FileFacts:
    with open(path, "rb", buffering=0) as f:
        facts = hash_stream(f)
        if fsync:
            os.fsync(f.fileno())
    return facts


def hash_stream(f: Any) -> FileFacts:
    """Size, sha256 and CRC-64/NVME of what a binary stream (anything with ``read(n)``) holds from here on."""
    digest, fast = hashlib.sha256(), Crc64Nvme()
    size = 0
    while chunk := f.read(CHUNK):
        digest.update(chunk)
        fast.update(chunk)
        size += len(chunk)
    return FileFacts(size, digest.hexdigest(), fast.hexdigest())


def _hash_mapped(path: str, *, fast: bool = False) -> FileFacts:
    """Size and sha256 of a file hashed through a read-only mapping: the page cache is hashed where it is,
    without first copying it into a buffer (about a tenth less CPU than reading it). ``fast``: its CRC-64/NVME
    only (the sha256 field is then empty: the caller compares the CRC). Only for a temporary file of our
    own: a file truncated under a mapping faults (SIGBUS) instead of raising."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return FileFacts(0, "", Crc64Nvme().hexdigest()) if fast else FileFacts(0, hashlib.sha256().hexdigest())
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as view:
            if fast:
                return FileFacts(size, "", Crc64Nvme(view).hexdigest())
            return FileFacts(size, hashlib.sha256(view).hexdigest())


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def write_json_atomic(path: str | os.PathLike[str], doc: Any) -> None:
    """Write JSON to a temporary name, fsync, rename: readers see the old file or the complete new one."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{secrets.token_hex(4)}")
    try:
        faults.point("disk_full")
        with open(tmp, "w") as f:
            json.dump(doc, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def ensure_dirs_below(root: str, directory: str) -> None:
    """Create ``directory`` and its missing parents up to, never including, the local ``root``: a root that
    vanished (DESIGN 13, ``storage.identity``) is SiteUnidentifiedError here, not silently made again by the
    next write."""
    if os.path.isdir(directory):
        return
    rel = os.path.relpath(directory, root)
    if rel.startswith(".."):
        raise SegrepError(f"{directory} is not under the site root {root}")
    current = root
    for part in [] if rel == "." else rel.split(os.sep):
        current = os.path.join(current, part)
        try:
            os.mkdir(current)
        except FileExistsError:
            continue
        except FileNotFoundError:
            raise SiteUnidentifiedError(
                f"DOWN/UNIDENTIFIED: the site root {root} does not exist (an unmounted volume?): nothing is "
                "created in its place"
            ) from None
    if not os.path.isdir(root):
        raise SiteUnidentifiedError(f"DOWN/UNIDENTIFIED: the site root {root} does not exist: nothing is created")
