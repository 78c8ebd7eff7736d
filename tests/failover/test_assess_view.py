"""The assessment's lean read (failover/assess.py ``read_view``): its walks over the segment rows as read are
core.chain's walks, and its begin keys order partitions as ``queries.sort_partitions`` does.

The read keeps each segment entry as the row it fetched (no SegmentRef, no Chain per placement) for speed at
10,000 partitions, so these check it against the core functions it stands for, on generated chains.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.core import keys
from segrep.core.chain import Chain, SegmentRef, is_referenced, visible_segments
from segrep.core.projection import ReadVersions
from segrep.core.schema_versions import first_version
from segrep.failover.assess import PlacementRow, _begin_keys, _json_values, _Part
from tests.support.chains import Built, built_chains

IDS = [f"s{i}" for i in range(12)]


@st.composite
def any_chains(draw: st.DrawFn) -> Chain:
    """Lists as a catalog may hold them, not only as operations build them: bases missing from the list,
    cycles, majors folding any ids (some on the list), a root that is not on the list or none."""
    listed = draw(st.lists(st.sampled_from(IDS), unique=True, max_size=10))
    refs = []
    for seg_id in listed:
        major = draw(st.booleans())
        included = tuple(draw(st.lists(st.sampled_from(IDS), max_size=4)))  # majors and merge outputs
        refs.append(SegmentRef(seg_id, draw(st.none() | st.sampled_from(IDS)), included, major))
    return Chain.of(refs, draw(st.none() | st.sampled_from(IDS)))


def rows_of(placement_id: int, chain: Chain) -> dict[str, Any]:
    """The chain's entries as read_view reads them: (placement, id, base, included as JSON text (a major's
    folded ids, a merge output's merged ones), is_major, rows, bytes, min version, max version)."""
    out = {}
    for n, ref in enumerate(chain.segments):
        folded = json.dumps(list(ref.included_segment_ids))
        out[ref.segment_id] = (placement_id, ref.segment_id, ref.base_segment_id, folded, ref.is_major, n, 10 * n, n, n)
    return out


def part_of(leader: Chain, replica: Chain) -> tuple[_Part, PlacementRow, PlacementRow]:
    lead = PlacementRow(1, 7, 1, "LIVE", leader.root, False)
    rep = PlacementRow(2, 7, 2, "LIVE", replica.root, False)
    lists = {1: rows_of(1, leader), 2: rows_of(2, replica)}
    texts = [x[3] for rows in lists.values() for x in rows.values() if x[3] is not None]
    folded = {text: tuple(ids) for text, ids in zip(texts, _json_values(texts), strict=True)}
    return _Part(7, lead, [rep], {2: rep}, lists, folded), lead, rep


def check(leader: Chain, replica: Chain) -> None:
    part, _, rep = part_of(leader, replica)
    assert [x[1] for x in part.walk(rep)] == [r.segment_id for r in replica.walk()]
    assert [x[1] for x in part.leader_visible] == [r.segment_id for r in visible_segments(leader)]
    seen = replica
    listed = [*replica.segments, *leader.segments]
    # every id the chains name: listed, or only folded into a segment (a merge output names what it merged)
    universe = set(IDS) | {r.segment_id for r in listed} | {x for r in listed for x in r.included_segment_ids}
    assert part.referenced(rep) == {x for x in universe if is_referenced(seen, x)}
    assert part.referenced(rep) is part.referenced(rep)  # walked once


@settings(max_examples=300, deadline=None)
@given(any_chains(), any_chains())
def test_walks_over_rows_are_the_core_walks(leader: Chain, replica: Chain) -> None:
    check(leader, replica)


@settings(max_examples=100, deadline=None)
@given(built_chains(), built_chains())
def test_walks_over_built_chains_are_the_core_walks(leader: Built, replica: Built) -> None:
    check(leader.chain, replica.chain)


def test_a_placement_with_no_entries_or_no_root_walks_nothing() -> None:
    part, lead, _ = part_of(Chain.of((), None), Chain.of((), "gone"))
    assert list(part.walk(lead)) == [] and part.leader_visible == [] and part.referenced(part.replicas[0]) == set()


def test_json_values_decode_as_one_value_per_text() -> None:
    texts = ["600", None, "null", '"2024-01-02"', '["a", "b"]', "1.5"]
    assert _json_values(texts) == [600, None, None, "2024-01-02", ["a", "b"], 1.5]
    assert _json_values([]) == []


def info_for(type_name: str) -> q.TableInfo:
    row = m.Table(name="t", columns={"k": type_name}, primary_key=["k"], partition_key="k")
    version = first_version(row.columns)
    return q.TableInfo(row, version.arrow(), ReadVersions(version, version))


@pytest.mark.parametrize(
    ("type_name", "values"),
    [
        ("int64", [None, 600, -5, 2**62, 0]),
        ("int32", [7, None, -(2**31)]),
        ("float64", [1.5, 2, None, -0.25]),
        ("string", ["b", "a", None, ""]),
        ("date", [dt.date(2024, 1, 2), dt.date(1999, 12, 31), None]),
        ("timestamp", [dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC), None]),
        ("decimal(15,2)", [decimal.Decimal("1.50"), decimal.Decimal("-3.25"), None]),
        ("binary", [b"\x00\xff", None, b""]),
        ("bool", [True, None, False]),
    ],
)
def test_begin_keys_are_decoded_as_decode_key_does(type_name: str, values: list[Any]) -> None:
    info = info_for(type_name)
    raw = [None if v is None else json.loads(json.dumps(keys.encode(v))) for v in values]
    assert _begin_keys(info, raw) == [0 if v is None else info.decode_key(v) for v in raw]


def test_begin_keys_fall_back_to_one_key_at_a_time() -> None:
    info = info_for("int64")
    with pytest.raises(Exception) as one:  # whatever decode_key raises, the read raises too
        info.decode_key("not a number")
    with pytest.raises(type(one.value)):
        _begin_keys(info, [1, "not a number"])
