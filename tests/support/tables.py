"""Rows for the tables of ORDERS_YAML: `orders` (int key) and `events` (composite string key, tenants in both
partitions)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from decimal import Decimal

import pyarrow as pa

TABLE = "events"
REPLICAS = ("dr", "edge")
TENANTS = ("a", "b", "x", "y")  # 'a' and 'b' fall in partition [-inf, m), 'x' and 'y' in [m, +inf)


def orders(keys: list[int], status: str = "O", comment: str = "c") -> pa.Table:
    n = len(keys)
    return pa.table(
        {
            "o_orderkey": pa.array(keys, pa.int64()),
            "o_custkey": pa.array([k % 1000 for k in keys], pa.int64()),
            "o_orderstatus": [status] * n,
            "o_totalprice": pa.array([Decimal("1.25")] * n, pa.decimal128(15, 2)),
            "o_orderdate": pa.array([dt.date(1996, 1, 2)] * n, pa.date32()),
            "o_orderpriority": ["5-LOW"] * n,
            "o_clerk": ["Clerk#1"] * n,
            "o_shippriority": pa.array([0] * n, pa.int32()),
            "o_comment": [f"{comment}{k}" for k in keys],
        }
    )


def batch(keys: Iterable[int], tag: str) -> pa.Table:
    keys = list(keys)
    return pa.table(
        {
            "tenant": [TENANTS[k % len(TENANTS)] for k in keys],
            "seq": keys,
            "payload": [f"{tag}{k}" for k in keys],
            "at": pa.array([None] * len(keys), pa.timestamp("us")),
        }
    )
