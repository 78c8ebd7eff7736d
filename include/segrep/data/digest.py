"""Order-free row digests and the bisection that turns a digest mismatch into keys (DESIGN section 13).

A digest is the row count plus the sum of 128-bit row hashes modulo 2**128: independent of row order, so two
sides can be digested however their files are laid out, and sensitive to duplicates (XOR would cancel a row
that appears twice). A row's hash is BLAKE2b-128 of a canonical encoding of its user columns: per column the
value's length, a colon and its text (Arrow's cast to string, the same for both sides of one comparison), or
``-`` for null, so no two different rows encode alike. Hashes are kept as four little-endian 32-bit limbs,
which sum exactly in 64-bit prefix sums for up to 2**32 rows: any key range's digest is then O(1).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MOD = 2**128
LEAF_ROWS = 64  # below this many rows a range is compared row by row instead of split again
_LIMB_SHIFTS = (0, 32, 64, 96)


@dataclass(frozen=True)
class Digest:
    rows: int
    hash_sum: int  # sum of the rows' 128-bit hashes mod 2**128

    def hex(self) -> str:
        return f"{self.rows}:{self.hash_sum:032x}"


def _encoded(col: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """``<length>:<value>`` per value as binary, ``-`` for null."""
    dtype = col.type
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        as_bin = col
    elif pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        as_bin = pc.cast(col, pa.binary() if pa.types.is_string(dtype) else pa.large_binary())
    else:
        as_bin = pc.cast(pc.cast(col, pa.string()), pa.binary())
    as_bin = pc.cast(as_bin, pa.binary())
    length = pc.cast(pc.cast(pc.binary_length(as_bin), pa.string()), pa.binary())
    joined = pc.binary_join_element_wise(length, as_bin, pa.scalar(b":", pa.binary()))
    return pc.fill_null(joined, pa.scalar(b"-", pa.binary()))


def row_hashes(rows: pa.Table, columns: Sequence[str] | None = None) -> np.ndarray:
    """Each row's 128-bit hash as four uint32 limbs (shape ``(n, 4)``), over ``columns`` in that order."""
    names = list(columns) if columns is not None else rows.column_names
    n = rows.num_rows
    if n == 0:
        return np.zeros((0, 4), dtype=np.uint32)
    parts = [_encoded(rows.column(name)) for name in names]
    line = pc.binary_join_element_wise(*parts, pa.scalar(b"", pa.binary()))
    if isinstance(line, pa.ChunkedArray):
        line = line.combine_chunks()
    blake = hashlib.blake2b
    raw = b"".join([blake(v, digest_size=16).digest() for v in line.to_pylist()])
    return np.frombuffer(raw, dtype="<u4").reshape(n, 4)


def _combine(limb_sums: np.ndarray) -> int:
    return sum(int(v) << shift for v, shift in zip(limb_sums.tolist(), _LIMB_SHIFTS, strict=True)) % MOD


def digest_of(hashes: np.ndarray) -> Digest:
    return Digest(int(hashes.shape[0]), _combine(hashes.astype(np.uint64).sum(axis=0)))


def table_digest(rows: pa.Table, columns: Sequence[str] | None = None) -> Digest:
    return digest_of(row_hashes(rows, columns))


def combine(digests: Iterable[Digest]) -> Digest:
    """The digest of disjoint row sets taken together: counts and hash sums add. How the Spark job joins the
    digests of its Arrow batches into the one this module would compute over all the rows at once."""
    parts = list(digests)
    return Digest(sum(d.rows for d in parts), sum(d.hash_sum for d in parts) % MOD)


@dataclass(frozen=True)
class KeyDiff:
    """Keys (as tables of the key columns) only on the left, only on the right, and on both with other
    values; ``ranges`` is how many key ranges the bisection compared."""

    only_left: pa.Table
    only_right: pa.Table
    different: pa.Table
    ranges: int

    @property
    def count(self) -> int:
        return int(self.only_left.num_rows + self.only_right.num_rows + self.different.num_rows)


def diff_keys(
    key_columns: Sequence[str],
    left: pa.Table,
    left_hashes: np.ndarray,
    right: pa.Table,
    right_hashes: np.ndarray,
    leaf_rows: int = LEAF_ROWS,
) -> KeyDiff:
    """Bisect primary-key ranges where the two sides' digests differ, down to rows.

    Both sides' keys are merged in key order (each side's keys are unique); a range is a slice of that order,
    cut only between different keys, so it is a key range on both sides at once. Ranges whose digests agree
    are done; the others are halved until they are small, then compared row by row."""
    names = list(key_columns)
    n_left, n_right = left.num_rows, right.num_rows
    side = np.concatenate([np.zeros(n_left, np.int8), np.ones(n_right, np.int8)])
    merged_keys = pa.concat_tables([left.select(names), right.select(names)])
    aux = merged_keys.append_column("__side", pa.array(side))
    order = pc.sort_indices(aux, sort_keys=[(k, "ascending") for k in names] + [("__side", "ascending")])
    order_np = order.to_numpy()
    side_m = side[order_np]
    hashes = np.concatenate([left_hashes, right_hashes]).astype(np.uint64)[order_np]
    n = len(order_np)
    same_as_next = np.zeros(n, dtype=bool)
    if n > 1:
        ordered = merged_keys.take(order)
        eq = np.ones(n - 1, dtype=bool)
        for name in names:
            col = ordered.column(name)
            eq &= pc.equal(col.slice(1), col.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        same_as_next[:-1] = eq
    is_left = side_m == 0
    zero = np.zeros((1, 4), np.uint64)
    cum_left = np.concatenate([zero, np.cumsum(hashes * is_left[:, None], axis=0)])
    cum_right = np.concatenate([zero, np.cumsum(hashes * ~is_left[:, None], axis=0)])
    cnt_left = np.concatenate([[0], np.cumsum(is_left)])
    cnt_right = np.concatenate([[0], np.cumsum(~is_left)])

    def agree(a: int, b: int) -> bool:
        if cnt_left[b] - cnt_left[a] != cnt_right[b] - cnt_right[a]:
            return False
        return _combine(cum_left[b] - cum_left[a]) == _combine(cum_right[b] - cum_right[a])

    only_l: list[int] = []
    only_r: list[int] = []
    diff: list[int] = []
    ranges = 0
    stack = [(0, n)]
    while stack:
        a, b = stack.pop()
        ranges += 1
        if a >= b or agree(a, b):
            continue
        mid = (a + b) // 2
        if mid > a and same_as_next[mid - 1]:
            mid += 1  # never cut between the two sides' rows of one key
        if b - a > leaf_rows and a < mid < b:
            stack += [(mid, b), (a, mid)]
            continue
        i = a
        while i < b:
            if i + 1 < b and same_as_next[i]:
                if not np.array_equal(hashes[i], hashes[i + 1]):
                    diff.append(i)
                i += 2
            else:
                (only_l if is_left[i] else only_r).append(i)
                i += 1
    keyed = merged_keys.take(order)

    def pick(idx: list[int]) -> pa.Table:
        return keyed.take(pa.array(sorted(idx), pa.int64()))

    return KeyDiff(pick(only_l), pick(only_r), pick(diff), ranges)
