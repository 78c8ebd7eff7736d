"""Row digests and the key bisection (DESIGN section 13): order-free, duplicate-sensitive, and a mismatch
narrowed down to exactly the keys that differ."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from segrep.data.digest import MOD, Digest, diff_keys, digest_of, row_hashes, table_digest


def rows(pairs: dict[tuple[str, int], str | None]) -> pa.Table:
    keys = sorted(pairs)
    return pa.table(
        {
            "tenant": pa.array([k[0] for k in keys], pa.string()),
            "seq": pa.array([k[1] for k in keys], pa.int64()),
            "payload": pa.array([pairs[k] for k in keys], pa.string()),
        }
    )


def test_the_digest_ignores_order_but_not_duplicates_or_nulls() -> None:
    t = rows({("a", i): f"p{i}" for i in range(50)})
    shuffled = t.take(pa.array(list(range(49, -1, -1))))
    assert table_digest(t) == table_digest(shuffled)
    doubled = pa.concat_tables([t.slice(0, 2), t.slice(0, 2)])
    assert table_digest(doubled) != table_digest(t.slice(0, 0))  # XOR would cancel the pairs to nothing
    assert table_digest(doubled).rows == 4
    # a null and the text a null could be mistaken for hash differently; so do shifted column boundaries
    assert table_digest(rows({("a", 1): None})) != table_digest(rows({("a", 1): "-"}))
    assert table_digest(rows({("a", 1): ""})) != table_digest(rows({("a", 1): None}))
    ab = pa.table({"x": ["ab"], "y": ["c"]})
    assert table_digest(ab) != table_digest(pa.table({"x": ["a"], "y": ["bc"]}))
    assert 0 <= table_digest(t).hash_sum < MOD
    assert digest_of(row_hashes(t.slice(0, 0))) == Digest(0, 0)


@given(
    base=st.dictionaries(st.tuples(st.sampled_from("abc"), st.integers(0, 300)), st.text(max_size=3), max_size=400),
    edits=st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 300), st.sampled_from(["del", "add", "chg"]))),
)
def test_bisection_finds_exactly_the_keys_that_differ(
    base: dict[tuple[str, int], str], edits: list[tuple[str, int, str]]
) -> None:
    other: dict[tuple[str, int], str | None] = dict(base)
    for tenant, seq, op in edits:
        key = (tenant, seq)
        if op == "del":
            other.pop(key, None)
        elif op == "add" and key not in other:
            other[key] = "new"
        elif op == "chg" and key in other:
            other[key] = (other[key] or "") + "!"
    left, right = rows(dict(base)), rows(other)
    diff = diff_keys(["tenant", "seq"], left, row_hashes(left), right, row_hashes(right), leaf_rows=4)

    def keyset(t: pa.Table) -> set[tuple[str, int]]:
        return {(r["tenant"], r["seq"]) for r in t.to_pylist()}

    assert keyset(diff.only_left) == base.keys() - other.keys()
    assert keyset(diff.only_right) == other.keys() - base.keys()
    assert keyset(diff.different) == {k for k in base.keys() & other.keys() if base[k] != other[k]}
    assert (diff.count == 0) == (table_digest(left) == table_digest(right))
