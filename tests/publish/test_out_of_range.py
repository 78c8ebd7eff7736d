"""The rows of a file outside every key range it is read through are hidden by position (``out_of_range``)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from segrep.publish.hidden_rows import FILE_COL, POS_COL, out_of_range


def _rows(keys: list[Any], key_type: pa.DataType) -> pa.Table:
    return pa.table(
        {
            "k": pa.array(keys, key_type),
            FILE_COL: pa.array(["p/f.parquet"] * len(keys)),
            POS_COL: pa.array(range(len(keys)), pa.int64()),
        }
    )


@pytest.mark.parametrize(
    ("ranges", "kept"),
    [
        ([(10, 20)], [10, 15, 19]),  # begin inclusive, end exclusive
        ([(None, 10)], [5, 9]),  # a null key is inside no range
        ([(20, None)], [20, 25]),
        ([(None, 10), (20, None)], [5, 9, 20, 25]),  # a split's unloading parent: read through two ranges
        ([(10, 20), (None, None)], [5, 9, 10, 15, 19, 20, 25, None]),  # one range unbounded: every row
        ([], [5, 9, 10, 15, 19, 20, 25, None]),  # read through no bounded range: nothing to hide
    ],
)
def test_rows_outside_the_ranges_are_hidden_at_their_positions(ranges: list[Any], kept: list[Any]) -> None:
    keys = [5, 9, 10, 15, 19, 20, 25, None]
    inside, hidden = out_of_range(_rows(keys, pa.int64()), "k", pa.int64(), ranges)
    assert inside.column("k").to_pylist() == kept
    assert hidden.column_names == [FILE_COL, POS_COL]
    assert hidden.column(POS_COL).to_pylist() == [i for i, k in enumerate(keys) if k not in kept]


def test_string_keys_compare_as_the_table_orders_them() -> None:
    inside, hidden = out_of_range(_rows(["a", "m", "mm", "z"], pa.string()), "k", pa.string(), [("m", "z")])
    assert inside.column("k").to_pylist() == ["m", "mm"]
    assert hidden.column(POS_COL).to_pylist() == [0, 3]
