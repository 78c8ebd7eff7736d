"""Tests of segrep.storage.site (DESIGN section 4), names, hlc and ids.

The storage contract: a file visible under its final name is complete, its FileFacts are the sha256 and size of
the bytes on disk, any later change is caught by verify(), and a failed write leaves nothing behind. Names that
become path components go through a strict allow-list (DESIGN section 10, path traversal).
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from segrep.core import hlc, ids
from segrep.core import schema as sch
from segrep.core.errors import CorruptSegmentError, SegrepError
from segrep.core.names import check_name, check_segment_id
from segrep.storage import atomic, content
from segrep.storage import site as storage
from segrep.storage.atomic import FileFacts
from segrep.storage.crc64nvme import Crc64Nvme
from segrep.storage.segment_meta import ExpectedSegment
from segrep.storage.site import Site, segment_relpath
from tests.support.crc import crc64nvme_reference

SID = "0123456789abcdef0123456789abcdef"
SID2 = "fedcba9876543210fedcba9876543210"
META: dict[str, Any] = {
    "segment_id": SID,
    "base_segment_id": None,
    "included_segment_ids": [],
    "is_major": True,
    "key_range": [1, "2026-01-01"],
}


@pytest.fixture
def site(tmp_path: Path) -> Site:
    return Site("primary", str(_root(tmp_path / "root")))


def _root(path: Path) -> Path:
    """A site root that exists (writes never create one: only apply, bootstrap and `site adopt` do)."""
    path.mkdir(parents=True, exist_ok=True)
    return path


def rows(n: int = 3) -> pa.Table:
    """A small segment: table columns plus the internal ones, in segment_schema order."""
    schema = sch.segment_schema(pa.schema([("id", pa.int64()), ("name", pa.string())]))
    return pa.table(
        {
            "id": list(range(n)),
            "name": [f"n{i}" for i in range(n)],
            "_version": [1_000 + i for i in range(n)],
            "_deleted": [False] * n,
            "_origin": [1] * n,
        },
        schema=schema,
    )


def disk_facts(path: Path) -> FileFacts:
    data = path.read_bytes()
    return FileFacts(len(data), hashlib.sha256(data).hexdigest())


def all_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def dot_files(root: Path) -> list[str]:
    return [p.name for p in root.rglob(".*")]


# --------------------------------------------------------------------------------------------------------------
# Site roots
# --------------------------------------------------------------------------------------------------------------


def test_local_root_is_absolute(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = Site("primary", "rel/root")
    assert s.local
    assert s.root == str((tmp_path / "rel" / "root").resolve())
    assert s.path(segment_relpath("t", 0, SID)) == f"{s.root}/t/0/{SID}.parquet"


def test_file_uri_root(tmp_path: Path) -> None:
    s = Site("dr", f"file://{_root(tmp_path / 'root')}")
    assert s.local
    assert s.root == str((tmp_path / "root").resolve())
    rel = segment_relpath("orders", 7, SID)
    facts = s.write_segment(rel, rows(), META)
    on_disk = tmp_path / "root" / "orders" / "7" / f"{SID}.parquet"
    assert disk_facts(on_disk) == facts
    assert s.read_segment(rel).equals(rows())
    assert s.read_meta(rel) == META


@pytest.mark.parametrize("name", ["", "A", "../x", "a/b", "a.b", "1a", "a" * 64, None])
def test_site_name_is_checked(tmp_path: Path, name: Any) -> None:
    with pytest.raises(SegrepError, match="site name"):
        Site(name, str(tmp_path))


# --------------------------------------------------------------------------------------------------------------
# Writing and reading segments
# --------------------------------------------------------------------------------------------------------------


def test_write_read_round_trip(site: Site, tmp_path: Path) -> None:
    rel = segment_relpath("orders", 0, SID)
    t = rows(5)
    facts = site.write_segment(rel, t, META)
    assert site.exists(rel)
    back = site.read_segment(rel)
    assert back.schema.remove_metadata() == t.schema
    assert back.equals(t)
    assert site.read_segment(rel, columns=["id", "_version"]).to_pydict() == {
        "id": [0, 1, 2, 3, 4],
        "_version": [1000, 1001, 1002, 1003, 1004],
    }
    assert site.read_meta(rel) == META
    # the catalog entry rides in the Parquet footer under segrep.segment
    assert storage.META_KEY in pq.read_metadata(site.path(rel)).metadata
    assert facts == site.facts(rel)


def test_file_facts_are_those_of_the_bytes_on_disk(site: Site, tmp_path: Path) -> None:
    rel = segment_relpath("orders", 3, SID)
    facts = site.write_segment(rel, rows(100), META)
    assert facts == disk_facts(tmp_path / "root" / "orders" / "3" / f"{SID}.parquet")
    assert facts.byte_size > 0
    assert re.fullmatch(r"[0-9a-f]{64}", facts.sha256)


def test_exists_is_false_for_missing_files(site: Site) -> None:
    assert not site.exists(segment_relpath("orders", 0, SID))


def test_verify_passes_on_an_intact_file(site: Site) -> None:
    rel = segment_relpath("orders", 0, SID)
    facts = site.write_segment(rel, rows(), META)
    site.verify(rel, facts.byte_size, facts.sha256)


@pytest.mark.parametrize("offset", [0, 100, -1])
def test_verify_catches_a_flipped_byte(site: Site, offset: int) -> None:
    rel = segment_relpath("orders", 0, SID)
    facts = site.write_segment(rel, rows(), META)
    path = Path(site.path(rel))
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    assert path.stat().st_size == facts.byte_size  # same size: only the hash can tell
    with pytest.raises(CorruptSegmentError) as info:
        site.verify(rel, facts.byte_size, facts.sha256)
    assert site.path(rel) in str(info.value)


def test_verify_catches_truncation(site: Site) -> None:
    rel = segment_relpath("orders", 0, SID)
    facts = site.write_segment(rel, rows(), META)
    path = Path(site.path(rel))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CorruptSegmentError) as info:
        site.verify(rel, facts.byte_size, facts.sha256)
    assert site.path(rel) in str(info.value)
    assert str(facts.byte_size) in str(info.value)


def test_verify_catches_a_missing_file(site: Site) -> None:
    rel = segment_relpath("orders", 0, SID)
    facts = site.write_segment(rel, rows(), META)
    os.remove(site.path(rel))
    with pytest.raises(CorruptSegmentError, match="missing") as info:
        site.verify(rel, facts.byte_size, facts.sha256)
    assert site.path(rel) in str(info.value)


def test_verify_catches_a_wrong_recorded_hash(site: Site) -> None:
    rel = segment_relpath("orders", 0, SID)
    facts = site.write_segment(rel, rows(), META)
    with pytest.raises(CorruptSegmentError):
        site.verify(rel, facts.byte_size, "0" * 64)
    with pytest.raises(CorruptSegmentError):
        site.verify(rel, facts.byte_size + 1, facts.sha256)


def test_no_temporary_file_remains_after_a_write(site: Site, tmp_path: Path) -> None:
    for i, sid in enumerate((SID, SID2)):
        site.write_segment(segment_relpath("orders", i % 2, sid), rows(), META)
    root = tmp_path / "root"
    assert dot_files(root) == []
    assert all_files(root) == [f"orders/0/{SID}.parquet", f"orders/1/{SID2}.parquet"]


def test_failed_write_leaves_nothing_behind(site: Site, tmp_path: Path, monkeypatch) -> None:
    """A crash mid-write must leave neither a partial file under the final name nor a temporary file."""
    rel_ok = segment_relpath("orders", 0, SID2)
    kept = site.write_segment(rel_ok, rows(), META)
    seen: list[str] = []

    def partial_then_fail(table: pa.Table, where: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(where.name)  # a stream onto the temporary file (hashed as it is written)
        where.write(b"PAR1 partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(storage.pq, "write_table", partial_then_fail)
    rel = segment_relpath("orders", 0, SID)
    with pytest.raises(OSError, match="No space left"):
        site.write_segment(rel, rows(), META)
    monkeypatch.undo()

    assert len(seen) == 1
    tmp_name = os.path.basename(seen[0])
    assert tmp_name.startswith(".") and seen[0] != site.path(rel)  # it did write to a temporary name
    assert os.path.dirname(seen[0]) == os.path.dirname(site.path(rel))  # in the same directory (atomic rename)
    assert not site.exists(rel)
    assert not os.path.exists(site.path(rel))
    assert dot_files(tmp_path / "root") == []
    site.verify(rel_ok, kept.byte_size, kept.sha256)  # a neighbour is untouched


def test_atomic_local_write_removes_tmp_on_failure(tmp_path: Path) -> None:
    final = str(tmp_path / "d" / "f.bin")

    def boom(path: str) -> None:
        Path(path).write_bytes(b"half")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        atomic.atomic_local_write(final, boom)
    assert os.listdir(tmp_path / "d") == []


def test_atomic_local_write_returns_facts(tmp_path: Path) -> None:
    final = tmp_path / "d" / "f.bin"
    facts = atomic.atomic_local_write(str(final), lambda p: Path(p).write_bytes(b"hello"))
    assert facts == FileFacts(5, hashlib.sha256(b"hello").hexdigest())
    assert final.read_bytes() == b"hello"


def test_delete_is_idempotent(site: Site) -> None:
    rel = segment_relpath("orders", 0, SID)
    site.write_segment(rel, rows(), META)
    site.delete(rel)
    site.delete(rel)
    assert not site.exists(rel)


def _expected(facts: FileFacts, n: int = 3, **changes: Any) -> ExpectedSegment:
    """What a catalog would record for ``rows(n)`` written as orders segment SID with ENTRY."""
    doc = dict(
        ENTRY,
        byte_size=facts.byte_size,
        schema=sch.segment_schema(pa.schema([("id", pa.int64()), ("name", pa.string())])),
        sha256=facts.sha256,
        crc64nvme=facts.crc64nvme,
    )
    doc |= {"row_count": n, "max_version": 1_000 + n - 1, "key_max": [n - 1]}
    return ExpectedSegment(**(doc | changes))


ENTRY: dict[str, Any] = {
    "segment_id": SID,
    "table": "orders",
    "partition_id": 0,
    "row_count": 3,
    "deleted_rows": 0,
    "min_version": 1_000,
    "max_version": 1_002,
    "key_min": [0],
    "key_max": [2],
}


def test_segments_are_written_with_page_checksums(site: Site) -> None:
    """A flipped bit in the name column's pages that a plain read serves as a changed value (the first such
    bit, searched for): read_segment refuses the page."""
    rel = segment_relpath("orders", 0, SID)
    site.write_segment(rel, rows(50), META)
    path = Path(site.path(rel))
    original = path.read_bytes()
    chunk = pq.read_metadata(path).row_group(0).column(1)
    assert chunk.path_in_schema == "name"
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    for offset in range(start, start + chunk.total_compressed_size):
        data = bytearray(original)
        data[offset] ^= 0x01
        path.write_bytes(bytes(data))
        try:
            silently_changed = pq.read_table(path).column("name").to_pylist() != rows(50).column("name").to_pylist()
        except (OSError, pa.ArrowException):
            continue
        if silently_changed:
            break
    else:
        pytest.fail("no single flipped bit changed a name without an error")
    with pytest.raises(OSError, match="CRC"):
        site.read_segment(rel)


def test_read_checked_accepts_the_segment_the_catalog_names(site: Site) -> None:
    rel = segment_relpath("orders", 0, SID)
    facts = site.write_segment(rel, rows(), META | ENTRY)
    expected = _expected(facts)
    assert site.check_footer(rel, expected).num_rows == 3
    assert site.read_checked(rel, expected, ["id"]).equals(
        rows().replace_schema_metadata(site.read_segment(rel).schema.metadata)
    )


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"segment_id": SID2}, f"its footer says it is segment {SID} of orders partition 0"),
        ({"partition_id": 1}, "partition 0, not segment"),
        ({"table": "events"}, "of orders partition 0, not"),
        ({"byte_size": 1}, "(the catalog says 1)"),
        ({"row_count": 4}, "3 rows (the catalog says 4)"),
        ({"max_version": 5}, "its footer's max_version is 1002 (the catalog says 5)"),
        ({"key_min": [-1]}, "its footer's key_min is [0] (the catalog says [-1])"),
        ({"schema": sch.segment_schema(pa.schema([("id", pa.int32()), ("name", pa.string())]))}, "column id int64"),
    ],
)
def test_check_footer_names_what_differs(site: Site, change: dict[str, Any], needle: str) -> None:
    rel = segment_relpath("orders", 0, SID)
    facts = site.write_segment(rel, rows(), META | ENTRY)
    with pytest.raises(CorruptSegmentError) as info:
        site.check_footer(rel, _expected(facts, **change))
    message = str(info.value)
    assert message.startswith(f"site primary: segment file {site.path(rel)} is not segment ")
    assert needle in message


def test_read_checked_reads_the_file_once(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    """The content checksum is computed from the bytes the rows are parsed from: once they are in memory the
    file is never opened again (it is gone here), and nothing but ``load_local`` reads it."""
    rel = segment_relpath("orders", 0, SID)
    facts = site.write_segment(rel, rows(), META | ENTRY)
    loads: list[str] = []

    def load_then_delete(path: str, kind: Any, pace: Any = None) -> Any:
        loaded = content.load_local(path, kind, pace)
        loads.append(path)
        os.remove(path)
        return loaded

    monkeypatch.setattr(storage, "load_local", load_then_delete)
    assert site.read_checked(rel, _expected(facts), ["id"]).num_rows == 3
    assert loads == [site.path(rel)]


@pytest.mark.parametrize("recorded", ["crc64nvme", "sha256"])
def test_read_checked_refuses_bytes_that_are_not_the_catalogs(site: Site, recorded: str) -> None:
    """A file whose every other check passes (here: the catalog's digest of another file's bytes) is refused,
    by CRC-64/NVME where the catalog has it, else by sha256."""
    rel = segment_relpath("orders", 0, SID)
    facts = site.write_segment(rel, rows(), META | ENTRY)
    other = FileFacts(facts.byte_size, "ab" * 32, "cd" * 8)
    crc = other.crc64nvme if recorded == "crc64nvme" else None
    expected = _expected(facts, sha256=other.sha256, crc64nvme=crc)
    site.check_footer(rel, expected)
    with pytest.raises(CorruptSegmentError) as caught:
        site.read_checked(rel, expected, ["id"])
    got = facts.crc64nvme if recorded == "crc64nvme" else facts.sha256
    want = crc if recorded == "crc64nvme" else other.sha256
    assert str(caught.value) == (
        f"site primary: segment file {site.path(rel)} is not segment {SID} of orders partition 0 as the catalog "
        f"records it: its bytes are not the catalog's ({recorded} {got}, the catalog says {want})"
    )


def test_read_checked_compares_the_rows_read(site: Site) -> None:
    """A file whose footer agrees but whose rows do not (written with a footer entry that lies)."""
    rel = segment_relpath("orders", 0, SID)
    facts = site.write_segment(rel, rows(), META | ENTRY | {"key_max": [7], "max_version": 1_009})
    expected = _expected(facts, key_max=[7], max_version=1_009)
    site.check_footer(rel, expected)
    with pytest.raises(CorruptSegmentError, match=r"keys \[0\]..\[2\] read .*versions 1000..1002 read"):
        site.read_checked(rel, expected, ["id"])


def test_check_footer_of_a_missing_or_unreadable_file(site: Site) -> None:
    rel = segment_relpath("orders", 0, SID)
    facts = site.write_segment(rel, rows(), META | ENTRY)
    path = Path(site.path(rel))
    path.write_bytes(path.read_bytes()[:-12])
    with pytest.raises(CorruptSegmentError, match="footer cannot be read"):
        site.check_footer(rel, _expected(facts))
    path.unlink()
    with pytest.raises(CorruptSegmentError, match=f"{path} .*is missing"):
        site.check_footer(rel, _expected(facts))


def test_read_meta_refuses_a_plain_parquet_file(site: Site, tmp_path: Path) -> None:
    rel = segment_relpath("orders", 0, SID)
    path = Path(site.path(rel))
    path.parent.mkdir(parents=True)
    pq.write_table(rows(), path)
    with pytest.raises(CorruptSegmentError) as info:
        site.read_meta(rel)
    assert str(path) in str(info.value)
    assert "segrep.segment" in str(info.value)


def test_list_segment_files(site: Site, tmp_path: Path) -> None:
    """Only '<table>/<partition>/<segment>.parquet', sorted; temp files and anything else are not segments."""
    expected = sorted(
        [
            segment_relpath("orders", 1, SID2),
            segment_relpath("orders", 0, SID),
            segment_relpath("lineitem", 12, SID),
            segment_relpath("orders", 10, SID),
        ]
    )
    for rel in reversed(expected):
        site.write_segment(rel, rows(1), META)
    root = tmp_path / "root"
    noise = [
        f"orders/0/.{SID2}.parquet.tmp-0a1b2c3d",  # an interrupted write
        f"orders/0/.{SID2}.parquet",  # hidden, even with the right suffix
        "orders/0/readme.txt",
        f"orders/0/{SID2}.parquet.bak",
        f"orders/{SID2}.parquet",  # too shallow
        f"orders/0/sub/{SID2}.parquet",  # too deep
        f"{SID2}.parquet",
    ]
    for rel in noise:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x")
    assert list(site.list_segment_files()) == expected


def test_list_segment_files_ignores_parquet_files_with_non_segment_names(site: Site, tmp_path: Path) -> None:
    """A stray Parquet file whose path is not a valid table/partition/segment id is not a segment: listing it
    makes catalog rebuild refuse the whole site (or crash reading a non-Parquet footer)."""
    rel = segment_relpath("orders", 0, SID)
    site.write_segment(rel, rows(1), META)
    root = tmp_path / "root"
    for stray in ["orders/0/notes.parquet", f"Orders/0/{SID2}.parquet", f"orders/x/{SID2}.parquet"]:
        (root / stray).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(rows(1), root / stray)
    assert list(site.list_segment_files()) == [rel]


def test_list_segment_files_on_a_missing_root(tmp_path: Path) -> None:
    assert list(Site("dr", str(tmp_path / "nothing_here")).list_segment_files()) == []


# --------------------------------------------------------------------------------------------------------------
# Paths and names
# --------------------------------------------------------------------------------------------------------------


def test_segment_relpath() -> None:
    assert segment_relpath("orders", 0, SID) == f"orders/0/{SID}.parquet"
    assert segment_relpath("a" * 63, 2**40, SID2) == f"{'a' * 63}/{2**40}/{SID2}.parquet"


@pytest.mark.parametrize("table", ["../x", "A", "a/b", "a.b", "", "..", "1a", "a" * 64, None, "orders\n"])
def test_segment_relpath_refuses_invalid_table_names(table: Any) -> None:
    with pytest.raises(SegrepError, match="table name"):
        segment_relpath(table, 0, SID)


@pytest.mark.parametrize("partition_id", [-1, -(2**40), "1", 1.0, None, True])
def test_segment_relpath_refuses_bad_partition_ids(partition_id: Any) -> None:
    """True is an int to Python, but 'orders/True/...' is not a partition directory."""
    with pytest.raises(SegrepError, match="partition id"):
        segment_relpath("orders", partition_id, SID)


@pytest.mark.parametrize(
    "segment_id",
    [SID.upper(), SID[:-1], SID + "0", "g" * 32, "../" + SID[3:], f"{SID[:16]}/{SID[17:]}", "", None, SID + "\n"],
)
def test_segment_relpath_refuses_malformed_segment_ids(segment_id: Any) -> None:
    with pytest.raises(SegrepError, match="segment id"):
        segment_relpath("orders", 0, segment_id)


@pytest.mark.parametrize("name", ["a", "orders", "o_orderkey", "a_1", "x9", "a" * 63, "a__"])
def test_check_name_accepts(name: str) -> None:
    assert check_name("table", name) == name


@pytest.mark.parametrize(
    "name",
    ["", "A", "Orders", "1a", "_a", "a-b", "a.b", "a/b", "../etc", "a b", "é", "a" * 64, None, 5, b"a", "orders\n"],
)
def test_check_name_refuses(name: Any) -> None:
    with pytest.raises(SegrepError) as info:
        check_name("column", name)
    assert "invalid column name" in str(info.value)
    assert repr(name) in str(info.value)


@pytest.mark.parametrize("segment_id", [SID, SID2, "0" * 32, "f" * 32])
def test_check_segment_id_accepts(segment_id: str) -> None:
    assert check_segment_id(segment_id) == segment_id


@pytest.mark.parametrize("segment_id", [SID.upper(), SID[:-1], SID + "a", "x" * 32, "", None, 1, SID + "\n"])
def test_check_segment_id_refuses(segment_id: Any) -> None:
    with pytest.raises(SegrepError, match="invalid segment id"):
        check_segment_id(segment_id)


# --------------------------------------------------------------------------------------------------------------
# Hybrid logical clock and segment ids
# --------------------------------------------------------------------------------------------------------------

BIG = st.integers(0, 2**62)


@given(last=BIG, now=BIG)
def test_next_version_with_explicit_now(last: int, now: int) -> None:
    v = hlc.next_version(last, now)
    assert v > last
    assert v >= now
    assert v == max(now, last + 1)


@given(nows=st.lists(BIG, min_size=1, max_size=50), start=BIG)
def test_next_version_is_strictly_increasing_even_when_the_clock_goes_back(nows: list[int], start: int) -> None:
    last = start
    for now in nows:
        v = hlc.next_version(last, now)
        assert v > last and v >= now
        last = v


@given(start=st.integers(0, 2**40) | st.integers(hlc.now_us(), hlc.now_us() + 10**6))
def test_next_version_follows_wall_time(start: int) -> None:
    last = start
    for _ in range(20):
        before = hlc.now_us()
        v = hlc.next_version(last)
        assert v > last
        assert v >= before
        last = v


def test_new_segment_id_format_and_uniqueness() -> None:
    pattern = re.compile(r"^[0-9a-f]{32}\Z")
    before_ms = int(time.time() * 1000)
    made = [ids.new_segment_id() for _ in range(10_000)]
    after_ms = int(time.time() * 1000)
    assert len(set(made)) == len(made)
    for sid in made:
        assert pattern.match(sid), sid
        assert check_segment_id(sid) == sid
    # time-ordered: the first 48 bits are the creation time in milliseconds
    assert before_ms <= int(made[0][:12], 16) <= int(made[-1][:12], 16) <= after_ms


# --------------------------------------------------------------------------------------------------------------
# Hashing as the bytes are written (no re-read)
# --------------------------------------------------------------------------------------------------------------


def big_rows(n: int) -> pa.Table:
    """Rows whose file is several times _SYNC_EVERY, so the batching and early fdatasync paths all run."""
    schema = sch.segment_schema(pa.schema([("id", pa.int64()), ("name", pa.string())]))
    noise = os.urandom(n * 8).hex()
    return pa.table(
        {
            "id": list(range(n)),
            "name": [noise[i * 16 : i * 16 + 16] for i in range(n)],
            "_version": [7] * n,
            "_deleted": [False] * n,
            "_origin": [1] * n,
        },
        schema=schema,
    )


def test_facts_of_a_large_segment_are_those_on_disk(site: Site, monkeypatch) -> None:
    syncs: list[int] = []
    real = atomic._fdatasync
    monkeypatch.setattr(atomic, "_fdatasync", lambda fd: (syncs.append(fd), real(fd)))
    rel = segment_relpath("orders", 0, SID)
    t = big_rows(1_500_000)
    facts = site.write_segment(rel, t, META)
    assert facts.byte_size > 3 * atomic._SYNC_EVERY
    assert facts == disk_facts(Path(site.path(rel)))
    assert len(syncs) >= 3  # bytes were started towards the disk while encoding went on
    assert site.read_segment(rel).equals(t)
    assert dot_files(Path(site.root)) == []


@given(sizes=st.lists(st.integers(0, 3 * 1024 * 1024), max_size=12), kinds=st.lists(st.sampled_from("bym")))
def test_hashing_writer_hashes_exactly_the_bytes_written(tmp_path_factory, sizes: list[int], kinds: list[str]) -> None:
    """Any mix of small and large writes, as bytes, bytearray or memoryview: the file holds them in order and
    the facts are theirs."""
    final = str(tmp_path_factory.mktemp("hw") / "f.bin")
    chunks = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    wrap = {"b": bytes, "y": bytearray, "m": memoryview}

    def write(out: atomic.HashingFileWriter) -> None:
        for i, chunk in enumerate(chunks):
            assert out.write(wrap[kinds[i % len(kinds)] if kinds else "b"](chunk)) == len(chunk)
        assert out.tell() == sum(sizes)

    facts = atomic.atomic_local_write_stream(final, write)
    data = b"".join(chunks)
    assert facts == FileFacts(len(data), hashlib.sha256(data).hexdigest())
    assert Path(final).read_bytes() == data


def test_a_failed_background_write_fails_the_segment_and_leaves_nothing(site: Site, monkeypatch) -> None:
    """ENOSPC in the thread that writes the bytes out reaches the caller; neither the final name nor the
    temporary file remains, and the writer never blocks on its queue."""
    real_write = os.write
    calls = {"n": 0}

    def failing_write(fd: int, data: Any) -> int:
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(storage.os, "write", failing_write)
    rel = segment_relpath("orders", 0, SID)
    with pytest.raises(OSError, match="No space left"):
        site.write_segment(rel, big_rows(600_000), META)
    monkeypatch.undo()
    assert not os.path.exists(site.path(rel))
    assert dot_files(Path(site.root)) == []


def test_a_failed_write_after_many_chunks_never_deadlocks(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(storage.os, "write", lambda fd, data: (_ for _ in ()).throw(OSError(5, "I/O error")))
    final = str(tmp_path / "f.bin")

    def write(out: atomic.HashingFileWriter) -> None:
        for _ in range(500):  # far more chunks than the queue holds
            out.write(b"x" * atomic._BATCH)

    with pytest.raises(OSError, match="I/O error"):
        atomic.atomic_local_write_stream(final, write)
    assert os.listdir(tmp_path) == []


def test_a_failed_fsync_fails_the_write(tmp_path: Path, monkeypatch) -> None:
    def no_fsync(fd: int) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(storage.os, "fsync", no_fsync)
    final = str(tmp_path / "d" / "f.bin")
    with pytest.raises(OSError, match="I/O error"):
        atomic.atomic_local_write_stream(final, lambda out: out.write(b"hello"))
    assert os.listdir(tmp_path / "d") == []


def test_hashing_writer_refuses_a_file_changed_behind_its_back(tmp_path: Path) -> None:
    """The size on disk after fsync must be the count of bytes hashed: anything else is not our file."""
    final = str(tmp_path / "f.bin")

    def write(out: atomic.HashingFileWriter) -> None:
        out.write(b"hello")
        with open(out.name, "ab") as other:  # someone appends to the temporary file
            other.write(b"0123456789")  # more bytes than ours, wherever ours land

    with pytest.raises(OSError, match="after fsync"):
        atomic.atomic_local_write_stream(final, write)
    assert os.listdir(tmp_path) == []


def test_hashing_writer_refuses_writes_after_close(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f.bin", os.O_WRONLY | os.O_CREAT)
    try:
        out = atomic.HashingFileWriter(fd)
        out.write(b"abc")
        out.close()
        assert out.closed
        with pytest.raises(ValueError):
            out.write(b"d")
        assert out.finish() == FileFacts(3, hashlib.sha256(b"abc").hexdigest())
    finally:
        os.close(fd)


# -- verified copies between local sites (transfer.copy_verified) ------------------------------------------


def _segment_at(site: Site) -> tuple[str, FileFacts]:
    rel = segment_relpath("orders", 1, ids.new_segment_id())
    return rel, site.write_segment(rel, rows(200), META)


def test_kernel_copy_is_verified_and_a_corrupt_source_is_refused(tmp_path: Path) -> None:
    from segrep.storage.transfer import copy_verified

    a, b = Site("a", str(_root(tmp_path / "a"))), Site("b", str(_root(tmp_path / "b")))
    rel, facts = _segment_at(a)
    assert copy_verified(a, b, rel, facts.byte_size, facts.sha256) == facts
    assert b.facts(rel) == facts

    rel2, facts2 = _segment_at(a)
    data = bytearray(Path(a.path(rel2)).read_bytes())
    data[len(data) // 2] ^= 0x01  # bit rot at the source: the copy has the catalog's size, not its hash
    Path(a.path(rel2)).write_bytes(bytes(data))
    with pytest.raises(CorruptSegmentError, match="does not match the catalog"):
        copy_verified(a, b, rel2, facts2.byte_size, facts2.sha256)
    assert sorted(p.name for p in Path(b.path(rel2)).parent.iterdir()) == [Path(rel).name]  # no tmp, no rel2


def test_crc64nvme_is_the_standard_crc_fed_in_any_pieces() -> None:
    """The fast checksum is CRC-64/NVME as S3 computes it: the standard check value, and the reference's
    value for data fed whole, in pieces, or as a memoryview."""
    assert Crc64Nvme(b"123456789").hexdigest() == "ae8b14860a799888" == crc64nvme_reference(b"123456789")
    data = os.urandom(20_000)
    pieces = Crc64Nvme()
    for i in range(0, len(data), 777):
        pieces.update(data[i : i + 777])
    assert pieces.hexdigest() == Crc64Nvme(memoryview(data)).hexdigest() == crc64nvme_reference(data)
    assert Crc64Nvme().hexdigest() == crc64nvme_reference(b"")


def test_a_kernel_copy_is_checked_by_the_crc64nvme_the_writer_computed(tmp_path: Path) -> None:
    """Where the catalog knows a segment's CRC-64/NVME, a local kernel copy is checked by it (not by sha256):
    the writer computed it from the bytes it wrote, a flipped bit at the source is refused by it, and a copy
    whose CRC-64/NVME is not the catalog's never appears under its final name."""
    from segrep.storage.transfer import copy_verified

    a, b = Site("a", str(_root(tmp_path / "a"))), Site("b", str(_root(tmp_path / "b")))
    rel, facts = _segment_at(a)
    assert facts.crc64nvme == crc64nvme_reference(Path(a.path(rel)).read_bytes())
    copied = copy_verified(a, b, rel, facts.byte_size, facts.sha256, facts.crc64nvme)
    assert (copied, copied.crc64nvme) == (facts, facts.crc64nvme)
    assert b.facts(rel) == facts and b.facts(rel).crc64nvme == facts.crc64nvme

    rel2, facts2 = _segment_at(a)
    data = bytearray(Path(a.path(rel2)).read_bytes())
    data[len(data) // 3] ^= 0x10
    Path(a.path(rel2)).write_bytes(bytes(data))
    with pytest.raises(CorruptSegmentError, match="crc64nvme"):
        copy_verified(a, b, rel2, facts2.byte_size, facts2.sha256, facts2.crc64nvme)
    # the right bytes with a wrong CRC in the catalog are refused too: the check is the CRC, not a pass
    rel3, facts3 = _segment_at(a)
    with pytest.raises(CorruptSegmentError, match="crc64nvme"):
        copy_verified(a, b, rel3, facts3.byte_size, facts3.sha256, "0" * 16)
    assert sorted(p.name for p in Path(b.path(rel2)).parent.iterdir()) == [Path(rel).name]  # no tmp, no others


def test_copy_falls_back_to_a_stream_where_the_kernel_cannot_copy(tmp_path: Path, monkeypatch) -> None:
    import errno

    from segrep.storage.transfer import copy_verified

    calls: list[int] = []

    def refuse(*_args: Any) -> int:
        calls.append(1)
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", refuse)
    a, b = Site("a", str(_root(tmp_path / "a"))), Site("b", str(_root(tmp_path / "b")))
    rel, facts = _segment_at(a)
    assert copy_verified(a, b, rel, facts.byte_size, facts.sha256) == facts
    assert calls == [1] and b.facts(rel) == facts
    assert [p.name for p in Path(b.path(rel)).parent.iterdir()] == [Path(rel).name]


def test_a_streamed_copy_of_a_segment_whose_crc_is_known_is_hashed_by_it_alone(tmp_path: Path, monkeypatch) -> None:
    """Where the kernel cannot copy (or the source is an object store), the streamed copy of a segment whose
    CRC-64/NVME the catalog knows hashes each byte once, by that CRC, and returns the catalog's facts; bytes
    that are not the catalog's never appear under the final name."""
    import errno

    from segrep.storage.transfer import copy_verified

    def refuse(*_args: Any) -> int:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    a, b = Site("a", str(_root(tmp_path / "a"))), Site("b", str(_root(tmp_path / "b")))
    rel, facts = _segment_at(a)
    rel2, facts2 = _segment_at(a)
    monkeypatch.setattr(os, "copy_file_range", refuse)

    def no_sha256(*_args: Any) -> None:
        raise AssertionError("a copy whose CRC-64/NVME the catalog knows was hashed by sha256")

    monkeypatch.setattr(atomic.hashlib, "sha256", no_sha256)
    copied = copy_verified(a, b, rel, facts.byte_size, facts.sha256, facts.crc64nvme)
    assert (copied, copied.crc64nvme) == (facts, facts.crc64nvme)
    with pytest.raises(CorruptSegmentError, match=r"does not match the catalog .*crc64nvme 0000000000000000"):
        copy_verified(a, b, rel2, facts2.byte_size, facts2.sha256, "0" * 16)
    monkeypatch.undo()
    assert b.facts(rel) == facts and not Path(b.path(rel2)).exists()
    assert [p.name for p in Path(b.path(rel)).parent.iterdir()] == [Path(rel).name]
