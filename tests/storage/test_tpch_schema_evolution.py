"""Issue 35 item 6: TPC-H `orders` (tpchgen-cli, scale 0.01, three partitions) led by a local `primary` and
replicated to `dr`, a site on an S3-compatible store (moto on loopback), while its schema changes under it.

Rounds run between every step, and one is in flight across each change (planned before `segrep apply`,
finished after it). Three changes through `segrep apply` of the definitions file: a column added with a
default (`o_channel`, 'web'), one widened (`o_shippriority` int32 -> int64), one renamed (`o_comment` ->
`o_note`, `renamed_from`). At every version rows are written by a writer at that version and by one still at
the previous version, with updates of older rows and, at the end, deletes. After each step `dr` reads exactly
the rows an independent model of the writes gives (the default for rows written before the column existed,
widened values, the new name), equal to the leader's. A schema change costs no copy: the round across it moves
exactly the segments written before it, the round after the next writes moves exactly those writes' segments
(bytes in the round's report = their sizes), every file arrives byte for byte, and no object already at `dr`
is written again. Changes `segrep apply` refuses (a decimal narrowed, an int64 made int32) exit 2 with one
line naming the column and the change, and leave the catalog, `primary` and `dr` as they were. At the end,
reads as of each earlier step give that step's rows at the newest schema, and `segrep verify --files` finds
`dr` equal to the leader and every file as the catalog records it.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.data import demo as demo_data
from segrep.data.reader import read_table
from segrep.data.writer import WriteResult, write_batch
from segrep.replication.orchestrator import RoundSteps, run_round
from segrep.replication.reports import RoundReport, RoundStatus
from tests.support.badinput import assert_user_error, unchanged
from tests.support.cli import cli
from tests.support.env import ORDERS_YAML, Env, make_env
from tests.support.rounds import no_spark
from tests.support.s3 import BUCKETS, S3Endpoint, use_site_keys

pytestmark = pytest.mark.slow  # TPC-H data from tpchgen-cli

Endpoints = tuple[S3Endpoint, S3Endpoint]
TABLE = "orders"
KEY = "o_orderkey"
SPLIT_POINTS = [20000, 40000]  # sf 0.01 keys run to 60,000: three partitions
V1: dict[str, Any] = yaml.safe_load(ORDERS_YAML)["tables"]["orders"]["columns"]
V2 = {**V1, "o_channel": {"type": "string", "default": "web"}}  # added, with a default
V3 = {**V2, "o_shippriority": "int64"}  # widened
V4 = {  # renamed, in its place
    (k if k != "o_comment" else "o_note"): (v if k != "o_comment" else {"type": "string", "renamed_from": k})
    for k, v in V3.items()
}
CHANGES = [("add o_channel", V2), ("widen o_shippriority", V3), ("rename o_comment", V4)]
REFUSED = [
    ({**V4, "o_totalprice": "decimal(12,2)"}, ["column o_totalprice", "decimal(15,2) -> decimal(12,2)"]),
    ({**V4, "o_custkey": "int32"}, ["column o_custkey", "int64 -> int32", "segrep table rewrite"]),
]
CHUNKS = 10  # the source cut in ten: one written first, then three per change (in flight, new writer, old writer)


def definitions(a: S3Endpoint, prefix: str, columns: dict[str, Any]) -> str:
    """`orders` with ``columns``, led by the local `primary`, replicated to `dr` on endpoint ``a``."""
    orders = yaml.safe_load(ORDERS_YAML)["tables"]["orders"]
    orders.update(columns=columns, split_points=SPLIT_POINTS, replicas=["dr"], policy={"retry_delay_s": 0})
    dr = {
        "id": 2,
        "uri": f"s3://{BUCKETS[0]}/{prefix}/dr",
        "storage_options": {"endpoint": a.url, "region": a.region, "connect_timeout_s": 2, "retries": 1},
        "credentials": {"env_prefix": "DR_S3"},
    }
    doc = {"data_dir": "data", "sites": {"primary": {"id": 1, "uri": "sites/primary"}, "dr": dr}, "tables": {}}
    doc["tables"][TABLE] = orders
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.fixture(scope="module")
def tpch_orders(tmp_path_factory: pytest.TempPathFactory) -> pa.Table:
    path = demo_data.generate_tpch("orders", 0.01, tmp_path_factory.mktemp("tpch") / "sf0.01")
    return demo_data.normalized(pq.read_table(path)).sort_by(KEY)


@pytest.fixture
def evolving_env(
    s3_endpoints: Endpoints, catalog_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Env, str]]:
    """The environment at version 1 and a fresh key prefix for `dr` on endpoint a (its keys by reference)."""
    a, _ = s3_endpoints
    use_site_keys(monkeypatch, DR_S3=a)
    prefix = uuid.uuid4().hex[:12]
    env = make_env(tmp_path, catalog_url, definitions(a, prefix, V1))
    yield env, prefix
    env.catalog.dispose()


# -- the rows, written at a version and expected back -------------------------------------------------------------


class Model:
    """What the writes leave, independent of segrep: key -> the row in the newest names (o_note, o_channel)."""

    def __init__(self, rows: dict[int, dict[str, Any]] | None = None) -> None:
        self.rows: dict[int, dict[str, Any]] = dict(rows or {})

    def upsert(self, batch: pa.Table) -> None:
        for row in batch.to_pylist():
            row = {("o_note" if k == "o_comment" else k): v for k, v in row.items()}
            row.setdefault("o_channel", "web")  # a writer before the column existed: its default
            self.rows[row[KEY]] = row

    def delete(self, keys: list[int]) -> None:
        for k in keys:
            del self.rows[k]

    def expected(self, source: pa.Schema, version: int) -> pa.Table:
        """The rows as a reader at ``version`` (1..4) sees them: its names, its types, its column order."""
        fields = []
        for f in source:
            if f.name == "o_shippriority" and version >= 3:
                f = f.with_type(pa.int64())
            if f.name == "o_comment" and version >= 4:
                f = f.with_name("o_note")
            fields.append(f)
        if version >= 2:
            fields.append(pa.field("o_channel", pa.string()))
        schema = pa.schema(fields)
        rename = {} if version >= 4 else {"o_note": "o_comment"}
        rows = [{rename.get(k, k): v for k, v in self.rows[key].items()} for key in sorted(self.rows)]
        return pa.Table.from_pylist(rows, schema=schema)


def at_version(rows: pa.Table, version: int, tag: str) -> pa.Table:
    """TPC-H rows as a writer at ``version`` sends them. From version 2 each row has a channel (``tag``'s);
    the shipping priority (0 in TPC-H) is the key mod 7, from version 3 past int32 (the widened column); from
    version 4 the comment is o_note."""
    keys = rows[KEY].to_numpy()
    if version >= 2:
        rows = rows.append_column("o_channel", pa.array([f"{tag}-{k % 3}" for k in keys], pa.string()))
    if version >= 3:
        i = rows.schema.get_field_index("o_shippriority")
        rows = rows.set_column(i, "o_shippriority", pa.array(keys + 2**33, pa.int64()))
    else:
        i = rows.schema.get_field_index("o_shippriority")
        rows = rows.set_column(i, "o_shippriority", pa.array(keys % 7, pa.int32()))
    if version >= 4:
        rows = rows.rename_columns([("o_note" if c == "o_comment" else c) for c in rows.column_names])
    return rows


def updated(rows: pa.Table, tag: str) -> pa.Table:
    """The same orders, changed: status 'U' and a new comment."""
    rows = rows.set_column(rows.schema.get_field_index("o_orderstatus"), "o_orderstatus", pa.array(["U"] * len(rows)))
    comments = pa.array([f"{tag} update of {k}" for k in rows[KEY].to_pylist()])
    return rows.set_column(rows.schema.get_field_index("o_comment"), "o_comment", comments)


# -- what the sites hold ------------------------------------------------------------------------------------------


def dr_uri(env: Env) -> str:
    return env.defs.site("dr").uri


def relpaths(env: Env, written: list[WriteResult]) -> dict[str, str]:
    """segment id -> relpath of the segments the writes made (at the leader)."""
    ids = [seg.segment_id for r in written for seg in r.segments]
    with env.catalog.read() as s:
        rows = s.execute(select(m.Segment.segment_id, m.Segment.relpath).where(m.Segment.segment_id.in_(ids))).all()
    return dict(rows)


def schema_versions_at(env: Env, site: str, ids: list[str]) -> set[int]:
    with env.catalog.read() as s:
        return set(
            s.scalars(
                select(m.Segment.schema_version)
                .join(m.Placement, m.Placement.placement_id == m.Segment.placement_id)
                .join(m.Site, m.Site.site_id == m.Placement.site_id)
                .where(m.Site.name == site, m.Segment.segment_id.in_(ids))
            )
        )


def rounds_until_idle(env: Env, max_rounds: int = 4) -> list[RoundReport]:
    reports = []
    for _ in range(max_rounds):
        rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
        assert rep.status == RoundStatus.OK, str(rep)
        reports.append(rep)
        if not rep.targets["dr"].segments_copied:
            return reports
    pytest.fail(f"no idle round after {max_rounds}: {[str(r) for r in reports]}")


def assert_copied_exactly(
    env: Env, a: S3Endpoint, report: RoundReport, written: list[WriteResult], before: dict[str, Any]
) -> None:
    """The round moved exactly the writes' segments (count and bytes), each arrived byte for byte under its
    relpath, and every object `dr` held before is still there, unchanged (no segment rewritten)."""
    segs = [seg for r in written for seg in r.segments]
    dr = report.targets["dr"]
    assert report.status == RoundStatus.OK, str(report)
    assert (dr.segments_copied, dr.bytes_copied) == (len(segs), sum(seg.byte_size for seg in segs)), str(report)
    after = a.objects(dr_uri(env))
    assert {k: after[k] for k in before} == before, "an object at dr was written again"
    root = dr_uri(env).removeprefix(f"s3://{BUCKETS[0]}/")
    new = {f"{root}/{rel}" for rel in relpaths(env, written).values()}
    assert set(after) - set(before) == new
    for key in new:
        local = (env.site_dir("primary") / key.removeprefix(f"{root}/")).read_bytes()
        assert after[key][:2] == (len(local), f'"{hashlib.md5(local).hexdigest()}"'), key  # the same bytes


def assert_dr_reads(env: Env, model: Model, source: pa.Schema, version: int, as_of: int | None = None) -> None:
    expected = model.expected(source, version)
    leader = read_table(env.catalog, TABLE, as_of=as_of).sort_by(KEY)
    dr = read_table(env.catalog, TABLE, "dr", as_of=as_of).sort_by(KEY)
    assert dr.column_names == expected.column_names
    assert dr.equals(expected), f"dr: {dr.num_rows} rows, expected {expected.num_rows}"
    assert leader.equals(dr)


def write(env: Env, model: Model, rows: pa.Table, batch_version: int, current: int) -> WriteResult:
    result = write_batch(env.catalog, TABLE, rows)
    assert (result.batch_version, result.stored_version, result.rows_written) == (batch_version, current, len(rows))
    model.upsert(rows)
    return result


# -- the test -----------------------------------------------------------------------------------------------------


def test_orders_replicate_to_s3_while_columns_are_added_widened_and_renamed(
    evolving_env: tuple[Env, str], s3_endpoints: Endpoints, tpch_orders: pa.Table
) -> None:
    env, prefix = evolving_env
    a, _ = s3_endpoints
    chunks = [tpch_orders.take(pa.array(idx)) for idx in np.array_split(np.arange(len(tpch_orders)), CHUNKS)]
    model = Model()
    history: list[tuple[int, Model]] = []  # (version of the last write, the model then) after each step
    first = write(env, model, at_version(chunks[0], 1, "v1"), 1, 1)
    history.append((first.committed_us or 0, Model(model.rows)))
    rounds_until_idle(env)
    assert_dr_reads(env, model, tpch_orders.schema, 1)
    previous = V1
    for version, (change, columns) in enumerate(CHANGES, start=2):
        old = version - 1
        # an old writer's batch of the current names (a widening only) is the current version's, converted
        old_seen_as = version if list(previous) == list(columns) else old
        previous = columns
        in_flight, new_rows, old_rows = chunks[3 * version - 5 : 3 * version - 2]
        # a write at the old version, then a round planned before the change and finished after it
        before = a.objects(dr_uri(env))
        carried = [write(env, model, at_version(in_flight, old, f"v{old}"), old, old)]
        steps = RoundSteps(env.catalog, env.defs, TABLE, submit=no_spark)
        planned = steps.plan()
        env.config.write_text(definitions(a, prefix, columns))
        code, out, err = cli(env, "apply")
        assert code == 0 and f"table {TABLE}" in out, (change, out, err)
        assert_copied_exactly(env, a, steps.execute(planned), carried, before)
        assert rounds_until_idle(env)[0].targets["dr"].bytes_copied == 0  # the change itself moves nothing
        assert_dr_reads(env, model, tpch_orders.schema, version)

        # writes at the new version (with updates of older rows) and by a writer still at the old one
        before = a.objects(dr_uri(env))
        earlier = tpch_orders.take(pa.array(np.arange(0, 3 * version * 500, 7)))  # rows of earlier chunks
        fresh = pa.concat_tables([new_rows, updated(earlier, f"v{version}")])
        writes = [
            write(env, model, at_version(fresh, version, f"v{version}"), version, version),
            write(env, model, at_version(old_rows, old, f"v{old}"), old_seen_as, version),
        ]
        if version == 4:  # and deletes of rows of every version
            gone = sorted(model.rows)[::97]
            writes.append(write_batch(env.catalog, TABLE, pa.table({KEY: pa.array(gone, pa.int64())}), delete=True))
            model.delete(gone)
        reports = rounds_until_idle(env)
        assert_copied_exactly(env, a, reports[0], writes, before)
        ids = [seg.segment_id for r in writes for seg in r.segments]
        assert schema_versions_at(env, "dr", ids) == {version}  # stored at the current version, copied as such
        assert_dr_reads(env, model, tpch_orders.schema, version)
        history.append((max(r.committed_us or 0 for r in writes), Model(model.rows)))

    # refused changes: one clear line, and nothing written to the catalog, primary or dr
    for columns, needles in REFUSED:
        env.config.write_text(definitions(a, prefix, columns))
        before = a.objects(dr_uri(env))
        with unchanged(env):
            code, out, err = cli(env, "apply")
        assert_user_error(code, out, err, *needles)
        assert a.objects(dr_uri(env)) == before
    env.config.write_text(definitions(a, prefix, V4))
    code, out, err = cli(env, "apply")
    assert code == 0 and "nothing to change" in out, (out, err)
    assert rounds_until_idle(env)[0].targets["dr"].bytes_copied == 0
    assert_dr_reads(env, model, tpch_orders.schema, 4)
    # as of each earlier step, the rows then, read at the current version; and verify finds nothing
    for as_of, then in history:
        assert_dr_reads(env, then, tpch_orders.schema, 4, as_of=as_of)
    code, out, err = cli(env, "verify", TABLE, "--files")
    assert code == 0 and "all equal" in out and ", 0 bad" in out, (out, err)
