"""Tests of segrep.storage.content: a file's bytes read once into memory, with the catalog's cheapest digest
computed on the way (issue 32)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from segrep.storage import content
from segrep.storage.atomic import CHUNK, hash_local
from segrep.storage.content import ContentSum, ExpectedContent, load_local, load_stream


def test_the_cheapest_recorded_digest_is_the_one_checked() -> None:
    assert ExpectedContent.of("ab" * 32, "cd" * 8) == ExpectedContent(ContentSum.CRC64NVME, "cd" * 8)
    assert ExpectedContent.of("ab" * 32, None) == ExpectedContent(ContentSum.SHA256, "ab" * 32)
    assert ExpectedContent.of("ab" * 32, None).difference("ab" * 32) is None
    assert ExpectedContent.of("ab" * 32, "cd" * 8).difference("00" * 8) == (
        f"its bytes are not the catalog's (crc64nvme {'00' * 8}, the catalog says {'cd' * 8})"
    )


@pytest.mark.parametrize("size", [0, 1, CHUNK, 2 * CHUNK + 7])
def test_a_file_is_loaded_whole_with_the_digests_of_its_bytes(tmp_path: Path, size: int) -> None:
    path = tmp_path / "f"
    data = os.urandom(size)
    path.write_bytes(data)
    facts = hash_local(str(path), fsync=False)
    crc, sha = load_local(str(path), ContentSum.CRC64NVME), load_local(str(path), ContentSum.SHA256)
    assert crc.data.to_pybytes() == sha.data.to_pybytes() == data
    assert (crc.hexdigest, sha.hexdigest) == (facts.crc64nvme, facts.sha256)
    with path.open("rb") as f:
        assert load_stream(f, ContentSum.CRC64NVME).hexdigest == facts.crc64nvme


@pytest.mark.parametrize("stated", [-5, +5])
def test_a_file_that_changes_size_while_read_is_checked_as_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stated: int
) -> None:
    """The buffer and the digest are of the bytes actually read, whatever size the file had when opened."""
    path = tmp_path / "f"
    data = os.urandom(CHUNK + 11)
    path.write_bytes(data)
    real_fstat = os.fstat

    def fstat(fd: int) -> Any:
        st = real_fstat(fd)
        return os.stat_result((*st[:6], st.st_size + stated, *st[7:]))

    monkeypatch.setattr(content.os, "fstat", fstat)
    loaded = load_local(str(path), ContentSum.SHA256)
    assert loaded.data.to_pybytes() == data
    assert loaded.hexdigest == hash_local(str(path), fsync=False).sha256
