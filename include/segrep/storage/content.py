"""A segment file's bytes read once into memory, its content checksum computed on the way (DESIGN section 13).

Every read checks that a file holds the very bytes the catalog recorded: a file rewritten with other values
but the same size, footer entry, keys, versions and page checksums passes every other check. The checksum is
the cheapest one the catalog has for the segment: CRC-64/NVME where it is recorded (``storage.crc64nvme``
says why that suffices), else sha256. Each chunk is hashed as soon as it is read, while it is still in the CPU
cache; both digests release the GIL, so files read in parallel threads are hashed in parallel. The caller
parses the Parquet from the returned buffer (``pyarrow.BufferReader``): the file is never read a second time.
"""

from __future__ import annotations

import enum
import hashlib
import os
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from segrep.storage.atomic import CHUNK
from segrep.storage.crc64nvme import Crc64Nvme


class ChunkPace(Protocol):
    """What paces a read chunk by chunk (``storage.pacing.Pacer``): how much to read at a time, and the bytes
    read paid for (it sleeps until they fit its rate)."""

    def chunk_bytes(self, default: int) -> int: ...

    def consume(self, n: int) -> None: ...


class _Digest(Protocol):
    def update(self, data: Any, /) -> None: ...

    def hexdigest(self) -> str: ...


class ContentSum(enum.Enum):
    """Which of the catalog's digests a read checks."""

    CRC64NVME = "crc64nvme"
    SHA256 = "sha256"

    def new(self) -> _Digest:
        return Crc64Nvme() if self is ContentSum.CRC64NVME else hashlib.sha256()


@dataclass(frozen=True)
class ExpectedContent:
    """The digest the catalog recorded for a file's bytes."""

    kind: ContentSum
    hexdigest: str

    @classmethod
    def of(cls, sha256: str, crc64nvme: str | None) -> ExpectedContent:
        """The cheapest check the catalog's row allows: CRC-64/NVME when recorded, else sha256."""
        if crc64nvme is not None:
            return cls(ContentSum.CRC64NVME, crc64nvme)
        return cls(ContentSum.SHA256, sha256)

    def difference(self, got: str) -> str | None:
        """None if ``got`` (a hex digest of the same kind) is the recorded one; else the problem, in words."""
        if got == self.hexdigest:
            return None
        return f"its bytes are not the catalog's ({self.kind.value} {got}, the catalog says {self.hexdigest})"


@dataclass(frozen=True)
class LoadedFile:
    """A file's bytes and their digest (of ``ExpectedContent.kind``)."""

    data: pa.Buffer
    hexdigest: str


def load_local(path: str, kind: ContentSum, pace: ChunkPace | None = None) -> LoadedFile:
    """A local file read into one Arrow buffer of its size (Arrow's allocator: no zeroing, no copy after the
    read), hashed chunk by chunk (each chunk paid to ``pace`` if given, as it is read). FileNotFoundError if it
    is missing; OSError if it cannot be read."""
    digest = kind.new()
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        data = pa.allocate_buffer(size)
        done = 0
        with memoryview(data) as view:
            while done < size and (n := f.readinto(view[done : done + _chunk(pace)])):
                digest.update(view[done : done + n])
                done += n
                if pace is not None:
                    pace.consume(n)
        tail = f.read()  # the file grew under us: the extra bytes are checked too
    if tail:
        digest.update(tail)
        return LoadedFile(pa.py_buffer(data.slice(0, done).to_pybytes() + tail), digest.hexdigest())
    return LoadedFile(data.slice(0, done), digest.hexdigest())  # shorter if it shrank: what was read is checked


def load_stream(stream: Any, kind: ContentSum, pace: ChunkPace | None = None) -> LoadedFile:
    """What a binary stream (anything with ``read(n)``, e.g. ``pyarrow.fs`` input streams) holds from here on,
    in one buffer, hashed chunk by chunk (each chunk paid to ``pace`` if given, as it is read)."""
    digest = kind.new()
    data = bytearray()
    while chunk := stream.read(_chunk(pace)):
        digest.update(chunk)
        data += chunk
        if pace is not None:
            pace.consume(len(chunk))
    return LoadedFile(pa.py_buffer(data), digest.hexdigest())


def load_paced(stream: Any, pace: ChunkPace) -> pa.Buffer:
    """What a binary stream holds from here on, in one buffer, each chunk paid to ``pace`` as it is read (a
    Parquet file read across a link: the parser then reads the buffer, not the link)."""
    data = bytearray()
    while chunk := stream.read(pace.chunk_bytes(CHUNK)):
        data += chunk
        pace.consume(len(chunk))
    return pa.py_buffer(data)


def _chunk(pace: ChunkPace | None) -> int:
    return CHUNK if pace is None else pace.chunk_bytes(CHUNK)
