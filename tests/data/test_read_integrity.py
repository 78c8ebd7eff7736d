"""Reads never serve rows from a file that is not the segment the catalog names (issue 11 item 2).

A segment file swapped with another segment's file (of the same placement or of another partition), truncated,
re-encoded to another size, or with a flipped bit in a data page: `segrep read` exits 2 with one line naming
the file and how to restore it, prints no row and changes nothing; on the concatenating fast path and on the
last-writer-wins merge path alike. Healthy data reads as before on both paths.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select, update

from segrep.catalog import models as m
from segrep.core.errors import CorruptSegmentError
from segrep.data import reader
from segrep.data.reader import read_table
from segrep.data.writer import write_batch
from segrep.replication.orchestrator import run_round
from tests.support.badinput import assert_user_error, unchanged
from tests.support.cli import cli
from tests.support.env import Env
from tests.support.rounds import no_spark
from tests.support.tables import orders

ROOT = Path(__file__).resolve().parents[2]
P0 = [1, 2, 3, 4, 5]  # the first partition: keys below 150000
P0_MORE = [6, 7, 8]
P1 = [150_001, 150_002, 150_003]


def _load(env: Env, path: str) -> None:
    """Two segments in the first partition and one in the second; on the merge path an update and a delete in
    the first make it resolve row by row."""
    write_batch(env.catalog, "orders", orders(P0))
    write_batch(env.catalog, "orders", orders(P0_MORE))
    write_batch(env.catalog, "orders", orders(P1))
    if path == "merge":
        write_batch(env.catalog, "orders", orders([2], comment="updated"))
        write_batch(env.catalog, "orders", pa.table({"o_orderkey": pa.array([3], pa.int64())}), delete=True)


def _expected(path: str) -> dict[int, str]:
    rows = {k: f"c{k}" for k in P0 + P0_MORE + P1}
    if path == "merge":
        rows[2] = "updated2"
        del rows[3]
    return rows


def _files(env: Env, site: str = "primary") -> list[tuple[int, Path]]:
    """(partition id, path) of every segment file the site's placements list, in list order."""
    with env.catalog.read() as s:
        segs = s.execute(
            select(m.Segment.partition_id, m.Segment.relpath)
            .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
            .join(m.Site, m.Site.site_id == m.Placement.site_id)
            .where(m.Site.name == site)
            .order_by(m.Segment.entry_id)
        ).all()
    return [(pid, env.site_dir(site) / rel) for pid, rel in segs]


def _swap(a: Path, b: Path) -> None:
    tmp = a.with_name("swap.tmp")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


def _flip_bit_in_a_data_page(path: Path, column: str = "o_comment") -> None:
    """Flip one bit in the middle of a column chunk's last data page (its values, not its header): without page
    checksums the file still decodes, to a changed value."""
    md = pq.read_metadata(path)
    group = md.row_group(0)
    chunk = next(group.column(i) for i in range(group.num_columns) if group.column(i).path_in_schema == column)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    offset = start + chunk.total_compressed_size - 3  # inside the last page's values
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def _swap_in_placement(files: list[tuple[int, Path]]) -> Path:
    a, b = [p for pid, p in files if pid == files[0][0]][:2]
    _swap(a, b)
    return a


def _other_partitions_file(files: list[tuple[int, Path]]) -> Path:
    target = files[0][1]
    source = next(p for pid, p in files if pid != files[0][0])
    shutil.copyfile(source, target)
    return target


def _truncated(files: list[tuple[int, Path]]) -> Path:
    target = files[0][1]
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 2])
    return target


def _flipped(files: list[tuple[int, Path]]) -> Path:
    target = files[0][1]
    _flip_bit_in_a_data_page(target)
    return target


def _resized(files: list[tuple[int, Path]]) -> Path:
    """The same segment's rows and footer entry, encoded again without compression: only the size differs."""
    target = files[0][1]
    pq.write_table(pq.read_table(target), target, compression="none", write_page_checksum=True)
    return target


def _renamed_column(files: list[tuple[int, Path]]) -> Path:
    """A damaged column name in the footer of a file read after another one: a multi-file read would fill the
    column it no longer finds with nulls."""
    target = [p for pid, p in files if pid == files[0][0]][1]
    target.write_bytes(target.read_bytes().replace(b"o_clerk", b"o_clerx"))
    return target


def _forged(files: list[tuple[int, Path]]) -> Path:
    """The tester's forgery (issue 32): the first file rewritten as valid Parquet with one value changed, the
    same schema and key-value metadata (footer entry), page checksums on, and padded to the byte size the
    catalog records. Every check but the file's content checksum passes: its footer entry, size, row count,
    keys, versions and page CRCs are all right."""
    target = files[0][1]
    size = target.stat().st_size
    rows = pq.read_table(target)  # its schema metadata is the footer entry
    comments = rows.column("o_comment").to_pylist()
    original = comments[0]
    for letter in "xyzuvw":  # c1 -> cx (same length), unless it compresses a byte worse
        comments[0] = original[:-1] + letter
        column = pa.array(comments, pa.string())
        pq.write_table(
            rows.set_column(rows.schema.get_field_index("o_comment"), "o_comment", column),
            target,
            write_page_checksum=True,
        )
        if target.stat().st_size <= size:
            break
    _pad_to(target, size)
    assert pq.read_table(target, page_checksum_verification=True).column("o_comment")[0].as_py() == comments[0]
    return target


def _pad_to(path: Path, size: int) -> None:
    """Bytes inserted between the last column chunk and the footer, where no offset of the footer points."""
    data = path.read_bytes()
    assert len(data) <= size, (len(data), size)
    footer_at = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    path.write_bytes(data[:footer_at] + b"\0" * (size - len(data)) + data[footer_at:])
    assert path.stat().st_size == size


def _missing(files: list[tuple[int, Path]]) -> Path:
    target = files[0][1]
    target.unlink()
    return target


DAMAGE: dict[str, Callable[[list[tuple[int, Path]]], Path]] = {
    "swap-in-placement": _swap_in_placement,
    "other-partition": _other_partitions_file,
    "truncated": _truncated,
    "flipped-bit": _flipped,
    "resized": _resized,
    "renamed-column": _renamed_column,
    "missing": _missing,
    "forged": _forged,
}


def _read_ok(env: Env, *args: str) -> dict[int, str]:
    rows = read_table(env.catalog, "orders", *args)
    return dict(zip(rows.column("o_orderkey").to_pylist(), rows.column("o_comment").to_pylist(), strict=True))


@pytest.mark.parametrize("path", ["fast", "merge"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_file_fails_the_read_naming_it(env: Env, path: str, damage: str) -> None:
    _load(env, path)
    assert _read_ok(env) == _expected(path)
    target = DAMAGE[damage](_files(env))
    with unchanged(env):
        code, out, err = cli(env, "read", "orders")
    assert out == ""
    line = assert_user_error(code, out, err, str(target), "site primary", "leader's copy")
    assert "segrep repair orders --site primary" in line


def test_the_fast_path_and_the_merge_path_are_the_ones_taken(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parametrised cases above exercise both read paths: the first partition is concatenated without the
    merge load and resolved with it."""
    calls: list[str] = []
    concatenated, per_placement = reader._read_concatenated, reader.read_placement
    monkeypatch.setattr(reader, "_read_concatenated", lambda *a, **k: calls.append("fast") or concatenated(*a, **k))
    monkeypatch.setattr(reader, "read_placement", lambda *a, **k: calls.append("merge") or per_placement(*a, **k))
    _load(env, "fast")
    assert _read_ok(env) == _expected("fast") and calls == ["fast"]
    calls.clear()
    _load(env, "merge")
    assert _read_ok(env) == _expected("merge") and "merge" in calls


def test_a_key_changed_in_the_dictionary_is_caught(env: Env) -> None:
    """The issue's case: a flipped bit turns key 4 into 772. Keys are dictionary-encoded; the dictionary page
    carries its checksum too, and the key range read would differ from the catalog's anyway."""
    _load(env, "fast")
    target = _files(env)[0][1]
    data = bytearray(target.read_bytes())
    four = (4).to_bytes(8, "little")
    md = pq.read_metadata(target).row_group(0).column(0)
    assert md.path_in_schema == "o_orderkey"
    start = md.dictionary_page_offset or md.data_page_offset
    at = data.index(four, start, start + md.total_compressed_size)
    data[at + 1] ^= 0x03  # 4 -> 772
    target.write_bytes(bytes(data))
    with unchanged(env):
        code, out, err = cli(env, "read", "orders")
    assert_user_error(code, out, err, str(target))
    assert out == ""


def _segment_of(env: Env, target: Path) -> tuple[reader.PlacementFiles, m.Segment]:
    _, placements = reader.placement_files(env.catalog, "orders")
    return next((pf, seg) for pf in placements for seg in pf.segments if Path(pf.site.path(seg.relpath)) == target)


@pytest.mark.parametrize("path", ["fast", "merge"])
@pytest.mark.parametrize("recorded", ["crc64nvme", "sha256"])
def test_a_forged_file_is_refused_by_its_content_checksum(env: Env, path: str, recorded: str) -> None:
    """Issue 32: the forgery passes the footer check and every page CRC; the Python API refuses it by the
    checksum of its bytes (CRC-64/NVME where the catalog records it, sha256 for a segment written before it
    did) before any row is returned, naming the site, the file, the segment and the repair."""
    _load(env, path)
    if recorded == "sha256":
        with env.catalog.write() as s:
            s.execute(update(m.Segment).values(crc64nvme=None))
    target = _forged(_files(env))
    pf, seg = _segment_of(env, target)
    info, _ = reader.placement_files(env.catalog, "orders")
    pf.site.check_footer(seg.relpath, reader.expected_segment(info, seg))  # all the footer says is right
    with pytest.raises(CorruptSegmentError) as caught:
        read_table(env.catalog, "orders")
    message = str(caught.value)
    for needle in (
        f"site primary: segment file {target} is not segment {seg.segment_id} of orders partition",
        f"its bytes are not the catalog's ({recorded} ",
        "the leader's copy: run `segrep repair orders --site primary`",
    ):
        assert needle in message, message


def test_the_spark_executors_check_the_content_too(sqlite_env: Env) -> None:
    """The Spark reader's executors read each file through ``Site.read_checked`` (``data.spark_files``): the
    forgery passes the driver's footer checks and is refused where it is read; the spark-submit job turns the
    executor's error into one line naming the file and the repair."""
    from segrep.data.spark_files import read_file
    from segrep.data.spark_reader import _files as spark_files

    _load(sqlite_env, "fast")
    target = _forged(_files(sqlite_env))
    pf, seg = _segment_of(sqlite_env, target)
    info, _ = reader.placement_files(sqlite_env.catalog, "orders")
    segment_file = next(f for f in spark_files(info, pf) if f.relpath == seg.relpath)
    with pytest.raises(CorruptSegmentError, match="its bytes are not the catalog's") as caught:
        read_file(segment_file, info.schema)
    failure = Exception(f"PythonException: ...\nsegrep.core.errors.CorruptSegmentError: {caught.value}\n\tat org...")
    message = _read_table_job().damaged_page_message(failure)
    assert message is not None and str(target) in message and seg.segment_id in message
    assert message.endswith("run `segrep repair orders --site primary` to fetch it again from an intact copy")


@pytest.mark.parametrize("damage", ["flipped-bit", "forged"])
@pytest.mark.parametrize("site", ["dr", "primary"])
def test_a_damaged_file_names_the_repair_that_restores_it(env: Env, site: str, damage: str) -> None:
    _load(env, "fast")
    run_round(env.catalog, env.defs, "orders", submit=no_spark)
    assert _read_ok(env, "dr") == _expected("fast")
    target = DAMAGE[damage](_files(env, site))
    with unchanged(env):
        code, out, err = cli(env, "read", "orders", "--site", site)
    whose = "the leader's copy" if site == "primary" else "a replica's copy"
    assert_user_error(code, out, err, str(target), f"site {site}", whose, f"segrep repair orders --site {site}")
    other = "primary" if site == "dr" else "dr"
    assert _read_ok(env, other) == _expected("fast")  # the other site's copies are intact
    code, out, err = cli(env, "repair", "orders", "--site", site)  # the advice, followed, mends it
    assert code == 0, out + err
    assert _read_ok(env, site) == _expected("fast")


def test_as_of_reads_check_the_files_too(env: Env) -> None:
    _load(env, "fast")
    target = _swap_in_placement(_files(env))
    with unchanged(env):
        code, out, err = cli(env, "read", "orders", "--as-of", str(2**62))
    assert_user_error(code, out, err, str(target))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 10**6), where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_a_flipped_bit_anywhere_never_serves_wrong_rows(sqlite_env: Env, which: int, where: float, bit: int) -> None:
    """Any single bit flipped anywhere in any file (pages, page headers, footer, magic): the read fails with
    CorruptSegmentError naming the file, or returns exactly the right rows. (Every single-bit flip of a file,
    about 38,000, was tried once on each path: none served a wrong row or raised anything else.)"""
    env = sqlite_env
    if not _files(env):
        _load(env, "merge")
    healthy = read_table(env.catalog, "orders").sort_by("o_orderkey")
    files = _files(env)
    target = files[which % len(files)][1]
    original = target.read_bytes()
    data = bytearray(original)
    data[int(where * len(data))] ^= 1 << bit
    target.write_bytes(bytes(data))
    try:
        try:
            got = read_table(env.catalog, "orders")
        except CorruptSegmentError as exc:
            assert str(target) in str(exc)
        else:
            assert got.sort_by("o_orderkey").equals(healthy)
    finally:
        target.write_bytes(original)


class _NoSpark:
    """Stands in for a SparkSession: any use of it fails the test (the driver's checks come first)."""

    def __getattr__(self, name: str) -> object:
        pytest.fail(f"Spark was used ({name}) although a footer check should have refused the read")


@pytest.mark.parametrize("damage", ["swap-in-placement", "other-partition", "truncated", "resized", "missing"])
def test_the_spark_reader_checks_every_footer_on_the_driver(sqlite_env: Env, damage: str) -> None:
    from segrep.data.spark_reader import read_dataframe

    _load(sqlite_env, "merge")
    target = DAMAGE[damage](_files(sqlite_env))
    with pytest.raises(CorruptSegmentError, match="site primary") as caught:
        read_dataframe(_NoSpark(), sqlite_env.catalog, "orders")  # type: ignore[arg-type]
    assert str(target) in str(caught.value) and "segrep repair orders --site primary" in str(caught.value)


def _read_table_job() -> Any:
    spec = importlib.util.spec_from_file_location("read_table_job", ROOT / "spark_jobs" / "read_table.py")
    assert spec is not None and spec.loader is not None
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return job


@pytest.mark.spark
@pytest.mark.parametrize("damage", ["flipped-bit", "forged"])
def test_spark_executors_check_each_files_content(sqlite_env: Env, spark: Any, damage: str) -> None:
    """A flipped bit in a data page, or the forgery, passes the driver's footer checks; the executors' check of
    each file's content checksum catches it (before its pages are decoded), and the spark-submit job turns that
    into one line naming the file and the repair."""
    from segrep.data.spark_reader import read_dataframe

    _load(sqlite_env, "merge")
    healthy = sorted(tuple(r) for r in read_dataframe(spark, sqlite_env.catalog, "orders").collect())
    assert [r[0] for r in healthy] == sorted(_expected("merge"))
    target = DAMAGE[damage](_files(sqlite_env))
    with pytest.raises(Exception, match="its bytes are not the catalog's") as caught:
        read_dataframe(spark, sqlite_env.catalog, "orders").collect()
    message = _read_table_job().damaged_page_message(caught.value)
    assert message is not None and str(target) in message and "segrep repair orders --site primary" in message
