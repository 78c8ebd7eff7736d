"""Writer and reader against a real catalog (SQLite and PostgreSQL) and real segment files."""

from __future__ import annotations

import datetime as dt
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.core.errors import SchemaMismatchError, SegrepError
from segrep.data.reader import read_table
from segrep.data.writer import write_batch, write_batches
from segrep.storage.identity import MARKER_NAME
from tests.support.env import Env
from tests.support.tables import orders


def as_dict(table: pa.Table, key: str = "o_orderkey") -> dict:
    return {r[key]: r for r in table.to_pylist()}


def test_write_routes_by_partition_and_reads_back(env: Env) -> None:
    keys = [1, 149_999, 150_000, 299_999, 300_000, 450_000, 599_999]
    result = write_batch(env.catalog, "orders", orders(keys))
    assert result.rows_written == len(keys)
    assert sorted(s.partition_id for s in result.segments) == [1, 2, 3, 4]
    with env.catalog.read() as s:
        info = q.table_info(s, "orders")
        parts = q.partitions_of(s, info)
        by_part = {p.partition_id: p for p in parts}
        segs = list(s.scalars(select(m.Segment)))
    # every row sits in the partition whose range contains it
    for seg in segs:
        rows = pq.read_table(env.site_dir("primary") / seg.relpath).column("o_orderkey").to_pylist()
        part = by_part[seg.partition_id]
        lo = part.begin_key if part.begin_key is not None else -(2**63)
        hi = part.end_key if part.end_key is not None else 2**63
        assert all(lo <= k < hi for k in rows)
        assert seg.is_major and seg.base_segment_id is None  # first segment of a chain is major
    assert as_dict(read_table(env.catalog, "orders")) == as_dict(orders(keys))


def test_updates_and_deletes_last_writer_wins(env: Env) -> None:
    write_batch(env.catalog, "orders", orders(list(range(1, 101))))
    write_batch(env.catalog, "orders", orders(list(range(50, 151)), status="F", comment="upd"))
    write_batch(env.catalog, "orders", pa.table({"o_orderkey": pa.array([1, 2, 60, 999], pa.int64())}), delete=True)
    write_batch(env.catalog, "orders", orders([2], status="P", comment="again"))  # re-insert after delete
    got = as_dict(read_table(env.catalog, "orders"))
    expected = as_dict(orders(list(range(3, 50))))
    expected |= as_dict(orders(list(range(50, 151)), status="F", comment="upd"))
    expected.pop(60)
    expected |= as_dict(orders([2], status="P", comment="again"))
    assert got == expected


def test_chain_links_and_versions_increase(env: Env) -> None:
    for i in range(4):
        write_batch(env.catalog, "orders", orders([10 + i, 20 + i]))
    with env.catalog.read() as s:
        pl = s.scalars(select(m.Placement).where(m.Placement.placement_id == 1)).one()
        segs = q.segments_of(s, [1])[1]
        part = s.get(m.Partition, pl.partition_id)
    assert [x.base_segment_id for x in segs] == [None] + [x.segment_id for x in segs[:-1]]
    assert pl.root_segment_id == segs[-1].segment_id
    versions = [x.max_version for x in segs]
    assert versions == sorted(set(versions))
    assert part.last_version == versions[-1]
    assert [x.is_major for x in segs] == [True, False, False, False]


def test_duplicate_keys_in_a_batch_keep_the_last(env: Env) -> None:
    batch = pa.concat_tables([orders([5, 6], comment="first"), orders([5], comment="second")])
    result = write_batch(env.catalog, "orders", batch)
    assert result.rows_written == 2
    assert as_dict(read_table(env.catalog, "orders"))[5]["o_comment"] == "second5"


def test_as_of_reads_an_older_version(env: Env) -> None:
    first = write_batch(env.catalog, "orders", orders([1, 2]))
    write_batch(env.catalog, "orders", orders([1], comment="new"))
    old = as_dict(read_table(env.catalog, "orders", as_of=first.segments[0].version))
    assert old[1]["o_comment"] == "c1"
    assert as_dict(read_table(env.catalog, "orders"))[1]["o_comment"] == "new1"


def test_composite_string_key_table(env: Env) -> None:
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def events(rows: list[tuple[str, int, str]]) -> pa.Table:
        return pa.table(
            {
                "tenant": [r[0] for r in rows],
                "seq": pa.array([r[1] for r in rows], pa.int64()),
                "payload": [r[2] for r in rows],
                "at": pa.array([at] * len(rows), pa.timestamp("us", tz="UTC")),
            }
        )

    write_batch(env.catalog, "events", events([("acme", 1, "a"), ("acme", 2, "b"), ("zeta", 1, "z")]))
    write_batch(env.catalog, "events", events([("acme", 2, "B"), ("zeta", 2, "y")]))
    write_batch(env.catalog, "events", pa.table({"tenant": ["acme"], "seq": pa.array([1], pa.int64())}), delete=True)
    got = {(r["tenant"], r["seq"]): r["payload"] for r in read_table(env.catalog, "events").to_pylist()}
    assert got == {("acme", 2): "B", ("zeta", 1): "z", ("zeta", 2): "y"}


def test_schema_mismatch_writes_nothing(env: Env) -> None:
    bad = orders([1]).drop_columns(["o_comment"])
    with pytest.raises(SchemaMismatchError, match="o_comment"):
        write_batch(env.catalog, "orders", bad)
    wrong_type = orders([1]).set_column(0, "o_orderkey", pa.array(["x"]))
    with pytest.raises(SchemaMismatchError, match="o_orderkey"):
        write_batch(env.catalog, "orders", wrong_type)
    with pytest.raises(SchemaMismatchError, match="key columns"):
        write_batch(env.catalog, "orders", pa.table({"o_custkey": pa.array([1], pa.int64())}), delete=True)
    with env.catalog.read() as s:
        assert q.segment_count(s, q.table_info(s, "orders").table_id) == 0
    assert not any(p.is_file() and p.name != MARKER_NAME for p in (env.root / "data").rglob("*"))


def test_unknown_table_is_a_clear_error(env: Env) -> None:
    with pytest.raises(SegrepError, match="unknown table 'nope'"):
        write_batch(env.catalog, "nope", orders([1]))
    with pytest.raises(SegrepError, match="invalid table name"):
        read_table(env.catalog, "../etc")


def test_concurrent_writers_to_one_partition_lose_nothing(env: Env) -> None:
    """Two writers racing on the same partitions: both batches land, the chain stays linear, and no
    file is left behind by a writer that lost a race (it retries on the new root)."""
    errors: list[BaseException] = []

    def writer(offset: int) -> None:
        try:
            for i in range(6):
                write_batch(env.catalog, "orders", orders([offset + i, 200_000 + offset + i]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(o,)) for o in (1000, 2000)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    got = read_table(env.catalog, "orders").column("o_orderkey").to_pylist()
    assert sorted(got) == sorted(
        [o + i for o in (1000, 2000) for i in range(6)] + [200_000 + o + i for o in (1000, 2000) for i in range(6)]
    )
    with env.catalog.read() as s:
        for pl in s.scalars(select(m.Placement).where(m.Placement.site_id == 1)):
            segs = q.segments_of(s, [pl.placement_id]).get(pl.placement_id, [])
            chain = q.chain_of(pl, segs)
            assert len(chain.walk()) == len(segs)  # every segment on one linear chain
        referenced = {x.relpath for x in s.scalars(select(m.Segment))}
    root = env.site_dir("primary")
    on_disk = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != MARKER_NAME}
    assert on_disk == referenced


def test_overlap_check_uses_the_whole_composite_key(env: Env) -> None:
    """Segments sharing a leading key value but not a whole key are disjoint (fast path); a real overlap
    is detected and resolved."""
    from segrep.data.reader import placement_files

    def ev(seqs: list[int], payload: str) -> pa.Table:
        at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        return pa.table(
            {
                "tenant": ["acme"] * len(seqs),
                "seq": pa.array(seqs, pa.int64()),
                "payload": [payload] * len(seqs),
                "at": pa.array([at] * len(seqs), pa.timestamp("us", tz="UTC")),
            }
        )

    write_batch(env.catalog, "events", ev([1, 2], "a"))
    write_batch(env.catalog, "events", ev([3, 4], "b"))
    _, pfs = placement_files(env.catalog, "events")
    assert [pf.disjoint for pf in pfs if pf.segments] == [True]
    write_batch(env.catalog, "events", ev([2, 3], "c"))
    _, pfs = placement_files(env.catalog, "events")
    assert [pf.disjoint for pf in pfs if pf.segments] == [False]
    got = {r["seq"]: r["payload"] for r in read_table(env.catalog, "events").to_pylist()}
    assert got == {1: "a", 2: "c", 3: "c", 4: "b"}


@pytest.mark.parametrize("keys", [[599_999, 1, 300_000, 150_000, 2], [1, 2, 150_000, 300_000, 599_999]])
def test_routing_sorted_and_unsorted_batches(env: Env, keys: list[int]) -> None:
    """Key-sorted batches are routed by zero-copy slices, others by masks: both put every row in its partition."""
    result = write_batch(env.catalog, "orders", orders(keys))
    assert sorted((s.partition_id, s.rows) for s in result.segments) == [(1, 2), (2, 1), (3, 1), (4, 1)]
    with env.catalog.read() as s:
        for seg in s.scalars(select(m.Segment)):
            part = s.get(m.Partition, seg.partition_id)
            got = pq.read_table(env.site_dir("primary") / seg.relpath).column("o_orderkey").to_pylist()
            assert all((part.begin_key or 0) <= k < (part.end_key or 10**9) for k in got)
    assert sorted(read_table(env.catalog, "orders").column("o_orderkey").to_pylist()) == sorted(keys)


@pytest.mark.parametrize("keys", [[5, 1, 3], [1, 200_000, 400_000]])
def test_recorded_facts_are_those_of_the_files_on_disk(env: Env, keys: list[int]) -> None:
    """One partition (written in the calling thread) or several (side by side): the size and sha256 the
    catalog records, taken as the bytes were written, are those of each file as it is on disk."""
    import hashlib

    write_batch(env.catalog, "orders", orders(keys))
    with env.catalog.read() as s:
        segs = list(s.scalars(select(m.Segment)))
    assert len(segs) == len({1 if k < 150_000 else 2 if k < 300_000 else 3 for k in keys})
    for seg in segs:
        data = (env.site_dir("primary") / seg.relpath).read_bytes()
        assert (seg.byte_size, seg.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert sorted(read_table(env.catalog, "orders").column("o_orderkey").to_pylist()) == sorted(keys)


def test_a_failed_file_write_commits_nothing_and_leaves_nothing(env: Env, monkeypatch) -> None:
    """An I/O error while a segment's bytes go out (one partition or several) fails the batch: no segment is
    registered and no file, temporary or final, remains."""
    from segrep.storage import site as storage

    def no_space(fd: int, data: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(storage.os, "write", no_space)
    for keys in ([1, 2], [1, 200_000, 400_000]):
        with pytest.raises(OSError, match="No space left"):
            write_batch(env.catalog, "orders", orders(keys))
    monkeypatch.undo()
    with env.catalog.read() as s:
        assert q.segment_count(s, q.table_info(s, "orders").table_id) == 0
    assert not any(p.is_file() and p.name != MARKER_NAME for p in env.site_dir("primary").rglob("*"))


def test_write_batches_commits_every_batch_at_once_and_nothing_when_one_fails(env: Env) -> None:
    """Batches written one after another into the same partitions, registered in one commit: in a partition the
    second batch's segment continues the first's (its row wins for a key both hold); a bad batch after a good one
    leaves the table as it was, with none of the good batch's files left behind."""
    before = write_batch(env.catalog, "orders", orders([1]))
    result = write_batches(
        env.catalog, "orders", iter([orders([1, 2, 200_000], comment="x"), orders([2], comment="y")])
    )
    assert (result.rows_in, result.rows_written, len(result.segments)) == (4, 4, 3)
    with env.catalog.read() as s:
        segs = {seg.segment_id: seg for seg in s.scalars(select(m.Segment))}
        committed = {segs[w.segment_id].committed_us for w in result.segments}
    first, second = (w for w in result.segments if w.partition_id == before.segments[0].partition_id)
    assert len(committed) == 1  # one transaction
    assert segs[first.segment_id].base_segment_id == before.segments[0].segment_id
    assert segs[second.segment_id].base_segment_id == first.segment_id and second.version > first.version
    got = as_dict(read_table(env.catalog, "orders"))
    assert {k: got[k]["o_comment"] for k in got} == {1: "x1", 2: "y2", 200_000: "x200000"}

    files = sorted(p for p in env.root.rglob("*.parquet"))
    bad = orders([3]).set_column(0, "o_orderkey", pa.array(["three"]))
    with pytest.raises(SchemaMismatchError, match="o_orderkey"):
        write_batches(env.catalog, "orders", iter([orders([5, 300_000], comment="z"), bad]))
    assert sorted(p for p in env.root.rglob("*.parquet")) == files
    assert as_dict(read_table(env.catalog, "orders")) == got
