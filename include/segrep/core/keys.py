"""Key values as JSON for the catalog and segment metadata, and back to the column's type.

Partition bounds and segment key ranges are stored as JSON; dates, decimals and timestamps travel as ISO
strings and are restored by casting to the key column's Arrow type.
"""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import pyarrow as pa


def encode(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    return value


def decode(value: Any, dtype: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_binary(dtype):
        return bytes.fromhex(value)
    return pa.array([value]).cast(dtype).to_pylist()[0]
