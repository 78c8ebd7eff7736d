"""CRC-64/NVME: the fast checksum of every segment file, and the full-object checksum S3 computes itself.

segrep gives every segment file two digests: sha256, the catalog's identity of the file, and CRC-64/NVME,
about seven times cheaper here (7.6 against 1.0 GB/s per core, computed by the AWS common runtime's
carry-less-multiply code, which releases the GIL for anything over 5 KiB). It checks what sha256 would cost too
much to check:
- a local copy is checked by the CRC-64/NVME of its bytes against the writer's (``atomic.atomic_local_copy``);
- so is a copy streamed into a local file (``atomic.atomic_local_write_stream``) or into an S3 upload
  (``s3.put_verified``: each part carries its CRC-64/NVME, which the store checks, and the whole object's,
  combined from the parts', is compared with the catalog's before the upload is completed);
- a server-side copy on an S3 store is checked by the CRC-64/NVME the store computes of the new object
  (``s3.server_side_copy``): S3's own default full-object checksum, so the store hashes no SHA-256 for it.
A copy is thus hashed once per byte, by its CRC alone, outside the GIL.
Equal 64-bit CRCs of the bytes the writer hashed and of the copy mean the copy is those bytes, sha256 included,
for any corruption not crafted against the checksum (a CRC catches every burst of up to 64 bits, and other
damage with probability 1 - 2^-64).
"""

from __future__ import annotations

from typing import Any

from awscrt import checksums


class Crc64Nvme:
    """An incremental CRC-64/NVME, used like a ``hashlib`` object (``update``, ``hexdigest``)."""

    __slots__ = ("_crc",)

    def __init__(self, data: Any = b"") -> None:
        self._crc = 0
        if len(data):
            self.update(data)

    def update(self, data: Any) -> None:
        """Feed bytes (any buffer: bytes, memoryview, a read-only mmap)."""
        self._crc = checksums.crc64nvme(data, self._crc)

    @property
    def value(self) -> int:
        return self._crc

    def hexdigest(self) -> str:
        """16 hex digits: the big-endian bytes S3 states in base64 as ``ChecksumCRC64NVME``."""
        return f"{self._crc:016x}"

    def digest(self) -> bytes:
        """The 8 big-endian bytes (what S3's ``ChecksumCRC64NVME`` holds, in base64)."""
        return self._crc.to_bytes(8, "big")

    def extend(self, other: Crc64Nvme, other_len: int) -> None:
        """Become the CRC of this object's bytes followed by the ``other_len`` bytes ``other`` hashed: the CRC
        of a whole from those of its parts, in order, without hashing any byte again."""
        self._crc = checksums.combine_crc64nvme(self._crc, other.value, other_len)
