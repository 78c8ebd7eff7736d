"""Issue 37 item 3: the published Iceberg tables verified by real readers, on TPC-H `orders`.

`orders` (tpchgen-cli, scale 0.01, three partitions) with ``publish: iceberg`` is led by `primary` on a local
directory and replicated to `dr` (S3 endpoint a), `edge` (S3 endpoint b, other keys) and `backup` (local).
The story: a load with updates and deletes; a fork (`dr` leads for a while and takes writes at its S3 store,
`primary` leads again and writes, the round merges the fork); a split of the first partition; a forced
compaction; a failover to `dr` while `primary` holds writes nobody has (``on_return: merge``: they are merged
back at `dr`), with writes at `dr` through the public ``segrep.write_batch``; a schema change through
``segrep apply`` (a column renamed with ``renamed_from``, one widened, one added with a default) and writes at
the new version. Rounds follow each step.

After each step, for every site, pyiceberg's own SQL catalog opened on the catalog database's URL (with the
site's endpoint and keys for an S3 site, as a user's engine is given them) scans exactly the rows ``segrep read
--site`` serves there, and the rows an independent replay of the writes gives; the current snapshot's
``segrep.safe-time-us`` is the site's safe time in the catalog (a leader's: the last version it committed).
At the end DuckDB (through pyiceberg) answers a TPC-H-style aggregate as pyarrow does over ``segrep read``,
and polars reads the same rows. The whole story runs on SQLite and once on PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from sqlalchemy import select

from segrep import write_batch as public_write
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.snapshot import snapshot
from segrep.core import hlc
from segrep.data import demo as demo_data
from segrep.data.reader import read_table
from segrep.data.writer import write_batch
from segrep.failover.promote import failover
from segrep.maintenance.compaction import compact
from segrep.publish.outcome import PublishStatus, SitePublication
from segrep.replication.orchestrator import run_round
from segrep.replication.reports import RoundReport
from segrep.replication.safetime import leader_vouches
from segrep.split.run import run_split
from tests.support.checks import leaders
from tests.support.cli import cli
from tests.support.env import ORDERS_YAML, Env, make_env
from tests.support.iceberg import iceberg_catalog, loaded, scan
from tests.support.rounds import no_spark, set_leader
from tests.support.s3 import S3Endpoint, s3_events_yaml, use_site_keys

pytestmark = pytest.mark.slow  # TPC-H data from tpchgen-cli

Endpoints = tuple[S3Endpoint, S3Endpoint]
TABLE = "orders"
KEY = "o_orderkey"
SITES = ("primary", "dr", "edge", "backup")
SPLIT_POINTS = [20000, 40000]  # sf 0.01 keys run to 60,000: three partitions
SPLIT_AT = 10000  # the first partition split in two
POLICY = {"publish": "iceberg", "retry_delay_s": 0, "on_return": "merge"}
V1: dict[str, Any] = yaml.safe_load(ORDERS_YAML)["tables"]["orders"]["columns"]
# the schema change: o_comment renamed o_note (in its place), o_shippriority widened, o_channel added
V2: dict[str, Any] = {
    **{
        ("o_note" if k == "o_comment" else k): ({"type": "string", "renamed_from": k} if k == "o_comment" else v)
        for k, v in V1.items()
    },
    "o_shippriority": "int64",
    "o_channel": {"type": "string", "default": "web"},
}
RENAMED = {"o_comment": "o_note"}


def definitions(a: S3Endpoint, b: S3Endpoint, prefix: str, columns: dict[str, Any]) -> str:
    """`orders` with ``columns``: led by the local `primary`, replicated to `dr` (endpoint a), `edge`
    (endpoint b), each with its keys by reference, and `backup` (local)."""
    doc = yaml.safe_load(s3_events_yaml(a, b, prefix))
    doc["sites"]["backup"] = {"id": 4, "uri": "sites/backup"}
    orders = yaml.safe_load(ORDERS_YAML)["tables"]["orders"]
    orders.update(columns=columns, split_points=SPLIT_POINTS, replicas=["dr", "edge", "backup"], policy=POLICY)
    doc["tables"] = {TABLE: orders}
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.fixture(scope="module")
def batches(tmp_path_factory: pytest.TempPathFactory) -> list[demo_data.Batch]:
    """TPC-H `orders` at scale 0.01 (15,000 rows) in 11 batches: 0 an upsert, then (upsert with updates of
    earlier orders, delete) pairs 1-2, 3-4, 5-6, 7-8, 9-10."""
    source = pq.read_table(demo_data.generate_tpch("orders", 0.01, tmp_path_factory.mktemp("tpch") / "sf0.01"))
    out = demo_data.make_batches(source, KEY, n=6, update_frac=0.05, delete_frac=0.02)
    assert [b.delete for b in out] == [False] + [False, True] * 5
    return out


class Story:
    """The environment, every site's reader properties, and an independent replay of the writes (key -> row,
    in the current column names)."""

    def __init__(self, env: Env, endpoints: Endpoints, prefix: str) -> None:
        self.env = env
        self.endpoints = endpoints
        self.prefix = prefix
        self.rows: dict[int, dict[str, Any]] = {}
        a, b = endpoints
        self.props = {"primary": {}, "backup": {}, "dr": reader_props(a), "edge": reader_props(b)}

    # -- writes, replayed into the model ------------------------------------------------------------------------

    def write(self, batch: demo_data.Batch, *, public: bool = False, command: bool = False) -> None:
        """Write (``public``: through ``segrep.write_batch``; ``command``: through ``segrep write``, both
        publish the written sites' tables at once) and replay into the model."""
        rows = batch.rows
        if public:
            public_write(self.env.catalog, TABLE, rows, delete=batch.delete, defs=self.env.defs)
        elif command:
            path = self.env.root / f"batch-{uuid.uuid4().hex[:8]}.parquet"
            pq.write_table(rows, path)
            code, _out, err = cli(self.env, "write", TABLE, str(path), *(["--delete"] if batch.delete else []))
            assert code == 0, err
        else:
            write_batch(self.env.catalog, TABLE, rows, delete=batch.delete)
        for row in rows.to_pylist():
            if batch.delete:
                self.rows.pop(row[KEY], None)
            else:
                self.rows[row[KEY]] = {RENAMED.get(k, k): v for k, v in row.items()}

    def expected(self, schema: pa.Schema) -> pa.Table:
        """The model's rows as ``schema`` (a column not written reads as its default: o_channel 'web'; before
        the rename, o_note is o_comment)."""
        back = {} if "o_note" in schema.names else {v: k for k, v in RENAMED.items()}
        rows = [{back.get(c, c): v for c, v in {"o_channel": "web", **self.rows[k]}.items()} for k in sorted(self.rows)]
        return pa.Table.from_pylist(rows, schema=schema)

    def rounds(self, max_rounds: int = 5) -> list[RoundReport]:
        """Rounds until one copies and merges nothing; no publication may fail."""
        reports = []
        for _ in range(max_rounds):
            rep = run_round(self.env.catalog, self.env.defs, TABLE, submit=no_spark)
            reports.append(rep)
            assert_published(rep.published)
            busy = any(t.segments_copied or t.outcomes for t in rep.targets.values())
            if not busy and not rep.merges.items and rep.status == "ok":
                return reports
        pytest.fail(f"no idle round after {max_rounds}: {[str(r) for r in reports]}")

    # -- the checks ---------------------------------------------------------------------------------------------

    def served(self, site: str) -> pa.Table:
        return read_table(self.env.catalog, TABLE, site).sort_by(KEY)

    def check_site(self, site: str, step: str, *, safe_times: bool = True) -> pa.Table:
        """The site's Iceberg table, read as a user's engine does, is what segrep serves there, at its safe time
        (unless ``safe_times`` is false: the rows only)."""
        want = self.served(site)
        safe = safe_time(self.env, site)
        assert safe is not None or not safe_times, f"{step}: {site} has no safe time"
        with iceberg_catalog(self.env.url, **self.props[site]) as ice:
            tbl = ice.load_table((site, TABLE))
            got = tbl.scan().to_arrow().sort_by(KEY)
            snap = tbl.current_snapshot()
        assert got.schema.names == want.schema.names, (step, site)
        assert got.cast(want.schema).equals(want), (
            f"{step}: {site} publishes {got.num_rows} rows, serves {want.num_rows}"
        )
        if safe_times:
            assert snap is not None and snap.summary is not None, (step, site)
            assert snap.summary["segrep.safe-time-us"] == str(safe), (step, site)
        return want

    def check_published(self, step: str, *, safe_times: bool = True) -> None:
        """Every site, caught up or not (right after an operation that publishes them all): published = served.
        A site without a safe time (an old leader still holding what its failover gave up) is left out: what
        it may publish then is tests/publish/test_published_safe_time.py's subject."""
        for site in SITES:
            if safe_time(self.env, site) is not None:
                self.check_site(site, step, safe_times=safe_times)

    def check(self, step: str) -> None:
        """Every site (caught up by the rounds): published = served = the replay of the writes."""
        expected: pa.Table | None = None
        for site in SITES:
            want = self.check_site(site, step)
            expected = self.expected(want.schema) if expected is None else expected
            assert want.equals(expected), (
                f"{step}: {site} serves {want.num_rows} rows, the writes give {len(self.rows)}"
            )


def reader_props(endpoint: S3Endpoint) -> dict[str, str]:
    """What a user gives pyiceberg to read a site on ``endpoint``: its endpoint, region and keys."""
    return {
        "s3.endpoint": endpoint.url,
        "s3.region": endpoint.region,
        "s3.access-key-id": endpoint.access_key,
        "s3.secret-access-key": endpoint.secret_key,
    }


def assert_published(published: list[SitePublication]) -> None:
    failed = [x.line() for x in published if x.status is PublishStatus.FAILED]
    assert not failed, failed


def serving(env: Env) -> list[m.Partition]:
    """The partitions that answer reads now (a split's parent, unloaded, no longer does)."""
    with env.catalog.read() as s:
        return q.serving_partitions(s, q.table_info(s, TABLE))


def leading_sites(env: Env) -> set[str]:
    led = leaders(env.catalog, TABLE)
    return {led[p.partition_id][0] for p in serving(env)}


def safe_time(env: Env, site: str) -> int | None:
    """The site's safe time as the catalog says it. A site leading every serving partition holds every write
    committed there (up to the newest version), except what other sites hold and it has not merged yet (a
    fork, writes a failover gave up that come back under ``on_return: merge``): up to the instant before the
    oldest of those, as rounds count it for a leader (``leader_vouches``). A replica's is its row in
    ``safe_times`` (None: none)."""
    parts = serving(env)
    if leading_sites(env) == {site}:
        with env.catalog.read() as s:
            snap = snapshot(s, TABLE, active_only=True)
        # a settled partition (nothing left to offer, push or merge) bounds nothing
        led = [p for p in snap.partitions if p.leader.site_id == snap.site_id(site)]
        bound = min((leader_vouches(p) for p in led), default=hlc.FOREVER_US)
        return min(max(p.last_version for p in parts), bound)
    with env.catalog.read() as s:
        recorded = s.scalar(
            select(m.SafeTime.safe_time_us)
            .join(m.Site, m.Site.site_id == m.SafeTime.site_id)
            .join(m.Table, m.Table.table_id == m.SafeTime.table_id)
            .where(m.Table.name == TABLE, m.Site.name == site)
        )
    return None if recorded is None else int(recorded)


def first_partition(env: Env) -> int:
    return min(p.partition_id for p in serving(env))


def at_v2(batch: demo_data.Batch) -> demo_data.Batch:
    """A batch as a writer at the new schema sends it: o_note, o_shippriority past int32, o_channel 'app'."""
    rows = batch.rows
    if batch.delete:
        return batch
    rows = rows.rename_columns([RENAMED.get(c, c) for c in rows.column_names])
    wide = pc.add(rows[KEY], pa.scalar(2**33, pa.int64()))
    rows = rows.set_column(rows.schema.get_field_index("o_shippriority"), "o_shippriority", wide)
    return demo_data.Batch(rows.append_column("o_channel", pa.array(["app"] * rows.num_rows)), False)


def duckdb_and_polars(story: Story, site: str) -> None:
    """DuckDB (through pyiceberg) sums prices by status as pyarrow does over ``segrep read``; polars reads
    the same rows."""
    want = story.served(site)
    by_status = want.group_by("o_orderstatus").aggregate([("o_totalprice", "sum"), (KEY, "count")])
    expected = sorted(
        zip(
            by_status["o_orderstatus"].to_pylist(),
            by_status["o_totalprice_sum"].to_pylist(),
            by_status[f"{KEY}_count"].to_pylist(),
            strict=True,
        )
    )
    with iceberg_catalog(story.env.url, **story.props[site]) as ice:
        tbl = ice.load_table((site, TABLE))
        con = tbl.scan().to_duckdb(table_name="orders")
        got = con.execute(
            "SELECT o_orderstatus, sum(o_totalprice), count(*) FROM orders GROUP BY o_orderstatus ORDER BY 1"
        ).fetchall()
        assert [(s, Decimal(t), n) for s, t, n in got] == expected, site
        assert all(isinstance(t, Decimal) for _s, t, _n in got)  # decimals stay exact
        top = con.execute(
            "SELECT o_orderpriority, count(*) FROM orders WHERE o_orderdate >= DATE '1995-01-01' GROUP BY 1 ORDER BY 1"
        ).fetchall()
        mask = pc.greater_equal(want["o_orderdate"], pa.scalar(dt.date(1995, 1, 1)))
        prio = want.filter(mask).group_by("o_orderpriority").aggregate([(KEY, "count")]).sort_by("o_orderpriority")
        assert top == list(zip(prio["o_orderpriority"].to_pylist(), prio[f"{KEY}_count"].to_pylist(), strict=True))
        frame = tbl.to_polars().collect()
    assert isinstance(frame, pl.DataFrame)
    got = frame.sort(KEY).to_arrow()
    assert got.schema.names == want.schema.names
    assert got.cast(want.schema).equals(want), site


def filtered_scans(story: Story, site: str) -> None:
    """pyiceberg's filters and projections, as engines push them down, on an added column (its default in
    files written before it), a renamed one and the key: the same rows as pyarrow's over ``segrep read``."""
    want = story.served(site)
    prefix = want["o_note"][0].as_py()[:3]  # a comment's first words: some rows, not all
    cases = [
        ("o_channel = 'web'", pc.equal(want["o_channel"], "web")),
        (
            "o_orderkey >= 10000 AND o_orderkey < 40000",
            pc.and_(pc.greater_equal(want[KEY], 10000), pc.less(want[KEY], 40000)),
        ),
        (f"o_note LIKE '{prefix}%'", pc.starts_with(want["o_note"], prefix)),
    ]
    with iceberg_catalog(story.env.url, **story.props[site]) as ice:
        tbl = ice.load_table((site, TABLE))
        for expr, mask in cases:
            got = tbl.scan(row_filter=expr).to_arrow().sort_by(KEY)
            expected = want.filter(mask)
            assert expected.num_rows and got.cast(want.schema).equals(expected), (site, expr)
        cols = tbl.scan(selected_fields=(KEY, "o_note", "o_channel")).to_arrow().sort_by(KEY)
        assert cols.column_names == [KEY, "o_note", "o_channel"]
        assert cols.cast(want.select(cols.column_names).schema).equals(want.select(cols.column_names)), site


@pytest.fixture
def story(
    s3_endpoints: Endpoints, catalog_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Story]:
    a, b = s3_endpoints
    use_site_keys(monkeypatch, DR_S3=a, EDGE_S3=b)
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")  # polars plans the scan with pyiceberg, silently
    prefix = uuid.uuid4().hex[:12]
    env = make_env(tmp_path, catalog_url, definitions(a, b, prefix, V1))
    yield Story(env, s3_endpoints, prefix)
    env.catalog.dispose()


def test_every_site_publishes_what_it_serves_through_forks_splits_compaction_failover_and_a_schema_change(
    story: Story, batches: list[demo_data.Batch]
) -> None:
    env, cat = story.env, story.env.catalog
    a, b = story.endpoints

    # load: an upsert through the public write (the leader's table published at once), updates, deletes
    story.write(batches[0], public=True)
    story.check_site("primary", "first write")
    assert story.served("primary").num_rows == len(story.rows)
    story.write(batches[1])
    story.write(batches[2], command=True)  # deletes through `segrep write --delete`: published at once too
    story.check_site("primary", "deletes written")
    story.rounds()
    story.check("load")

    # a fork: dr leads for a while and takes writes at its S3 store; primary leads again, writes, and the
    # round merges dr's fork into primary's chain (in process: no Spark)
    set_leader(cat, "dr", TABLE)
    story.write(batches[3], public=True)  # published at dr, the site written at, with its fork
    story.check_site("dr", "fork at dr")
    story.write(batches[4])
    set_leader(cat, "primary", TABLE)
    story.write(batches[5])
    reports = story.rounds()
    assert reports[0].merges.items, str(reports[0])
    story.check("fork merged")

    # a split of the first partition
    split = run_split(env.catalog, env.defs, TABLE, first_partition(env), [SPLIT_AT], submit=no_spark)
    assert split.published is not None
    assert_published(list(split.published.sites))
    story.check_published("split finished")
    story.rounds()
    story.check("split")

    # a forced compaction: majors at the leader, then at the replicas (clean snapshots)
    story.write(batches[6])
    report = compact(cat, env.defs, TABLE, force=True, submit=no_spark)
    assert report.committed and report.published is not None
    assert_published(list(report.published.sites))
    leader = {x.site: x for x in report.published.sites}["primary"]
    assert leader.status is PublishStatus.PUBLISHED and leader.clean
    story.check_published("compaction committed")  # the replicas: still their files before the majors
    story.rounds()
    story.check("compaction")

    # a failover to dr while primary holds a batch nobody else has; dr takes writes through the public write
    # (published at once there); on_return: merge brings primary's batch back into dr's chain
    story.write(batches[7])
    moved = failover(cat, env.defs, [TABLE], to="dr", submit=no_spark)
    for pub in moved.published:
        assert_published(list(pub.sites))
    assert leading_sites(env) == {"dr"}
    assert safe_time(env, "primary") is None  # a replica now, holding a batch the failover gave up
    # dr's published safe time stops before primary's batch, which dr does not hold until the merge
    # (tests/publish/test_published_safe_time.py)
    story.check_published("failover")
    story.write(batches[8], public=True)
    story.check_site("dr", "write at the new leader")
    story.rounds()
    story.check("failover")

    # a schema change: o_comment renamed o_note, o_shippriority widened to int64, o_channel added ('web')
    env.config.write_text(definitions(a, b, story.prefix, V2))
    code, out, err = cli(env, "apply")
    assert code == 0, err
    assert f"{TABLE}: iceberg at dr: published" in out, out
    story.check_published("schema change applied")  # every old file read under the new schema
    for n in (9, 10):
        story.write(at_v2(batches[n]))
    story.rounds()
    story.check("schema change")
    for site in ("dr", "edge"):
        tbl, _ = loaded(env.url, site, TABLE, **story.props[site])
        assert [f.name for f in tbl.schema().fields] == list(V2), site
    channels = set(scan(env.url, "edge", TABLE, [KEY], **story.props["edge"]).column("o_channel").to_pylist())
    assert channels == {"web", "app"}

    # engines through pyiceberg: filters pushed down, DuckDB and polars, on a local and an S3 site
    for site in ("backup", "edge"):
        filtered_scans(story, site)
        duckdb_and_polars(story, site)
