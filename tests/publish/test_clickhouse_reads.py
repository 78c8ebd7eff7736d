"""Open tables (issue 37) read by an engine that is not pyiceberg: ClickHouse, embedded (chDB).

ClickHouse reads an Iceberg table from its files alone (``icebergLocal`` for a local site, ``icebergS3`` with
the store's endpoint and keys): its own Avro, manifest and Parquet readers, its own application of position
deletes and of field ids, nothing of pyiceberg. Each site's table (`primary` local, `dr` and `edge` on two S3
endpoints with their own keys) must then hold exactly what ``segrep read --site`` serves, after updates,
deletes and a column renamed with ``renamed_from``.

A column added with a default too: Iceberg format v2 has no column defaults (``initial-default`` is format v3),
and ClickHouse reads a column a data file lacks as null; the files written before the column existed are
published as copies with the default filled in (``publish.filled_copies``), so it reads the default there.

chDB is pinned in requirements.txt (the module fails, never skips, without it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import chdb
import pyarrow as pa
import pytest

from segrep.data.reader import read_table
from segrep.data.writer import write_batch
from segrep.publish import iceberg_files
from segrep.replication.orchestrator import run_round
from tests.support.cli import cli
from tests.support.env import Env
from tests.support.iceberg import loaded
from tests.support.rounds import no_spark
from tests.support.s3 import S3Endpoint
from tests.support.tables import TABLE, batch

KEYS = ("tenant", "seq")
COLUMNS = "    columns: {tenant: string, seq: int64, payload: string, at: timestamp}\n"
RENAMED = "    columns: {tenant: string, seq: int64, body: {type: string, renamed_from: payload}, at: timestamp}\n"
ADDED = (
    "    columns:\n      tenant: string\n      seq: int64\n      body: {type: string, renamed_from: payload}\n"
    "      at: timestamp\n      channel: {type: string, default: web}\n"
)


@pytest.fixture
def clickhouse(s3_env: Env, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """s3_env's `events` published, and a ClickHouse session allowed to read local files under the
    environment's root (ClickHouse reads local files only under its ``user_files_path``: the working
    directory)."""
    s3_env.config.write_text(
        s3_env.config.read_text().replace(
            "policy: {retry_delay_s: 0}", "policy: {publish: iceberg, retry_delay_s: 0}", 1
        )
    )
    monkeypatch.chdir(s3_env.root)
    con = chdb.connect(":memory:")
    yield con
    con.close()
    s3_env.catalog.dispose()


def source(env: Env, site: str, endpoint: S3Endpoint | None) -> str:
    """The ClickHouse table function reading ``site``'s published table (the newest metadata file)."""
    props = {} if endpoint is None else reader_props(endpoint)
    tbl, _ = loaded(env.url, site, TABLE, **props)
    if endpoint is None:
        return f"icebergLocal('{tbl.location().removeprefix('file://')}')"
    url = f"{endpoint.url}/{tbl.location().removeprefix('s3://')}/"
    return f"icebergS3('{url}', '{endpoint.access_key}', '{endpoint.secret_key}')"


def reader_props(endpoint: S3Endpoint) -> dict[str, str]:
    return {
        "s3.endpoint": endpoint.url,
        "s3.region": endpoint.region,
        "s3.access-key-id": endpoint.access_key,
        "s3.secret-access-key": endpoint.secret_key,
    }


def assert_clickhouse_reads(env: Env, con: Any, endpoints: tuple[S3Endpoint, S3Endpoint]) -> None:
    a, b = endpoints
    for site, endpoint in (("primary", None), ("dr", a), ("edge", b)):
        want = read_table(env.catalog, TABLE, site).sort_by([(k, "ascending") for k in KEYS])
        got = con.query(f"SELECT * FROM {source(env, site, endpoint)} ORDER BY tenant, seq", "ArrowTable")
        assert got.column_names == want.column_names, site
        assert got.cast(want.schema).equals(want), (
            f"{site}: ClickHouse reads {got.num_rows} rows, {want.num_rows} served"
        )


def write_and_round(env: Env) -> None:
    write_batch(env.catalog, TABLE, batch(range(0, 30), "v1"))
    write_batch(env.catalog, TABLE, batch(range(5, 15), "v2"))  # updates: the old rows hidden by position
    write_batch(env.catalog, TABLE, batch(range(20, 25), "").select(list(KEYS)), delete=True)  # tombstones
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)


def apply(env: Env, columns: str) -> None:
    env.config.write_text(env.config.read_text().replace(COLUMNS, columns, 1))
    code, _out, err = cli(env, "apply")
    assert code == 0, err


@pytest.mark.parametrize("own_rows", [iceberg_files.OWN_DELETE_FILE_ROWS, 1], ids=["shared-deletes", "own-deletes"])
def test_clickhouse_reads_every_site_as_segrep_serves_it(
    s3_env: Env,
    clickhouse: Any,
    s3_endpoints: tuple[S3Endpoint, S3Endpoint],
    own_rows: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the position deletes in one file shared by the data files, and in a file of its own for each."""
    monkeypatch.setattr(iceberg_files, "OWN_DELETE_FILE_ROWS", own_rows)
    env = s3_env
    write_and_round(env)
    assert_clickhouse_reads(env, clickhouse, s3_endpoints)
    apply(env, RENAMED)  # old files: payload, read by its field id as body
    new = batch(range(25, 35), "v3").rename_columns(["tenant", "seq", "body", "at"])
    write_batch(env.catalog, TABLE, new)
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert_clickhouse_reads(env, clickhouse, s3_endpoints)


def test_clickhouse_reads_an_added_columns_default(
    s3_env: Env, clickhouse: Any, s3_endpoints: tuple[S3Endpoint, S3Endpoint]
) -> None:
    env = s3_env
    write_and_round(env)
    apply(env, ADDED)
    new = batch(range(25, 35), "v3").rename_columns(["tenant", "seq", "body", "at"])
    write_batch(env.catalog, TABLE, new.append_column("channel", pa.array(["app"] * new.num_rows)))
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert_clickhouse_reads(env, clickhouse, s3_endpoints)
