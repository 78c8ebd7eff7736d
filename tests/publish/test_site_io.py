"""The FileIO through which a local site's Iceberg files are written: atomic, durable, inside the site root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pyiceberg.io import load_file_io

from segrep.core.errors import SiteUnidentifiedError
from segrep.publish.site_catalog import file_io_properties
from segrep.publish.site_io import SiteFileIO, local_io_properties


@pytest.fixture
def root(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    return site


def _entries(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_a_local_site_publishes_through_it(root: Path) -> None:
    io = load_file_io(file_io_properties("primary", str(root)))
    assert isinstance(io, SiteFileIO) and io.root == str(root)


def test_a_file_gets_its_name_only_complete_and_synced(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    io = SiteFileIO(local_io_properties(str(root)))
    final = root / "t" / "_iceberg" / "metadata" / "v1.metadata.json"
    with io.new_output(f"file://{final}").create() as out:
        out.write(b'{"format-version": 2')
        assert not final.exists()  # still under its temporary name
        out.write(b"}")
    assert final.read_bytes() == b'{"format-version": 2}'
    assert _entries(root) == ["t/_iceberg/metadata/v1.metadata.json"]  # no temporary file left
    assert synced[0].startswith(str(final.parent / f".{final.name}.tmp-"))  # the bytes, under the temporary name
    assert synced[1] == str(final.parent)  # then the directory, with the new name in it
    with io.new_input(f"file://{final}").open() as f:
        assert f.read() == b'{"format-version": 2}'
    assert len(io.new_input(str(final))) == len(b'{"format-version": 2}')


def test_an_error_while_writing_leaves_nothing(root: Path) -> None:
    io = SiteFileIO(local_io_properties(str(root)))
    final = root / "t" / "m.avro"
    with pytest.raises(RuntimeError), io.new_output(str(final)).create() as out:
        out.write(b"partial")
        raise RuntimeError("killed")
    assert not final.exists()
    assert _entries(root) == []


def test_a_taken_name_is_not_overwritten(root: Path) -> None:
    io = SiteFileIO(local_io_properties(str(root)))
    final = root / "m.avro"
    final.write_bytes(b"first")
    with pytest.raises(FileExistsError):
        io.new_output(str(final)).create()
    final.unlink()
    out = io.new_output(str(final)).create()  # another writer takes the name while this one writes
    out.write(b"second")
    final.write_bytes(b"taken meanwhile")
    with pytest.raises(FileExistsError):
        out.close()
    assert final.read_bytes() == b"taken meanwhile"
    assert _entries(root) == ["m.avro"]
    with io.new_output(str(final)).create(overwrite=True) as again:
        again.write(b"replaced")
    assert final.read_bytes() == b"replaced"


def test_a_file_system_without_hard_links_gets_a_rename(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_links(src: str, dst: str) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    io = SiteFileIO(local_io_properties(str(root)))
    with io.new_output(str(root / "m.avro")).create() as out:
        out.write(b"bytes")
    assert (root / "m.avro").read_bytes() == b"bytes"
    assert _entries(root) == ["m.avro"]
    with pytest.raises(FileExistsError), io.new_output(str(root / "n.avro")).create() as late:
        late.write(b"late")
        (root / "n.avro").write_bytes(b"taken meanwhile")
    assert (root / "n.avro").read_bytes() == b"taken meanwhile"
    assert _entries(root) == ["m.avro", "n.avro"]


@pytest.mark.parametrize("location", ["file:///etc/passwd", "/tmp/elsewhere.json", "s3://bucket/key", "relative/x"])
def test_a_location_outside_the_site_root_is_refused(root: Path, location: str) -> None:
    io = SiteFileIO(local_io_properties(str(root)))
    with pytest.raises(ValueError, match=r"not under the site root|not a local file"):
        io.new_output(location)
    with pytest.raises(ValueError, match=r"not under the site root|not a local file"):
        io.delete(location)


def test_a_vanished_root_is_not_made_again(root: Path) -> None:
    io = SiteFileIO(local_io_properties(str(root)))
    root.rmdir()
    with pytest.raises(SiteUnidentifiedError, match="does not exist"):
        io.new_output(str(root / "t" / "_iceberg" / "metadata" / "v1.metadata.json")).create()
    assert not root.exists()


def test_delete_removes_and_a_missing_file_is_an_error(root: Path) -> None:
    io = SiteFileIO(local_io_properties(str(root)))
    (root / "gone.avro").write_bytes(b"x")
    io.delete(f"file://{root}/gone.avro")
    assert not (root / "gone.avro").exists()
    with pytest.raises(FileNotFoundError):
        io.delete(f"file://{root}/gone.avro")


def test_it_needs_an_absolute_root() -> None:
    with pytest.raises(ValueError, match="absolute root"):
        SiteFileIO({})
