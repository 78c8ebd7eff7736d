"""The safe time a published snapshot claims (issue 37): never past what the site holds.

Found while verifying the open tables on TPC-H (tests/publish/test_tpch_open_tables.py). The publisher
(``publisher._site_state``) took the partitions' newest version as the safe time of a site that leads every
partition, and of a site with no safe time in the catalog. Neither holds every write up to it: an old leader
after a failover (rounds leave its safe time unset while it lists writes the failover gave up), a replica no
round has reached, the leader of an active-active table (the writes other sites took and it has not merged),
a new leader under ``on_return: merge`` (the old leader's writes, merged later). Fixed: a site the catalog
has no safe time for publishes "unknown" (0), and a leader's is bounded as rounds bound it
(``replication.safetime.leader_safe_time``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyiceberg.exceptions import NoSuchTableError
from sqlalchemy import select

from segrep import write_batch as public_write
from segrep.catalog import models as m
from segrep.data.writer import write_batch
from segrep.failover.promote import failover
from segrep.publish.outcome import PublishStatus
from segrep.publish.publisher import publish_table
from segrep.replication.orchestrator import run_round
from tests.support.env import ORDERS_YAML, Env, env_fixture, sqlite_url
from tests.support.iceberg import loaded, scan
from tests.support.rounds import no_spark
from tests.support.tables import TABLE, batch

KEYS = ("tenant", "seq")

# `events` published (as tests/publish/test_publication.py defines it), on SQLite
POLICY = "    policy: {publish: iceberg, retry_delay_s: 0}\n"
PUBLISHED_YAML = ORDERS_YAML.replace("    replicas: [dr, edge]\n", "    replicas: [dr, edge]\n" + POLICY)


# the same, active-active: every site takes writes (`writes: any_site`)
ANY_SITE_YAML = PUBLISHED_YAML.replace(POLICY, "    writes: any_site\n" + POLICY)


# `events` published with ``on_return: merge``: what a failover gives up comes back into the new leader
MERGE_POLICY = "    policy: {publish: iceberg, retry_delay_s: 0, on_return: merge}\n"
MERGE_YAML = PUBLISHED_YAML.replace(POLICY, MERGE_POLICY)


@pytest.fixture
def safe_env(tmp_path: Path) -> Iterator[Env]:
    yield from env_fixture(tmp_path, sqlite_url(tmp_path), PUBLISHED_YAML)


@pytest.fixture
def published_merge_env(tmp_path: Path) -> Iterator[Env]:
    yield from env_fixture(tmp_path, sqlite_url(tmp_path), MERGE_YAML)


@pytest.fixture
def any_site_env(tmp_path: Path) -> Iterator[Env]:
    yield from env_fixture(tmp_path, sqlite_url(tmp_path), ANY_SITE_YAML)


def recorded_safe_time(env: Env, site: str) -> int | None:
    with env.catalog.read() as s:
        return s.scalar(
            select(m.SafeTime.safe_time_us)
            .join(m.Site, m.Site.site_id == m.SafeTime.site_id)
            .join(m.Table, m.Table.table_id == m.SafeTime.table_id)
            .where(m.Table.name == TABLE, m.Site.name == site)
        )


def test_an_old_leader_never_claims_a_write_made_at_the_new_leader(safe_env: Env) -> None:
    cat, defs = safe_env.catalog, safe_env.defs
    write_batch(cat, TABLE, batch(range(0, 20), "v1"))
    run_round(cat, defs, TABLE, submit=no_spark)
    write_batch(cat, TABLE, batch(range(20, 30), "lost"))  # only primary has it when it loses the lead
    failover(cat, defs, [TABLE], to="dr", submit=no_spark)
    written = public_write(cat, TABLE, batch(range(40, 45), "api"), defs=defs)  # at dr only
    newest = max(seg.version for seg in written.segments)
    assert recorded_safe_time(safe_env, "primary") is None  # rounds leave it unset while primary holds the loss

    pub = publish_table(cat, defs, TABLE, ["primary"])  # as `segrep publish events --site primary` does
    status = pub.sites[0].status
    _, summary = loaded(safe_env.url, "primary", TABLE)
    claimed = int(summary["segrep.safe-time-us"])
    # primary does not hold the write at dr: a safe time at or past its version is a promise primary breaks
    assert claimed < newest, (status, claimed, newest)
    assert status is not PublishStatus.FAILED


def test_a_replica_no_round_reached_claims_no_write(safe_env: Env) -> None:
    cat, defs = safe_env.catalog, safe_env.defs
    written = write_batch(cat, TABLE, batch(range(0, 20), "v1"))
    newest = max(seg.version for seg in written.segments)
    pub = {x.site: x for x in publish_table(cat, defs, TABLE).sites}  # `segrep publish events`, before any round
    assert pub["primary"].status is PublishStatus.PUBLISHED
    assert recorded_safe_time(safe_env, "dr") is None
    try:
        _, summary = loaded(safe_env.url, "dr", TABLE)
    except NoSuchTableError:
        return  # not published at all: no claim
    # dr holds none of the rows written at primary: no published safe time may cover them
    assert int(summary["segrep.safe-time-us"]) < newest, pub["dr"]


def test_a_leader_never_claims_a_write_another_site_took(any_site_env: Env) -> None:
    cat, defs = any_site_env.catalog, any_site_env.defs
    public_write(cat, TABLE, batch(range(0, 20), "p"), defs=defs)
    run_round(cat, defs, TABLE, submit=no_spark)
    at_dr = public_write(cat, TABLE, batch(range(10, 30), "d"), site="dr", defs=defs)  # read at dr at once
    oldest_at_dr = min(seg.version for seg in at_dr.segments)
    public_write(cat, TABLE, batch(range(40, 45), "p2"), defs=defs)  # at primary: primary published again
    _, summary = loaded(any_site_env.url, "primary", TABLE)
    payloads = scan(any_site_env.url, "primary", TABLE, KEYS).column("payload").to_pylist()
    assert not [p for p in payloads if p.startswith("d")]  # primary does not hold dr's write before a round
    claimed = int(summary["segrep.safe-time-us"])
    assert claimed < oldest_at_dr, (claimed, oldest_at_dr)


def test_a_new_leader_never_claims_the_writes_it_will_merge(published_merge_env: Env) -> None:
    cat, defs = published_merge_env.catalog, published_merge_env.defs
    write_batch(cat, TABLE, batch(range(0, 20), "v1"))
    run_round(cat, defs, TABLE, submit=no_spark)
    lost = write_batch(cat, TABLE, batch(range(20, 30), "lost"))  # only primary has it when it loses the lead
    oldest_lost = min(seg.version for seg in lost.segments)
    failover(cat, defs, [TABLE], to="dr", submit=no_spark)  # publishes dr, the new leader
    payloads = scan(published_merge_env.url, "dr", TABLE, KEYS).column("payload").to_pylist()
    assert not [p for p in payloads if p.startswith("lost")]  # dr holds none of it until the merge
    claimed = int(loaded(published_merge_env.url, "dr", TABLE)[1]["segrep.safe-time-us"])
    assert claimed < oldest_lost, (claimed, oldest_lost)
