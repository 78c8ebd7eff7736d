"""A table whose segments were written at two schema versions (issue 35), for the paths that must read both:
splits, rollback files, bootstrap adoption (tests/split/test_split_versions.py,
tests/failover/test_rollback_versions.py, tests/maintenance/test_bootstrap_versions.py).

`mixed` (key tenant, seq; two partitions split at "m") starts at version 1: payload string, n int16. Version 2
(through the definitions file and `apply_definitions`, as an operator changes it): payload renamed to body,
n widened to int64, note added with the default "-". `Oracle` applies the same changes to plain dicts.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from segrep.catalog.apply import apply_definitions
from segrep.catalog.queries import table_info
from segrep.core.schema_versions import SchemaVersion, version_of_file
from segrep.data.writer import write_batch
from tests.support.env import KV_YAML, Env

MIXED = "mixed"
# the sites of KV_YAML (primary, dr, edge), the one table `mixed`
MIXED_YAML = (
    KV_YAML[: KV_YAML.index("tables:\n")]
    + """tables:
  mixed:
    columns: {tenant: string, seq: int64, payload: string, n: int16}
    primary_key: [tenant, seq]
    partition_key: tenant
    split_points: [m]
    leader: primary
    replicas: [dr]
    policy: {retry_delay_s: 0}
"""
)
V1_COLUMNS = "    columns: {tenant: string, seq: int64, payload: string, n: int16}\n"
V2_COLUMNS = (
    "    columns:\n"
    "      tenant: string\n"
    "      seq: int64\n"
    "      body: {type: string, renamed_from: payload}\n"
    "      n: int64\n"
    "      note: {type: string, default: '-'}\n"
)
V2_NAMES = ["tenant", "seq", "body", "n", "note"]
TENANTS = ("a", "b", "x")  # "a" and "b" in the first partition (split at "b" by the split test), "x" in the second
BIG = 2**40  # a value only the widened n holds


def tenant(k: int) -> str:
    return TENANTS[k % len(TENANTS)]


def at_version_2(env: Env, yaml_text: str | None = None) -> SchemaVersion:
    """The schema change through the definitions file and apply; returns the table's new current version."""
    env.config.write_text((yaml_text or env.config.read_text()).replace(V1_COLUMNS, V2_COLUMNS))
    apply_definitions(env.catalog, env.defs)
    version = current_version(env)
    assert version.version == 2 and [c.name for c in version.columns] == V2_NAMES, version
    return version


def current_version(env: Env) -> SchemaVersion:
    with env.catalog.read() as s:
        return table_info(s, MIXED).versions.target


class Oracle:
    """What the table holds at version 2, from the batches written: (tenant, seq) -> row as version 2 reads it."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, int], dict[str, Any]] = {}

    def v1(self, env: Env, keys: Iterable[int], tag: str) -> None:
        """A write at version 1's columns (before the change, or a writer not yet redeployed)."""
        keys = list(keys)
        write_batch(
            env.catalog,
            MIXED,
            pa.table(
                {
                    "tenant": [tenant(k) for k in keys],
                    "seq": pa.array(keys, pa.int64()),
                    "payload": [f"{tag}{k}" for k in keys],
                    "n": pa.array([k * 10 for k in keys], pa.int16()),
                }
            ),
        )
        for k in keys:  # the change on a dict: payload is body, n widened, note the default
            self.rows[(tenant(k), k)] = {"tenant": tenant(k), "seq": k, "body": f"{tag}{k}", "n": k * 10, "note": "-"}

    def v2(self, env: Env, keys: Iterable[int], tag: str) -> None:
        """A write at version 2's columns, with values version 1 could not hold."""
        keys = list(keys)
        rows = [{"tenant": tenant(k), "seq": k, "body": f"{tag}{k}", "n": BIG + k, "note": f"n{k}"} for k in keys]
        write_batch(env.catalog, MIXED, pa.Table.from_pylist(rows, schema=v2_arrow()))
        self.rows.update({(r["tenant"], r["seq"]): r for r in rows})

    def delete(self, env: Env, keys: Iterable[int]) -> None:
        keys = list(keys)
        batch = pa.table({"tenant": [tenant(k) for k in keys], "seq": pa.array(keys, pa.int64())})
        write_batch(env.catalog, MIXED, batch, delete=True)
        for k in keys:
            self.rows.pop((tenant(k), k), None)

    def expected(self) -> list[dict[str, Any]]:
        return sorted(self.rows.values(), key=lambda r: (r["tenant"], r["seq"]))


def v2_arrow() -> pa.Schema:
    return pa.schema(
        [("tenant", pa.string()), ("seq", pa.int64()), ("body", pa.string()), ("n", pa.int64()), ("note", pa.string())]
    )


def mixed_history(env: Env) -> Oracle:
    """Segments of both versions in both partitions: version 1 writes (an update, a delete), the change, then
    version 2 writes (updates of version 1 rows, new rows, a delete) and one more write at version 1's columns
    (a writer not yet redeployed). Nothing replicated yet."""
    oracle = Oracle()
    oracle.v1(env, range(0, 30), "a")
    oracle.v1(env, range(10, 20), "b")
    oracle.delete(env, [0, 1])
    at_version_2(env)
    oracle.v2(env, range(15, 35), "c")
    oracle.delete(env, [2, 16])
    oracle.v1(env, [3, 40], "old")
    return oracle


def as_rows(t: pa.Table) -> list[dict[str, Any]]:
    """Rows in key order (the version 2 columns, in that order)."""
    assert t.column_names == V2_NAMES, t.column_names
    return sorted(t.to_pylist(), key=lambda r: (r["tenant"], r["seq"]))


def assert_file_at(path: Path, version: SchemaVersion) -> None:
    """A file written at ``version``: its own schema metadata says so, with the version's columns (names, types,
    field ids) first."""
    schema = pq.read_schema(path)
    assert version_of_file(schema) == version, path
    layout = version.segment_arrow()
    assert schema.names == layout.names, (path, schema.names)
    n = len(version.columns)
    assert [(f.type, f.metadata) for f in schema][:n] == [(f.type, f.metadata) for f in layout][:n], path
