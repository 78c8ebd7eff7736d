"""Open tables (issue 37, DESIGN section 18): each site's copy published as an Iceberg v2 table at its safe
time, read back by pyiceberg's own SQL catalog (an engine's view, nothing of the publisher reused) and compared
row for row with ``segrep read --site``; DuckDB and polars query it through pyiceberg."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.manifest import ManifestContent
from pyiceberg.table.delete_file_index import _referenced_data_file_path
from pyiceberg.table.snapshots import Operation
from sqlalchemy import text

from segrep import write_batch as public_write
from segrep.catalog import queries as q
from segrep.catalog.schemas import schema_versions
from segrep.catalog.site_identity import open_site
from segrep.core import faults, hlc
from segrep.core.states import SplitState
from segrep.data.reader import read_table
from segrep.data.writer import write_batch
from segrep.failover.promote import failover
from segrep.maintenance.compaction import compact
from segrep.maintenance.gc import collect
from segrep.publish import filled_copies as fill
from segrep.publish import iceberg_files, publisher, winners_index
from segrep.publish.metadata_gc import ORPHAN_GRACE_S, collect_unreferenced
from segrep.publish.outcome import PublishStatus, SnapshotKind
from segrep.publish.publisher import publish_table
from segrep.replication.orchestrator import run_round
from segrep.replication.safetime import leader_safe_time
from segrep.replication.unload import finish_unloaded
from segrep.split.run import run_split
from tests.support.badinput import assert_user_error, unchanged
from tests.support.cli import cli, cli_command
from tests.support.env import ORDERS_YAML, Env, make_env, sqlite_url
from tests.support.iceberg import iceberg_catalog, loaded, scan
from tests.support.rounds import bring_up, no_spark, take_down
from tests.support.s3 import S3Endpoint, free_port, secrets_of
from tests.support.tables import batch

TABLE = "events"
KEYS = ("tenant", "seq")
SITES = ("primary", "dr", "edge")
_POLICY = "policy: {publish: iceberg, retry_delay_s: 0}"
PUBLISHED_YAML = ORDERS_YAML.replace("    replicas: [dr, edge]\n", f"    replicas: [dr, edge]\n    {_POLICY}\n")


@pytest.fixture
def pub_env(catalog_url: str, tmp_path: Path) -> Env:
    e = make_env(tmp_path, catalog_url, PUBLISHED_YAML)
    yield e
    e.catalog.dispose()


def segrep_rows(env: Env, site: str) -> pa.Table:
    return read_table(env.catalog, TABLE, site).sort_by([(k, "ascending") for k in KEYS])


def assert_published_equal(env: Env, sites: tuple[str, ...] = SITES) -> None:
    """Every site's Iceberg table holds exactly the rows segrep serves there (schema included)."""
    for site in sites:
        want = segrep_rows(env, site)
        got = scan(env.url, site, TABLE, KEYS)
        assert got.schema.names == want.schema.names, site
        assert got.cast(want.schema).equals(want), f"{site}: {got.num_rows} rows published, {want.num_rows} served"


def q_site(env: Env, name: str):  # type: ignore[no-untyped-def]
    with env.catalog.read() as s:
        row = q.site_by_name(s, name)
        s.expunge(row)
        return row


def keys_only(keys: range) -> pa.Table:
    return batch(keys, "x").select(list(KEYS))


def test_each_site_publishes_what_it_serves_with_its_safe_time_and_hides_internal_columns(pub_env: Env) -> None:
    cat, defs = pub_env.catalog, pub_env.defs
    write_batch(cat, TABLE, batch(range(0, 40), "v1"))
    write_batch(cat, TABLE, batch(range(10, 20), "v2"))  # supersedes rows of the first write
    write_batch(cat, TABLE, keys_only(range(30, 35)), delete=True)  # tombstones
    report = run_round(cat, defs, TABLE, submit=no_spark)
    assert {x.site: x.status for x in report.published} == dict.fromkeys(SITES, PublishStatus.PUBLISHED)
    assert_published_equal(pub_env)
    assert segrep_rows(pub_env, "dr").num_rows == 35

    tbl, summary = loaded(pub_env.url, "dr", TABLE)
    assert tbl.format_version == 2
    assert [f.name for f in tbl.schema().fields] == ["tenant", "seq", "payload", "at"]  # no _version, _deleted
    assert summary["segrep.safe-time-us"] == str(report.safe_time_us["dr"])
    assert summary["segrep.round-id"] == str(report.round_id)
    assert summary["segrep.leader-epoch"] == "1"
    # the data files are dr's own segment files: no path points at another site
    files = tbl.inspect.files().column("file_path").to_pylist()
    assert files and all(str(pub_env.site_dir("dr")) in f for f in files)

    # the next round's publication reads only the new files and carries the rest (an incremental snapshot)
    written = write_batch(cat, TABLE, batch(range(15, 25), "v3")).segments
    written += write_batch(cat, TABLE, keys_only(range(0, 3)), delete=True).segments
    report = run_round(cat, defs, TABLE, submit=no_spark)
    pub = {x.site: x for x in report.published}
    assert not pub["dr"].clean and pub["dr"].files_added == len(written)
    assert_published_equal(pub_env)
    _, summary = loaded(pub_env.url, "dr", TABLE)
    assert summary["segrep.safe-time-us"] == str(report.safe_time_us["dr"])

    # nothing moved: publishing again changes nothing (idempotent)
    before = {site: loaded(pub_env.url, site, TABLE)[0].current_snapshot().snapshot_id for site in SITES}
    again = publish_table(cat, defs, TABLE)
    assert {x.status for x in again.sites} == {PublishStatus.UNCHANGED}
    assert before == {site: loaded(pub_env.url, site, TABLE)[0].current_snapshot().snapshot_id for site in SITES}


def test_duckdb_and_polars_query_a_replica(pub_env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # polars plans the scan through pyiceberg (its own planner is a separate package, polars-iceberg)
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    cat, defs = pub_env.catalog, pub_env.defs
    write_batch(cat, TABLE, batch(range(0, 30), "v1"))
    write_batch(cat, TABLE, batch(range(0, 10), "v2"))
    write_batch(cat, TABLE, keys_only(range(20, 25)), delete=True)
    run_round(cat, defs, TABLE, submit=no_spark)
    want = segrep_rows(pub_env, "edge")
    with iceberg_catalog(pub_env.url) as ice:
        tbl = ice.load_table(("edge", TABLE))
        con = tbl.scan().to_duckdb(table_name="events")
        rows = con.execute("SELECT count(*), count(DISTINCT seq), sum(seq) FROM events").fetchone()
        assert rows == (want.num_rows, want.num_rows, sum(want.column("seq").to_pylist()))
        v2 = con.execute("SELECT count(*) FROM events WHERE payload LIKE 'v2%'").fetchone()
        assert v2 == (10,)
        frame = tbl.to_polars().collect()
        assert sorted(frame["seq"].to_list()) == sorted(want.column("seq").to_pylist())


def test_delete_files_of_one_data_file_and_shared_ones_hide_the_same_rows_through_consolidations(
    pub_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data file with many rows hidden by one publication gets a delete file naming it alone (its path as both
    bounds), the others share one; through incremental and consolidated snapshots every site's table holds
    exactly what segrep serves, and the last snapshot lists both kinds."""
    monkeypatch.setattr(iceberg_files, "OWN_DELETE_FILE_ROWS", 4)
    monkeypatch.setattr(publisher, "MAX_CARRIED_MANIFESTS", 3)
    cat, defs = pub_env.catalog, pub_env.defs
    write_batch(cat, TABLE, batch(range(0, 40), "v1"))
    write_batch(cat, TABLE, batch(range(40, 80), "v1"))
    run_round(cat, defs, TABLE, submit=no_spark)
    kinds = set()
    for i in range(5):  # many rows of the first file, two of the second, a tombstone
        write_batch(cat, TABLE, batch([*range(i, 40, 5), 40 + i, 60 + i], f"u{i}"))
        write_batch(cat, TABLE, keys_only(range(70 + i, 71 + i)), delete=True)
        kinds |= {x.kind for x in run_round(cat, defs, TABLE, submit=no_spark).published}
        assert_published_equal(pub_env)
    assert {SnapshotKind.INCREMENTAL, SnapshotKind.CONSOLIDATED} <= kinds, kinds
    tbl, _ = loaded(pub_env.url, "dr", TABLE)
    deletes = [
        entry.data_file
        for mf in tbl.current_snapshot().manifests(tbl.io)
        if mf.content == ManifestContent.DELETES
        for entry in mf.fetch_manifest_entry(tbl.io, discard_deleted=True)
    ]
    alone = [f for f in deletes if _referenced_data_file_path(f) is not None]
    assert alone and len(alone) < len(deletes), [f.file_path for f in deletes]


def test_compaction_starts_a_clean_snapshot(pub_env: Env) -> None:
    cat, defs = pub_env.catalog, pub_env.defs
    for i in range(4):
        write_batch(cat, TABLE, batch(range(i * 5, i * 5 + 20), f"w{i}"))
    write_batch(cat, TABLE, keys_only(range(0, 4)), delete=True)
    run_round(cat, defs, TABLE, submit=no_spark)
    report = compact(cat, defs, TABLE, force=True)
    assert report.committed and report.published is not None
    leader = {x.site: x for x in report.published.sites}["primary"]
    assert leader.status == PublishStatus.PUBLISHED and leader.clean
    tbl, _ = loaded(pub_env.url, "primary", TABLE)
    assert tbl.current_snapshot().summary.operation == Operation.OVERWRITE
    assert_published_equal(pub_env, ("primary",))
    run_round(cat, defs, TABLE, submit=no_spark)  # the replicas take the majors: clean snapshots there too
    assert_published_equal(pub_env)


def test_gc_keeps_the_files_a_current_snapshot_lists_until_a_publication_moves_past_them(
    pub_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compacted while every publication fails, the sites' current snapshots still list the pre-compaction
    files: GC drops their catalog rows but keeps the files (held, said in its report), so the snapshots read
    on. Once published again, the files are orphans and go after the grace; nothing else is lost."""
    cat, defs = pub_env.catalog, pub_env.defs
    for i in range(4):
        write_batch(cat, TABLE, batch(range(i * 5, i * 5 + 20), f"w{i}"))
    run_round(cat, defs, TABLE, submit=no_spark)
    before = {site: scan(pub_env.url, site, TABLE, KEYS) for site in SITES}
    listed = {site: files_listed(pub_env, site) for site in SITES}
    monkeypatch.setenv(faults.FAULTS_ENV, "publish_before_commit")
    assert compact(cat, defs, TABLE, force=True).committed
    run_round(cat, defs, TABLE, submit=no_spark)  # the majors reach the replicas; nothing is published
    report = collect(cat, defs, TABLE)
    held = [h for h in report.held if "the current published snapshot of events at" in h]
    assert report.deletions and len(held) == len(report.deletions), report.held
    for site in SITES:
        assert all((pub_env.site_dir(site) / rel).exists() for rel in listed[site]), site
        assert scan(pub_env.url, site, TABLE, KEYS).equals(before[site]), site  # still reads
    monkeypatch.delenv(faults.FAULTS_ENV)
    assert not publish_table(cat, defs, TABLE).failed
    assert_published_equal(pub_env)
    later = hlc.now_us() + int(defs.policy(TABLE).orphan_grace_s * 1e6) + 1
    report = collect(cat, defs, TABLE, now_us=later)
    assert report.held == [] and report.files_removed == len(report.deletions) > 0
    for site in SITES:
        assert not any((pub_env.site_dir(site) / rel).exists() for rel in listed[site] - files_listed(pub_env, site))
    assert_published_equal(pub_env)


def test_gc_keeps_every_file_of_a_published_table_at_a_site_whose_snapshot_it_cannot_read(pub_env: Env) -> None:
    """The Iceberg catalog does not answer: GC cannot know what the sites' snapshots list, so it removes no
    file of the table (their catalog rows go), and says why."""
    cat = pub_env.catalog
    for i in range(3):
        write_batch(cat, TABLE, batch(range(i * 5, i * 5 + 20), f"w{i}"))
    run_round(cat, pub_env.defs, TABLE, submit=no_spark)
    assert compact(cat, pub_env.defs, TABLE, force=True).committed
    run_round(cat, pub_env.defs, TABLE, submit=no_spark)
    dead = f"iceberg_catalog: {{type: rest, uri: 'http://127.0.0.1:{free_port()}'}}\n"
    pub_env.config.write_text(dead + PUBLISHED_YAML)
    report = collect(cat, pub_env.defs, TABLE)
    assert report.deletions and report.files_removed == 0
    assert all("could not be read" in h for h in report.held) and len(report.held) == len(report.deletions)
    assert all((pub_env.site_dir(d.site) / d.relpath).exists() for d in report.deletions)


def add_defaulted_channel(env: Env) -> str:
    """The definitions with a column `channel` added, default `web` (not applied yet); its columns line."""
    columns = "    columns: {tenant: string, seq: int64, payload: string, at: timestamp}\n"
    added = columns.replace("at: timestamp}", "at: timestamp, channel: {type: string, default: web}}")
    env.config.write_text(env.config.read_text().replace(columns, added, 1))
    return added


def first_partition(env: Env) -> int:
    """The table's first partition (the one a split test splits)."""
    with env.catalog.read() as s:
        found = s.execute(
            text("SELECT min(p.partition_id) FROM partitions p JOIN tables t USING (table_id) WHERE t.name = :t"),
            {"t": TABLE},
        ).scalar()
    return int(found)


def files_listed(env: Env, site: str) -> set[str]:
    tbl, _ = loaded(env.url, site, TABLE)
    prefix = f"file://{env.site_dir(site)}/"
    return {str(p).removeprefix(prefix) for p in tbl.inspect.data_files().column("file_path").to_pylist()}


def test_a_publication_killed_before_its_commit_leaves_the_previous_snapshot(
    pub_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    cat, defs = pub_env.catalog, pub_env.defs
    write_batch(cat, TABLE, batch(range(0, 20), "v1"))
    run_round(cat, defs, TABLE, submit=no_spark)
    before = scan(pub_env.url, "dr", TABLE, KEYS)
    write_batch(cat, TABLE, batch(range(5, 15), "v2"))
    monkeypatch.setenv(faults.FAULTS_ENV, "publish_before_commit")
    report = run_round(cat, defs, TABLE, submit=no_spark)
    failed = {x.site: x for x in report.published}
    assert failed["dr"].status == PublishStatus.FAILED and "publish_before_commit" in failed["dr"].detail
    assert "iceberg at dr: failed" in report.text()
    assert scan(pub_env.url, "dr", TABLE, KEYS).equals(before)  # the previous snapshot, still readable
    monkeypatch.delenv(faults.FAULTS_ENV)
    again = publish_table(cat, defs, TABLE)
    assert {x.site: x.status for x in again.sites}["dr"] == PublishStatus.PUBLISHED
    assert_published_equal(pub_env)


def test_two_publications_of_a_site_racing_the_later_commit_fails_and_looks_again(
    pub_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publication that loaded the site's table before another one committed must not make its snapshot
    current over the other's (the catalog's update is conditional on the metadata location it loaded): its
    commit fails, it reads the catalog again and finds the other's snapshot already shows the newer state."""
    cat, defs = pub_env.catalog, pub_env.defs
    write_batch(cat, TABLE, batch(range(0, 20), "v1"))
    run_round(cat, defs, TABLE, submit=no_spark)
    raced: list[int] = []
    real_point = faults.point

    def other_publisher_first(name: str) -> None:
        real_point(name)
        if name == "publish_before_commit" and not raced:  # the outer publication has loaded the table
            raced.append(0)
            public_write(cat, TABLE, batch(range(15, 30), "v3"), defs=defs)  # published at primary at once
            raced[0] = loaded(pub_env.url, "primary", TABLE)[0].current_snapshot().snapshot_id  # type: ignore[union-attr]

    write_batch(cat, TABLE, batch(range(5, 15), "v2"))  # not published yet
    monkeypatch.setattr(faults, "point", other_publisher_first)
    out = {x.site: x for x in publish_table(cat, defs, TABLE, ["primary"]).sites}
    assert raced and raced[0]
    assert out["primary"].status is PublishStatus.UNCHANGED, out["primary"].line()
    assert out["primary"].snapshot_id == raced[0]
    tbl, _ = loaded(pub_env.url, "primary", TABLE)
    assert tbl.current_snapshot().snapshot_id == raced[0]  # type: ignore[union-attr]
    assert_published_equal(pub_env, ("primary",))
    assert {p[:2] for p in segrep_rows(pub_env, "primary").column("payload").to_pylist()} == {"v1", "v2", "v3"}


def test_a_site_published_after_others_never_commits_an_older_state_over_a_newer_snapshot(
    pub_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every site's state is read before the sites are published in turn: while `dr` is being published, a
    write at `primary` publishes `primary` itself. `primary`'s turn must not put its older state over that newer
    snapshot (fewer rows than served, under a safe time that claims the write): its table was loaded before
    the state was read, so its commit fails and it looks again."""
    cat, defs = pub_env.catalog, pub_env.defs
    write_batch(cat, TABLE, batch(range(0, 20), "v1"))
    run_round(cat, defs, TABLE, submit=no_spark)
    write_batch(cat, TABLE, batch(range(20, 25), "v2"))  # every site moves
    real = publisher._publish_prepared
    inner: list[int] = []

    def meanwhile(catalog: Any, p: Any, *args: Any) -> Any:
        out = real(catalog, p, *args)
        if p.site == "dr" and not inner:  # after dr, before primary: primary's state is already read
            inner.append(len(public_write(cat, TABLE, batch(range(100, 110), "v3"), defs=defs).segments))
        return out

    monkeypatch.setattr(publisher, "_publish_prepared", meanwhile)
    out = {x.site: x for x in publish_table(cat, defs, TABLE, leader_safe_time=leader_safe_time).sites}
    assert inner and out["primary"].status in (PublishStatus.PUBLISHED, PublishStatus.UNCHANGED), out
    assert_published_equal(pub_env)
    metadata = pub_env.site_dir("primary") / TABLE / "_iceberg" / "metadata"
    tbl, _ = loaded(pub_env.url, "primary", TABLE)
    logged = {Path(x.metadata_file.removeprefix("file://")).name for x in tbl.metadata.metadata_log}
    current = Path(tbl.metadata_location.removeprefix("file://")).name
    assert {p.name for p in metadata.glob("*.metadata.json")} <= logged | {current}  # a lost commit leaves none


def test_a_leaders_safe_time_never_claims_a_write_committed_after_its_files_were_read(
    pub_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write at the leader lands just after the publication read the leader's files: the snapshot does not
    hold it, so the safe time it states (read before the files) must be older than that write."""
    cat, defs = pub_env.catalog, pub_env.defs
    write_batch(cat, TABLE, batch(range(0, 20), "v1"))
    run_round(cat, defs, TABLE, submit=no_spark)
    write_batch(cat, TABLE, batch(range(20, 25), "v2"))
    real = publisher.placement_files_in
    late: list[int] = []

    def then_a_write(s: Any, catalog: Any, info: Any, site: str | None) -> Any:
        out = real(s, catalog, info, site)
        if site == "primary" and not late:
            late.extend(seg.version for seg in write_batch(cat, TABLE, batch(range(40, 45), "late")).segments)
        return out

    monkeypatch.setattr(publisher, "placement_files_in", then_a_write)
    out = {x.site: x for x in publish_table(cat, defs, TABLE, ["primary"], leader_safe_time=leader_safe_time).sites}
    assert late and out["primary"].status is PublishStatus.PUBLISHED, out
    _, summary = loaded(pub_env.url, "primary", TABLE)
    assert 0 < int(summary["segrep.safe-time-us"]) < min(late)
    assert "late40" not in scan(pub_env.url, "primary", TABLE, KEYS).column("payload").to_pylist()


def test_after_a_failover_the_new_leader_is_registered_and_reads_its_writes(pub_env: Env) -> None:
    cat, defs = pub_env.catalog, pub_env.defs
    write_batch(cat, TABLE, batch(range(0, 20), "v1"))
    run_round(cat, defs, TABLE, submit=no_spark)
    write_batch(cat, TABLE, batch(range(20, 30), "lost"))  # never replicated: given up by the failover
    report = failover(cat, defs, [TABLE], to="dr", submit=no_spark)
    assert {x.site for pub in report.published for x in pub.sites} == set(SITES)
    assert_published_equal(pub_env, ("dr", "edge"))
    public_write(cat, TABLE, batch(range(40, 45), "api"), defs=defs)  # at the new leader, published at once
    got = scan(pub_env.url, "dr", TABLE, KEYS)
    assert got.cast(segrep_rows(pub_env, "dr").schema).equals(segrep_rows(pub_env, "dr"))
    assert "api40" in got.column("payload").to_pylist()
    _, summary = loaded(pub_env.url, "dr", TABLE)
    assert summary["segrep.leader-epoch"] == "2"


def test_a_split_publishes_the_children_and_hides_the_parent_rows_outside_each_range(pub_env: Env) -> None:
    cat, defs = pub_env.catalog, pub_env.defs
    write_batch(cat, TABLE, batch(range(0, 60), "v1"))
    write_batch(cat, TABLE, batch(range(0, 60, 3), "v2"))
    run_round(cat, defs, TABLE, submit=no_spark)
    report = run_split(cat, defs, TABLE, first_partition(pub_env), ["b"], submit=no_spark)
    assert report.published is not None
    run_round(cat, defs, TABLE, submit=no_spark)
    assert_published_equal(pub_env)


def test_a_schema_change_is_published_with_every_old_file_read_under_it(catalog_url: str, tmp_path: Path) -> None:
    columns = "    columns: {tenant: string, seq: int64, payload: string, at: timestamp}\n"
    env = make_env(tmp_path, catalog_url, PUBLISHED_YAML)
    try:
        write_batch(env.catalog, TABLE, batch(range(0, 20), "v1"))
        run_round(env.catalog, env.defs, TABLE, submit=no_spark)
        changed = (
            "    columns:\n      tenant: string\n      seq: int64\n      body: {type: string, renamed_from: payload}\n"
            "      at: timestamp\n      channel: {type: string, default: web}\n"
        )
        env.config.write_text(env.config.read_text().replace(columns, changed, 1))
        code, out, err = cli(env, "apply")
        assert code == 0, err
        assert "events: iceberg at dr: published" in out
        tbl, _ = loaded(env.url, "dr", TABLE)
        assert [f.name for f in tbl.schema().fields] == ["tenant", "seq", "body", "at", "channel"]
        assert_published_equal(env)  # old files: payload read as body, channel as its default
        new = batch(range(10, 15), "v2").rename_columns(["tenant", "seq", "body", "at"])
        write_batch(env.catalog, TABLE, new.append_column("channel", pa.array(["app"] * 5)))
        run_round(env.catalog, env.defs, TABLE, submit=no_spark)
        assert_published_equal(env)
        assert sorted(set(scan(env.url, "edge", TABLE, KEYS).column("channel").to_pylist())) == ["app", "web"]
    finally:
        env.catalog.dispose()


def test_files_written_before_a_defaulted_column_are_listed_as_copies_holding_the_default(pub_env: Env) -> None:
    """Iceberg v2 has no column defaults: a file lacking the column reads as null in a strict engine. So a
    file written before a column with a default existed is listed as a copy at the current version holding
    the default (rows in the same order: the position deletes still apply), made once and reused; files
    written since are listed as they are; once compaction rewrote the old files and their snapshots expired,
    the copies are collected."""
    cat, defs = pub_env.catalog, pub_env.defs
    write_batch(cat, TABLE, batch(range(0, 20), "v1"))
    write_batch(cat, TABLE, batch(range(5, 10), "v2"))  # updates: positions hidden in the first file
    run_round(cat, defs, TABLE, submit=no_spark)
    filled = {site: pub_env.site_dir(site) / TABLE / "_iceberg" / "filled" for site in SITES}
    assert not any(d.exists() for d in filled.values())  # no default yet: every segment listed as itself
    added = add_defaulted_channel(pub_env)
    code, _out, err = cli(pub_env, "apply")  # published at once, every old file under its copy
    assert code == 0, err
    copies: dict[str, dict[Path, int]] = {}
    for site in SITES:
        tbl, summary = loaded(pub_env.url, site, TABLE)
        assert summary["segrep.snapshot-kind"] == "clean"
        listed = [
            Path(str(p).removeprefix("file://")) for p in tbl.inspect.data_files().column("file_path").to_pylist()
        ]
        assert listed and all(p.parent == filled[site] for p in listed), listed
        channel_id = next(f.field_id for f in tbl.schema().fields if f.name == "channel")
        for path in listed:
            rows = pq.read_table(path)
            assert set(rows.column("channel").to_pylist()) == {"web"}, path
            assert rows.schema.field("channel").metadata[b"PARQUET:field_id"] == str(channel_id).encode()
        copies[site] = {p: p.stat().st_mtime_ns for p in filled[site].iterdir()}
        handle = open_site(cat, q_site(pub_env, site))  # past the grace, but listed: the metadata GC keeps them
        collect_unreferenced(tbl, handle, TABLE, now=time.time() + ORPHAN_GRACE_S + 1)
        assert {p: p.stat().st_mtime_ns for p in filled[site].iterdir()} == copies[site], site
    assert_published_equal(pub_env)
    noted = added.replace("default: web}}", "default: web}, note: string}")  # a column with no default
    pub_env.config.write_text(pub_env.config.read_text().replace(added, noted, 1))
    code, _out, err = cli(pub_env, "apply")
    assert code == 0, err
    for site in SITES:  # each copy still fills what the schema defaults: kept, not made again
        assert {p: p.stat().st_mtime_ns for p in filled[site].iterdir()} == copies[site], site
        assert loaded(pub_env.url, site, TABLE)[1]["segrep.snapshot-kind"] == "incremental"
    assert_published_equal(pub_env)
    new = batch(range(15, 25), "v3").append_column("channel", pa.array(["app"] * 10))
    new = new.append_column("note", pa.array(["n"] * 10))
    written = len(write_batch(cat, TABLE, new).segments)  # one file per partition the rows fall in
    report = run_round(cat, defs, TABLE, submit=no_spark)
    assert {x.kind for x in report.published} == {SnapshotKind.INCREMENTAL}, report.text()
    for site in SITES:  # the copies reused as they are; the new file listed as itself
        assert {p: p.stat().st_mtime_ns for p in filled[site].iterdir()} == copies[site], site
        tbl, _ = loaded(pub_env.url, site, TABLE)
        paths = tbl.inspect.data_files().column("file_path").to_pylist()
        assert sum("/_iceberg/filled/" not in str(p) for p in paths) == written, paths
    assert_published_equal(pub_env)
    assert sorted(set(scan(pub_env.url, "dr", TABLE, KEYS).column("channel").to_pylist())) == ["app", "web"]
    assert compact(cat, defs, TABLE, force=True).committed  # every file rewritten at the current version
    for i in range(publisher.KEEP_SNAPSHOTS):  # the snapshots that list copies expire
        later = batch(range(30 + i, 31 + i), "later").append_column("channel", pa.array(["app"]))
        write_batch(cat, TABLE, later.append_column("note", pa.array([None], pa.string())))
        run_round(cat, defs, TABLE, submit=no_spark)
    for site in SITES:
        tbl, _ = loaded(pub_env.url, site, TABLE)
        assert not any("/_iceberg/filled/" in str(p) for p in tbl.inspect.data_files().column("file_path").to_pylist())
        handle = open_site(cat, q_site(pub_env, site))
        collect_unreferenced(tbl, handle, TABLE, now=time.time() + ORPHAN_GRACE_S + 1)
        assert list(filled[site].iterdir()) == [], site
    assert_published_equal(pub_env)


def test_a_consolidated_snapshot_keeps_the_filled_copies_and_the_deletes_that_name_them(
    pub_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Updates hide rows of files listed as filled copies (position deletes naming the copies); once the
    carried manifests are consolidated, the merged deletes still name the copies and every copy stays listed."""
    monkeypatch.setattr(publisher, "MAX_CARRIED_MANIFESTS", 3)
    cat, defs = pub_env.catalog, pub_env.defs
    write_batch(cat, TABLE, batch(range(0, 30), "v1"))
    run_round(cat, defs, TABLE, submit=no_spark)
    add_defaulted_channel(pub_env)
    code, _out, err = cli(pub_env, "apply")
    assert code == 0, err
    kinds = []
    for i in range(5):  # updates of the old keys: their rows in the copies are hidden
        update = batch(range(i * 4, i * 4 + 6), f"u{i}").append_column("channel", pa.array(["app"] * 6))
        write_batch(cat, TABLE, update)
        kinds.append({x.kind for x in run_round(cat, defs, TABLE, submit=no_spark).published})
        assert_published_equal(pub_env)
    assert any(SnapshotKind.CONSOLIDATED in k for k in kinds), kinds
    for site in SITES:
        tbl, _ = loaded(pub_env.url, site, TABLE)
        paths = [str(p) for p in tbl.inspect.data_files().column("file_path").to_pylist()]
        old = [p for p in paths if "/_iceberg/filled/" in p]
        assert old and len(paths) > len(old), paths  # the old files as copies, the updates as themselves
        deletes = tbl.inspect.delete_files().column("file_path").to_pylist()
        named = set()
        for path in deletes:
            named |= set(pq.read_table(str(path).removeprefix("file://")).column("file_path").to_pylist())
        assert named & set(old), site  # the merged deletes hide rows of the copies, by the copies' names
    assert set(scan(pub_env.url, "dr", TABLE, KEYS).column("channel").to_pylist()) == {"app", "web"}


def test_a_table_published_before_filled_copies_is_published_afresh_with_them(
    pub_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table published by a version of segrep that listed every segment file as itself (a column with a
    default already added): the layout is part of every state token and fingerprint, so the next publication,
    with nothing else changed, lists the old files' filled copies (a clean snapshot)."""
    cat, defs = pub_env.catalog, pub_env.defs
    write_batch(cat, TABLE, batch(range(0, 20), "v1"))
    run_round(cat, defs, TABLE, submit=no_spark)
    add_defaulted_channel(pub_env)
    with monkeypatch.context() as old:  # the earlier layout: no copies
        old.setattr(publisher, "_LAYOUT", 1)
        old.setattr(fill, "fill_key", lambda *args: None)
        code, _out, err = cli(pub_env, "apply")
        assert code == 0, err
        assert not (pub_env.site_dir("dr") / TABLE / "_iceberg" / "filled").exists()
        again = publish_table(cat, defs, TABLE)
        assert {x.status for x in again.sites} == {PublishStatus.UNCHANGED}
    out = publish_table(cat, defs, TABLE)
    assert {(x.status, x.kind) for x in out.sites} == {(PublishStatus.PUBLISHED, SnapshotKind.CLEAN)}, out
    for site in SITES:
        tbl, _ = loaded(pub_env.url, site, TABLE)
        assert all("/_iceberg/filled/" in str(p) for p in tbl.inspect.data_files().column("file_path").to_pylist())
    assert_published_equal(pub_env)


def test_publish_command_and_bad_input(pub_env: Env, tmp_path: Path) -> None:
    write_batch(pub_env.catalog, TABLE, batch(range(0, 10), "v1"))
    code, out, err = cli(pub_env, "publish", TABLE, "--site", "primary", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [(x["site"], x["status"]) for x in doc["sites"]] == [("primary", "published")]
    code, out, err = cli(pub_env, "publish", TABLE)
    assert code == 0, err
    assert out.splitlines() == [
        f"{TABLE}: iceberg at dr: published, snapshot {_snapshot(pub_env, 'dr')} at safe time "
        + out.splitlines()[0].split("at safe time ")[1],
        *out.splitlines()[1:],
    ]
    assert "events: iceberg at primary: unchanged" in out
    write_batch(pub_env.catalog, TABLE, batch(range(10, 20), "v2"))  # something a publication would publish
    with unchanged(pub_env):
        assert_user_error(*cli(pub_env, "publish", "orders"), "orders is not published", "publish: iceberg")
        assert_user_error(*cli(pub_env, "publish", TABLE, "--site", "nowhere"), "unknown site 'nowhere'")
        assert_user_error(*cli(pub_env, "publish", "nosuch"), "unknown table 'nosuch'")
    pub_env.config.write_text(pub_env.config.read_text().replace("publish: iceberg", "publish: delta"))
    with unchanged(pub_env):
        assert_user_error(*cli(pub_env, "apply"), "publish: expected one of iceberg or null; got 'delta'")


def _snapshot(env: Env, site: str) -> int:
    snap = loaded(env.url, site, TABLE)[0].current_snapshot()
    assert snap is not None
    return snap.snapshot_id


def test_an_s3_site_publishes_in_its_own_bucket_and_no_credential_is_stored(
    s3_env: Env, s3_endpoints: tuple[S3Endpoint, S3Endpoint]
) -> None:
    """dr (S3 endpoint a) publishes in its own bucket; its keys reach neither the catalog rows nor the metadata,
    and a reader given the site's endpoint and keys reads what segrep serves there."""
    a, b = s3_endpoints
    s3_env.config.write_text(s3_env.config.read_text().replace("policy: {retry_delay_s: 0}", _POLICY, 1))
    cat, defs = s3_env.catalog, s3_env.defs
    write_batch(cat, TABLE, batch(range(0, 30), "v1"))
    write_batch(cat, TABLE, batch(range(0, 10), "v2"))
    write_batch(cat, TABLE, keys_only(range(20, 25)), delete=True)
    report = run_round(cat, defs, TABLE, submit=no_spark)
    assert {x.site: x.status for x in report.published} == dict.fromkeys(SITES, PublishStatus.PUBLISHED), report
    secrets = secrets_of(a, b)
    with cat.read() as s:
        rows = s.execute(text("SELECT * FROM iceberg_tables")).all()
    assert len(rows) == 3 and not any(secret in str(row) for row in rows for secret in secrets)
    for site, endpoint in (("dr", a), ("edge", b)):
        props = {
            "s3.endpoint": endpoint.url,
            "s3.region": endpoint.region,
            "s3.access-key-id": endpoint.access_key,
            "s3.secret-access-key": endpoint.secret_key,
        }
        tbl, _ = loaded(s3_env.url, site, TABLE, **props)
        assert tbl.metadata_location.startswith("s3://")
        with tbl.io.new_input(tbl.metadata_location).open() as f:
            metadata = f.read().decode()
        assert not any(secret in metadata for secret in secrets)
        got = scan(s3_env.url, site, TABLE, KEYS, **props)
        want = segrep_rows(s3_env, site)
        assert got.cast(want.schema).equals(want), site


def test_many_rounds_consolidate_the_metadata_and_expired_files_are_collected(
    sqlite_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Incremental snapshots carry their manifests until there are MAX_CARRIED_MANIFESTS; the next one is
    consolidated from the metadata: the largest data manifest carried as it is, the
    others merged into one, every delete file into one whose deletes still apply to the carried manifest's
    files (the scans equal segrep's reads). Snapshots past KEEP_SNAPSHOTS
    expire, and their files (and a killed publication's) are deleted once past the grace, never a file a
    retained snapshot needs."""
    env = sqlite_env
    env.config.write_text(PUBLISHED_YAML)
    monkeypatch.setattr(publisher, "MAX_CARRIED_MANIFESTS", 4)
    cat, defs = env.catalog, env.defs
    kinds, data_manifests = [], []
    for i in range(7):
        write_batch(cat, TABLE, batch(range(i * 3, i * 3 + 10), f"r{i}"))
        if i % 2:
            write_batch(cat, TABLE, keys_only(range(i, i + 2)), delete=True)
        report = run_round(cat, defs, TABLE, submit=no_spark)
        kinds.append({x.site: x.kind for x in report.published}["dr"])
        assert_published_equal(env, ("dr",))
        tbl, _ = loaded(env.url, "dr", TABLE)
        mfs = tbl.current_snapshot().manifests(tbl.io)
        data_manifests.append({mf.manifest_path for mf in mfs if mf.content == ManifestContent.DATA})
    assert kinds[0] == SnapshotKind.CLEAN and SnapshotKind.CONSOLIDATED in kinds, kinds
    at = kinds.index(SnapshotKind.CONSOLIDATED)
    # one data manifest carried as it was (the largest), one merged from the others and the new files
    assert len(data_manifests[at]) == 2 and len(data_manifests[at] & data_manifests[at - 1]) == 1
    tbl, _ = loaded(env.url, "dr", TABLE)
    assert len(tbl.current_snapshot().manifests(tbl.io)) <= 4 + 2
    assert len(tbl.metadata.snapshots) == publisher.KEEP_SNAPSHOTS
    iceberg_dir = env.site_dir("dr") / TABLE / "_iceberg"
    before = {p for p in iceberg_dir.rglob("*") if p.is_file()}
    stray = iceberg_dir / "metadata" / "killed-publication-m0.avro"  # what a killed publication leaves
    stray.write_bytes(b"x")
    site = open_site(cat, q_site(env, "dr"))
    assert collect_unreferenced(tbl, site, TABLE) == 0  # everything is younger than the grace
    collected = collect_unreferenced(tbl, site, TABLE, now=time.time() + ORPHAN_GRACE_S + 1)
    after = {p for p in iceberg_dir.rglob("*") if p.is_file()}
    assert stray not in after and collected == len(before | {stray}) - len(after)
    assert collected > 1  # the expired snapshots' manifests, delete files and indexes
    for snap in tbl.metadata.snapshots:  # every retained snapshot still reads
        assert tbl.scan(snapshot_id=snap.snapshot_id).to_arrow().num_rows > 0
    assert_published_equal(env, ("dr",))


def test_status_shows_each_sites_publication_and_a_failure_with_the_snapshot_readers_still_see(
    pub_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    cat, defs = pub_env.catalog, pub_env.defs
    write_batch(cat, TABLE, batch(range(0, 20), "v1"))
    report = run_round(cat, defs, TABLE, submit=no_spark)
    snapshot = {x.site: x.snapshot_id for x in report.published}
    code, out, err = cli(pub_env, "status", TABLE, "--json")
    assert code == 0, err
    rows = {r["site"]: r for r in json.loads(out)["open_tables"]}
    assert {s: (r["status"], r["snapshot_id"]) for s, r in rows.items()} == {
        s: ("published", snapshot[s]) for s in SITES
    }
    assert rows["dr"]["safe_time_us"] == report.safe_time_us["dr"]
    write_batch(cat, TABLE, batch(range(5, 10), "v2"))
    monkeypatch.setenv(faults.FAULTS_ENV, "publish_before_commit")
    run_round(cat, defs, TABLE, submit=no_spark)
    code, out, err = cli(pub_env, "status", TABLE)
    assert code == 0, err
    block = out.split("open tables (Iceberg catalog `segrep` in the catalog database; <site>.<table>):\n")[1]
    line = next(x for x in block.splitlines() if x.startswith(f"{TABLE}") and " dr " in x)
    assert "FAILED at" in line and str(snapshot["dr"]) in line and "InjectedFault: injected fault" in line


def test_appended_keys_skip_the_index_until_a_later_write_shares_one(sqlite_env: Env) -> None:
    """Files whose keys meet no other listed file's (and hold no tombstone) are published without reading or
    writing the winners index; the first write that may share a key folds them in, and reads stay exact."""
    env = sqlite_env
    env.config.write_text(PUBLISHED_YAML)
    cat, defs = env.catalog, env.defs

    def state(site: str) -> dict[str, list[str]]:
        tbl, summary = loaded(env.url, site, TABLE)
        with tbl.io.new_input(summary["segrep.state"]).open() as f:
            return json.loads(f.read())

    write_batch(cat, TABLE, pa.table({"tenant": ["a", "x"], "seq": [1, 1], "payload": ["p", "p"], "at": [None, None]}))
    run_round(cat, defs, TABLE, submit=no_spark)
    first = state("dr")
    assert first["unindexed"] == [] and len(first["indexed"]) == 2
    for i in range(2, 5):  # each write's keys sort after every earlier key of its partition
        rows = {"tenant": ["b", "y"], "seq": [i, i], "payload": [f"p{i}"] * 2, "at": [None, None]}
        write_batch(cat, TABLE, pa.table(rows, schema=segrep_rows(env, "dr").schema))
        run_round(cat, defs, TABLE, submit=no_spark)
        assert_published_equal(env)
    appended = state("dr")
    assert appended["index"] == first["index"] and len(appended["unindexed"]) == 6
    write_batch(cat, TABLE, batch([3], "update"))  # tenant y, seq 3: a key of an appended file
    write_batch(cat, TABLE, pa.table({"tenant": ["b"], "seq": [2]}), delete=True)
    run_round(cat, defs, TABLE, submit=no_spark)
    folded = state("dr")
    assert folded["unindexed"] == [] and folded["index"] != first["index"]
    assert_published_equal(env)


def test_folds_write_index_deltas_until_their_bound_then_a_new_base_and_gc_keeps_them(
    sqlite_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fold writes the touched keys' new winners as a delta (the base is not rewritten); the previous winner
    of a key is the newest among the deltas and the base: updates of keys in the base and in a delta, a delete
    and a re-insert of the same key read exactly. Past MAX_DELTAS the fold writes a new base; the GC keeps
    every delta a retained snapshot's index needs."""
    env = sqlite_env
    env.config.write_text(PUBLISHED_YAML)
    cat, defs = env.catalog, env.defs
    monkeypatch.setattr(winners_index, "MAX_DELTAS", 3)
    monkeypatch.setattr(winners_index, "DELTA_FRACTION", 10.0)

    def index_doc() -> dict[str, object]:
        tbl, summary = loaded(env.url, "dr", TABLE)
        with tbl.io.new_input(summary["segrep.state"]).open() as f:
            return json.loads(f.read())

    write_batch(cat, TABLE, batch(range(0, 60), "v0"))
    run_round(cat, defs, TABLE, submit=no_spark)
    docs = [index_doc()]
    steps = [
        (batch(range(0, 10), "v1"), False),  # keys of the base
        (batch(range(5, 15), "v2"), False),  # keys of the first delta and of the base
        (keys_only(range(8, 12)), True),  # tombstones of keys whose winner is in a delta
        (batch(range(9, 11), "v3"), False),  # re-inserted after the tombstones; past MAX_DELTAS: a new base
        (batch(range(50, 55), "v4"), False),  # a delta over the new base
    ]
    for rows, delete in steps:
        write_batch(cat, TABLE, rows, delete=delete)
        run_round(cat, defs, TABLE, submit=no_spark)
        assert_published_equal(env)
        docs.append(index_doc())
    assert [len(d["deltas"]) for d in docs] == [0, 1, 2, 3, 0, 1]  # type: ignore[arg-type]
    assert len({d["index"] for d in docs[:4]}) == 1 and docs[4]["index"] != docs[0]["index"]
    assert docs[4]["index_rows"] == 60 and docs[3]["delta_rows"] == 10 + 10 + 4
    tbl, _ = loaded(env.url, "dr", TABLE)
    site = open_site(cat, q_site(env, "dr"))
    collect_unreferenced(tbl, site, TABLE, now=time.time() + ORPHAN_GRACE_S + 1)
    for path in docs[-1]["deltas"]:  # type: ignore[attr-defined]
        assert Path(str(path).removeprefix("file://")).exists(), path
    write_batch(cat, TABLE, batch(range(52, 58), "v5"))  # folds against the base and the kept delta
    run_round(cat, defs, TABLE, submit=no_spark)
    assert_published_equal(env)


@pytest.mark.parametrize("damage", ["missing", "no _version column"])
def test_a_file_the_publication_cannot_read_fails_it_naming_the_file_and_publishes_nothing(
    sqlite_env: Env, damage: str
) -> None:
    """A site's first publication reads every file's keys: a segment file gone, or one without segrep's
    columns, fails the publication (FAILED, naming the file and what is wrong), and no snapshot is made."""
    env = sqlite_env
    cat = env.catalog
    write_batch(cat, TABLE, batch(range(0, 20), "v1"))
    write_batch(cat, TABLE, batch(range(10, 30), "v2"))
    run_round(cat, env.defs, TABLE, submit=no_spark)  # not published yet: the policy says nothing
    env.config.write_text(PUBLISHED_YAML)
    victim = sorted(p for p in (env.site_dir("dr") / TABLE).rglob("*.parquet"))[0]
    rel = victim.relative_to(env.site_dir("dr")).as_posix()
    if damage == "missing":
        victim.unlink()
    else:
        pq.write_table(pq.read_table(victim).drop_columns(["_version"]), victim)
    out = publish_table(cat, env.defs, TABLE, ["dr"]).sites[0]
    assert out.status is PublishStatus.FAILED and out.snapshot_id is None, out
    want = "is missing (run `segrep repair`)" if damage == "missing" else "has no column _version"
    assert f"segment file {rel} {want}" in out.detail, out.detail
    with iceberg_catalog(env.url) as ice:  # registered by the attempt, with no snapshot: nothing to read
        assert ice.load_table(("dr", TABLE)).current_snapshot() is None


def test_a_replica_removed_by_apply_has_its_iceberg_table_unregistered_and_a_returning_one_publishes_again(
    pub_env: Env,
) -> None:
    """A site that holds the table no more is no longer kept current: `apply` unregisters its Iceberg table
    (an engine would otherwise read the rows of its last publication as the table) and status forgets it; its
    files stay. Added back and bootstrapped, it is registered and published again."""
    cat = pub_env.catalog
    write_batch(cat, TABLE, batch(range(0, 30), "v1"))
    run_round(cat, pub_env.defs, TABLE, submit=no_spark)
    iceberg_dir = pub_env.site_dir("edge") / TABLE / "_iceberg"
    assert iceberg_dir.is_dir()
    pub_env.config.write_text(PUBLISHED_YAML.replace("replicas: [dr, edge]", "replicas: [dr]"))
    code, out, err = cli(pub_env, "apply")
    assert code == 0, err
    assert "remove  replica edge of table events" in out
    assert f"{TABLE}: iceberg at edge: retired: the site holds no partition of the table" in out, out
    with iceberg_catalog(pub_env.url) as ice:
        assert not ice.table_exists(("edge", TABLE)) and ice.table_exists(("dr", TABLE))
    assert iceberg_dir.is_dir()  # its files stay, as the replica's segment files do
    code, out, err = cli(pub_env, "status", TABLE, "--json")
    assert code == 0, err
    assert sorted(r["site"] for r in json.loads(out)["open_tables"]) == ["dr", "primary"]
    write_batch(cat, TABLE, batch(range(20, 40), "v2"))
    report = run_round(cat, pub_env.defs, TABLE, submit=no_spark)
    assert sorted(p.site for p in report.published) == ["dr", "primary"]  # nothing more to retire
    assert_published_equal(pub_env, ("primary", "dr"))
    pub_env.config.write_text(PUBLISHED_YAML)
    code, out, err = cli(pub_env, "apply")
    assert code == 0, err
    code, out, err = cli(pub_env, "bootstrap", TABLE, "edge")
    assert code == 0, err
    run_round(cat, pub_env.defs, TABLE, submit=no_spark)
    assert_published_equal(pub_env)


def test_a_lost_catalogs_new_one_publishes_nothing_into_unclaimed_roots_and_the_rebuilt_sites_publish_again(
    tmp_path: Path,
) -> None:
    """The catalog and the leader's site lost: in the new catalog, before `catalog rebuild` claims a replica's
    root, the catalog knows none of its files. Publishing then would show the site's table as empty and write
    into a root this catalog does not own: each site is WAITING (DOWN/UNIDENTIFIED, said by apply and status)
    and its Iceberg directory is untouched. Rebuilt and failed over, dr and edge publish what they serve."""
    env = make_env(tmp_path, sqlite_url(tmp_path), PUBLISHED_YAML)
    write_batch(env.catalog, TABLE, batch(range(0, 30), "v1"))
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    take_down(env, "primary")
    env.catalog.dispose()
    (tmp_path / "catalog.db").unlink()
    new = Env(root=tmp_path, config=env.config, url=f"sqlite:///{tmp_path}/catalog-new.db")

    def iceberg_files(site: str) -> dict[str, int]:
        return {str(p): p.stat().st_mtime_ns for p in (new.site_dir(site) / TABLE / "_iceberg").rglob("*")}

    before = {site: iceberg_files(site) for site in ("dr", "edge")}
    assert cli(new, "init")[0] == 0
    code, out, err = cli(new, "apply", "--site-down", "primary")
    assert code == 0, err
    for site in ("dr", "edge"):
        assert f"{TABLE}: iceberg at {site}: waiting: DOWN/UNIDENTIFIED: site {site} has not been claimed" in out + err
        assert iceberg_files(site) == before[site], site  # nothing written into the unclaimed root
    assert f"{TABLE}: iceberg at primary: waiting: DOWN/UNIDENTIFIED: site primary: its root" in out + err
    with iceberg_catalog(new.url) as ice:
        assert not ice.table_exists(("dr", TABLE)) and not ice.table_exists(("edge", TABLE))
    code, out, err = cli(new, "status", TABLE, "--json")
    assert code == 0, err
    rows = {r["site"]: r for r in json.loads(out)["open_tables"]}
    assert {s: (r["status"], r["snapshot_id"]) for s, r in rows.items()} == {
        s: ("waiting", None) for s in ("dr", "edge", "primary")
    }
    for site in ("dr", "edge"):
        assert cli(new, "catalog", "rebuild", "--site", site, "--accept-loss")[0] == 0
    code, out, err = cli(new, "failover", TABLE, "--to", "dr")
    assert code == 0, err
    assert f"{TABLE}: iceberg at dr: published" in out and f"{TABLE}: iceberg at edge: published" in out, out
    assert_published_equal(new, ("dr", "edge"))
    assert segrep_rows(new, "dr").num_rows == 30


def test_publications_racing_for_a_site_both_end_published(pub_env: Env) -> None:
    """Two processes' publications of the same sites at once: the catalog's conditional update lets one
    commit; the other looks again and finds it done (or commits after it), never a FAILED result."""
    cat, defs = pub_env.catalog, pub_env.defs
    write_batch(cat, TABLE, batch(range(0, 30), "v1"))
    run_round(cat, defs, TABLE, submit=no_spark)
    write_batch(cat, TABLE, batch(range(10, 40), "v2"))
    procs = [
        subprocess.Popen(cli_command(pub_env, "publish", TABLE, "--json"), stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    statuses = [x["status"] for out in outs for x in json.loads(out)["sites"] if x["site"] == "primary"]
    assert "failed" not in statuses and "published" in statuses, statuses
    assert_published_equal(pub_env)


def test_a_publication_killed_midway_leaves_a_readable_snapshot_and_the_next_one_completes(pub_env: Env) -> None:
    cat, defs = pub_env.catalog, pub_env.defs
    write_batch(cat, TABLE, batch(range(0, 30), "v1"))
    run_round(cat, defs, TABLE, submit=no_spark)
    before = scan(pub_env.url, "primary", TABLE, KEYS)
    write_batch(cat, TABLE, batch(range(5, 15), "v2"))
    env = {**os.environ, faults.FAULTS_ENV: "publish_before_commit:hang"}
    proc = subprocess.Popen(
        cli_command(pub_env, "publish", TABLE, "--site", "primary"), stderr=subprocess.PIPE, text=True, env=env
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert faults.HANG_MARK in line, line
    proc.kill()  # kill -9 with its files written and the catalog not yet updated
    proc.wait()
    assert scan(pub_env.url, "primary", TABLE, KEYS).equals(before)
    again = publish_table(cat, defs, TABLE, ["primary"])
    assert [x.status for x in again.sites] == [PublishStatus.PUBLISHED]
    assert_published_equal(pub_env, ("primary",))


def test_an_unloading_parents_old_files_are_listed_once_as_filled_copies_while_a_replica_reads_them(
    pub_env: Env,
) -> None:
    """A split while edge is down, after a column with a default was added: until edge has the children the
    parent stays in UNLOAD and dr serves each child from the child's files and the parent's (DESIGN 9). The
    parent's files, written before the column, are listed once each as their filled copies (named by the
    parent's paths) and the rows an update superseded in them are hidden by the copy's name; once edge is
    back and the parent retired, the children's files are listed as themselves (the split wrote them at the
    current version)."""
    cat, defs = pub_env.catalog, pub_env.defs
    write_batch(cat, TABLE, batch(range(0, 60), "v1"))
    write_batch(cat, TABLE, batch(range(0, 60, 3), "v2"))
    run_round(cat, defs, TABLE, submit=no_spark)
    add_defaulted_channel(pub_env)
    code, _out, err = cli(pub_env, "apply")
    assert code == 0, err
    parent = first_partition(pub_env)
    with cat.read() as s:
        parent_files = set(s.scalars(text("SELECT relpath FROM segments WHERE partition_id = :p"), {"p": parent}))
    aside = take_down(pub_env, "edge")
    report = run_split(cat, defs, TABLE, parent, ["b"], submit=no_spark)
    assert report.state == SplitState.UNLOAD and report.waiting
    update = batch(range(0, 60, 5), "v3").append_column("channel", pa.array(["app"] * 12))
    write_batch(cat, TABLE, update)  # hides rows of the parent's files through the children
    run_round(cat, defs, TABLE, submit=no_spark)
    assert_published_equal(pub_env, ("primary", "dr"))
    listed = files_listed(pub_env, "dr")
    copies = {fill.copy_relpath(TABLE, rel, key) for rel in parent_files for key in _fill_keys(pub_env)}
    assert parent_files and not parent_files & listed  # the parent's files lack the column: never as themselves
    assert copies <= listed  # named by the parent's paths
    paths = loaded(pub_env.url, "dr", TABLE)[0].inspect.data_files().column("file_path").to_pylist()
    assert len(paths) == len(set(paths)), paths  # each once, though both children read the parent's files
    channels = scan(pub_env.url, "dr", TABLE, KEYS).column("channel").to_pylist()
    assert channels.count("app") == 12 and set(channels) == {"app", "web"}
    bring_up(pub_env, "edge", aside)
    for _ in range(2):
        run_round(cat, defs, TABLE, submit=no_spark)
        finish_unloaded(cat, defs, TABLE)
    assert_published_equal(pub_env)
    assert not any(files_listed(pub_env, site) & copies for site in SITES)


def _fill_keys(env: Env) -> set[str]:
    """The fill keys of the table's files written before its newest version (one here: the channel's)."""
    with env.catalog.read() as s:
        info = q.table_info(s, TABLE)
        versions = schema_versions(s, info.table_id)
    return {key for v in versions.values() if (key := fill.fill_key(v, info.versions.target)) is not None}
