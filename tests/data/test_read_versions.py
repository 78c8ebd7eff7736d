"""A table whose segments were written at two schema versions reads at the newer one (issue 35 item 3).

Rows written at version 1 by the real writer, then a segment file written at version 2 (a column renamed,
one widened, one dropped, one added with a default, the order changed; the file carries its field ids and
version). The table moves to version 2 through the definitions file and `segrep apply`. Then
the reader (both its concatenating and its last-writer-wins paths), a compaction's major (written at version
2), a replica's copy and verify's digests all give the oracle's rows: the same changes applied to dicts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from segrep.catalog import models as m
from segrep.catalog.apply import apply_definitions
from segrep.catalog.queries import table_info
from segrep.catalog.snapshot import snapshot
from segrep.core import hlc
from segrep.core import schema as sch
from segrep.core.projection import ReadVersions
from segrep.core.schema_versions import Column, SchemaVersion, first_version, version_of_file
from segrep.data.reader import expected_segment, placement_files, read_table
from segrep.data.spark_reader import read_dataframe
from segrep.data.writer import write_batch
from segrep.maintenance.compaction import compact
from segrep.maintenance.verify import RowCheck, Verdict, verify
from segrep.maintenance.verify_spark import SparkDigests
from segrep.replication.orchestrator import run_round
from segrep.storage.segment_meta import footer_differences
from segrep.storage.site import META_KEY, segment_relpath
from tests.support.env import Env, make_env
from tests.support.forks import add_segment
from tests.support.rounds import no_spark
from tests.support.spark import merge_engine, spark_submit_in

YAML = """
data_dir: data
sites:
  primary: {id: 1, uri: sites/primary}
  dr: {id: 2, uri: sites/dr}
tables:
  kv:
    columns: {k: int64, n: int16, gone: string, v: string}
    primary_key: [k]
    split_points: [5]
    leader: primary
    replicas: [dr]
    policy: {retry_delay_s: 0}
"""
# v renamed to value and moved first, n widened, gone dropped (soft), note added with a default
YAML_V2 = YAML.replace(
    "    columns: {k: int64, n: int16, gone: string, v: string}\n",
    "    columns:\n"
    "      value: {type: string, renamed_from: v}\n"
    "      k: int64\n"
    "      n: int64\n"
    "      note: {type: string, default: '-'}\n",
)
V1 = first_version([("k", "int64"), ("n", "int16"), ("gone", "string"), ("v", "string")])
# v renamed to value and moved first, n widened, gone dropped, note added with a default
V2 = SchemaVersion(
    2,
    (Column(4, "value", "string"), Column(1, "k", "int64"), Column(2, "n", "int64"), Column(5, "note", "string", "-")),
)


def v1_rows(keys: range | list[int], tag: str) -> pa.Table:
    return pa.table(
        {
            "k": pa.array(list(keys), pa.int64()),
            "n": pa.array([k * 100 for k in keys], pa.int16()),
            "gone": [f"g{k}" for k in keys],
            "v": [f"{tag}{k}" for k in keys],
        }
    )


def to_v2(row: dict[str, Any]) -> dict[str, Any]:
    """The oracle's version change, on a dict."""
    return {"value": row["v"], "k": row["k"], "n": row["n"], "note": "-"}


@pytest.fixture
def kv_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    e = make_env(tmp_path, f"sqlite:///{tmp_path}/catalog.db", YAML)
    yield e
    e.catalog.dispose()


def at_version_2(kv_env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """The schema change through the definitions file and `segrep apply`, as an operator makes it."""
    kv_env.config.write_text(YAML_V2)
    apply_definitions(kv_env.catalog, kv_env.defs)
    with kv_env.catalog.read() as s:
        info = table_info(s, "kv")
    assert info.versions == ReadVersions(V1, V2), info.versions  # the ids the catalog gave: as the oracle's


def add_v2_segment(kv_env: Env, rows: list[dict[str, Any]]) -> None:
    """A segment file at version 2 on top of the leader's chain of each partition the rows fall in."""
    with kv_env.catalog.read() as s:
        snap = snapshot(s, "kv")
    now = hlc.now_us()
    for part in snap.partitions:
        lo, hi = part.partition.begin_key, part.partition.end_key
        mine = [r for r in rows if (lo is None or r["k"] >= lo) and (hi is None or r["k"] < hi)]
        if mine:
            stamped = [{**r, sch.VERSION_COL: now, sch.ORIGIN_COL: 1} for r in mine]
            add_segment(kv_env.catalog, snap, part, part.leader, stamped, V2.segment_arrow())


def as_dicts(t: pa.Table) -> list[dict[str, Any]]:
    return sorted(t.to_pylist(), key=lambda r: r["k"])


def mixed_versions(kv_env: Env, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Segments at version 1 (an update and a delete among them), the table moved to version 2, a segment
    at version 2 (an update of a version 1 row, a new row, a delete); replicated to dr. The oracle's rows."""
    write_batch(kv_env.catalog, "kv", v1_rows(range(10), "a"))
    write_batch(kv_env.catalog, "kv", v1_rows([2, 6], "b"))
    write_batch(kv_env.catalog, "kv", pa.table({"k": pa.array([3], pa.int64())}), delete=True)
    oracle = {r["k"]: r for r in v1_rows(range(10), "a").to_pylist()}
    oracle.update({r["k"]: r for r in v1_rows([2, 6], "b").to_pylist()})
    del oracle[3]
    oracle = {k: to_v2(r) for k, r in oracle.items()}

    at_version_2(kv_env, monkeypatch)
    v2 = [
        {"value": "c1", "k": 1, "n": 100_000, "note": "x", sch.DELETED_COL: False},  # n no int16 holds
        {"value": "c7", "k": 7, "n": 7, "note": None, sch.DELETED_COL: False},
        {"value": None, "k": 4, "n": None, "note": None, sch.DELETED_COL: True},
        {"value": "c11", "k": 11, "n": 11, "note": "y", sch.DELETED_COL: False},
    ]
    add_v2_segment(kv_env, v2)
    for r in v2:
        if r[sch.DELETED_COL]:
            del oracle[r["k"]]
        else:
            oracle[r["k"]] = {c.name: r[c.name] for c in V2.columns}
    want = sorted(oracle.values(), key=lambda r: r["k"])
    assert run_round(kv_env.catalog, kv_env.defs, "kv", submit=no_spark).status == "ok"
    return want


def test_segments_of_two_versions_read_resolve_compact_and_digest_at_the_newer(
    kv_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = mixed_versions(kv_env, monkeypatch)

    got = read_table(kv_env.catalog, "kv")
    assert got.column_names == ["value", "k", "n", "note"]
    assert got.schema.field("n").type == pa.int64()
    assert as_dicts(got) == want  # k=1 written again at version 2 wins over version 1 by _version
    assert as_dicts(read_table(kv_env.catalog, "kv", columns=["k", "note"])) == [
        {"k": r["k"], "note": r["note"]} for r in want
    ]

    assert as_dicts(read_table(kv_env.catalog, "kv", site="dr")) == want  # the replica's copies, both versions

    report = compact(kv_env.catalog, kv_env.defs, "kv", force=True, submit=no_spark)
    assert report.commit.committed == 2, report
    assert as_dicts(read_table(kv_env.catalog, "kv")) == want
    assert_majors_at_version_2(kv_env)
    # primary holds majors at version 2, dr the minors of both versions: the same rows, the same digests
    assert_same_digests(verify(kv_env.catalog, "kv", record=False).rows, len(want), on_spark=False)


def test_after_apply_the_writer_writes_at_the_new_version_and_a_round_copies_it_unchanged(
    kv_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer at the new version (the real writer, after `segrep apply`): its file carries version 2, the
    round fast-forwards it to dr as it is (the same bytes), and both sites read the oracle's rows."""
    want = {r["k"]: r for r in mixed_versions(kv_env, monkeypatch)}
    batch = pa.table(
        {
            "value": ["w5", "w20"],
            "k": pa.array([5, 20], pa.int64()),
            "n": pa.array([2**40, None], pa.int64()),  # a value only the widened column holds
            "note": ["z", None],
        }
    )
    result = write_batch(kv_env.catalog, "kv", batch)
    want.update({r["k"]: r for r in batch.to_pylist()})
    with kv_env.catalog.read() as s:
        versions = sorted({seg.schema_version for seg in s.query(m.Segment).all()})
    assert versions == [1, 2], versions
    assert run_round(kv_env.catalog, kv_env.defs, "kv", submit=no_spark).status == "ok"
    for site in ("primary", "dr"):
        assert as_dicts(read_table(kv_env.catalog, "kv", site=site)) == sorted(want.values(), key=lambda r: r["k"])
    for seg in result.segments:  # fast-forward: the replica's file is the leader's, byte for byte
        rel = segment_relpath("kv", seg.partition_id, seg.segment_id)
        assert (kv_env.site_dir("primary") / rel).read_bytes() == (kv_env.site_dir("dr") / rel).read_bytes()


@pytest.mark.spark
def test_on_spark_the_executors_project_every_file(kv_env: Env, monkeypatch: pytest.MonkeyPatch, spark: Any) -> None:
    """The Spark reader, a compaction by the Spark merge job and verify's Spark digests: each file projected
    to version 2 on the executors."""
    want = mixed_versions(kv_env, monkeypatch)
    for site in ("primary", "dr"):
        assert as_dicts(read_dataframe(spark, kv_env.catalog, "kv", site=site).toArrow()) == want
    submit = spark_submit_in(spark)
    with merge_engine("spark"):
        report = compact(kv_env.catalog, kv_env.defs, "kv", force=True, submit=submit)
    assert report.commit.committed == 2 and report.commit.spark_apps == 1, report
    assert as_dicts(read_table(kv_env.catalog, "kv")) == want
    assert_majors_at_version_2(kv_env)
    digests = replace(SparkDigests.for_table(kv_env.defs, "kv", submit), threshold_bytes=0)  # every pair on Spark
    assert_same_digests(verify(kv_env.catalog, "kv", record=False, spark=digests).rows, len(want), on_spark=True)


def assert_majors_at_version_2(kv_env: Env) -> None:
    """Each leader placement's chain starts with a major written at version 2 (field ids and version in it)."""
    _, placements = placement_files(kv_env.catalog, "kv", "primary")
    for pf in placements:
        major = pf.segments[0]
        assert major.is_major
        schema = pq.read_schema(pf.site.path(major.relpath))
        assert version_of_file(schema) == V2 and schema.names == V2.segment_arrow().names
        assert [f.metadata for f in schema][:4] == [f.metadata for f in V2.segment_arrow()][:4]


def assert_same_digests(checks: list[RowCheck], rows: int, *, on_spark: bool) -> None:
    assert checks and all(c.verdict == Verdict.EQUAL and c.on_spark == on_spark for c in checks), checks
    assert all(c.leader == c.replica and c.leader is not None and c.leader.rows for c in checks)
    assert sum(c.leader.rows for c in checks if c.leader is not None) == rows


def test_a_file_must_hold_the_columns_of_the_version_it_declares(kv_env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """The footer check takes a file's own version: a version 2 file passes with version 2's columns, fails
    naming the column if they are not that version's, and fails where the catalog records another version."""
    mixed_versions(kv_env, monkeypatch)
    info, placements = placement_files(kv_env.catalog, "kv", "primary")
    pf = placements[0]
    seg = pf.segments[-1]  # the version 2 segment on top of the chain
    footer = pq.read_metadata(pf.site.path(seg.relpath))
    schema = footer.schema.to_arrow_schema()
    expected = expected_segment(info, seg)
    entry = json.loads(footer.metadata[META_KEY])
    args = (seg.row_count, seg.byte_size)
    assert footer_differences(expected, entry, *args, schema) == []
    assert footer_differences(replace(expected, schema_version=2), entry, *args, schema) == []
    assert footer_differences(replace(expected, schema_version=1), entry, *args, schema) == [
        "it is at schema version 2 (the catalog says 1)"
    ]
    renamed = schema.set(0, schema.field(0).with_name("valu"))
    assert footer_differences(expected, entry, *args, renamed) == [
        "its columns are not the table's (column valu string where the table has value string)"
    ]
    assert footer_differences(expected, entry, *args, schema.with_metadata({b"segrep.schema": b"{"})) == [
        "its segment schema metadata is malformed: Expecting property name enclosed in double quotes: line 1 "
        "column 2 (char 1)"
    ]
