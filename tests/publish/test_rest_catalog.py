"""Open tables registered in an Iceberg REST catalog (``iceberg_catalog: {type: rest, uri: ...}``) instead of
the SQL catalog in segrep's database: publication goes through the service, a reader pointed at the service
reads what segrep serves at each site, and a bad entry is refused before anything is written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyiceberg.catalog.rest import RestCatalog
from sqlalchemy import inspect

from segrep.data.reader import read_table
from segrep.publish.outcome import PublishStatus
from segrep.replication.orchestrator import run_round
from segrep.replication.publication import write_batch
from tests.support.badinput import assert_user_error, unchanged
from tests.support.cli import cli
from tests.support.env import ORDERS_YAML, Env, env_fixture, sqlite_url
from tests.support.rest_catalog import RestService, rest_catalog_service
from tests.support.rounds import no_spark
from tests.support.tables import TABLE, batch

KEYS = [("tenant", "ascending"), ("seq", "ascending")]
PUBLISHED = ORDERS_YAML.replace(
    "    replicas: [dr, edge]\n", "    replicas: [dr, edge]\n    policy: {publish: iceberg}\n"
)
TOKEN = "t0ken-for-the-tests"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[RestService]:
    with rest_catalog_service(tmp_path, token=TOKEN) as svc:
        yield svc


@pytest.fixture
def rest_env(service: RestService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    monkeypatch.setenv("SEGREP_ICEBERG_TOKEN", TOKEN)
    entry = f"iceberg_catalog: {{type: rest, uri: '{service.uri}', token_env: SEGREP_ICEBERG_TOKEN}}\n"
    root = tmp_path / "env"
    root.mkdir()
    yield from env_fixture(root, sqlite_url(tmp_path), entry + PUBLISHED)


def test_publication_through_a_rest_catalog_reads_back_at_every_site(rest_env: Env, service: RestService) -> None:
    cat, defs = rest_env.catalog, rest_env.defs
    write_batch(cat, TABLE, batch(range(0, 30), "v1"), defs=defs)  # the leader published at once, through the service
    write_batch(cat, TABLE, batch(range(10, 20), "v2"), defs=defs)
    write_batch(cat, TABLE, batch(range(25, 28), "x").select(["tenant", "seq"]), delete=True, defs=defs)
    report = run_round(cat, defs, TABLE, submit=no_spark)
    statuses = {x.site: x.status for x in report.published}  # the leader was published by each write
    assert statuses == {
        "primary": PublishStatus.UNCHANGED,
        "dr": PublishStatus.PUBLISHED,
        "edge": PublishStatus.PUBLISHED,
    }
    assert any(r.startswith("POST /v1/namespaces/dr/tables/events") for r in service.requests)  # a commit
    assert "iceberg_tables" not in inspect(cat.engine).get_table_names()  # nothing in segrep's database
    reader = RestCatalog("reader", uri=service.uri, token=TOKEN)
    for site in ("primary", "dr", "edge"):
        got = reader.load_table((site, TABLE)).scan().to_arrow().sort_by(KEYS)
        want = read_table(cat, TABLE, site).sort_by(KEYS)
        assert got.cast(want.schema).equals(want), site
    assert {tuple(ns) for ns in service.store.list_namespaces()} == {("primary",), ("dr",), ("edge",)}


def test_a_rest_catalog_without_its_token_fails_the_publication_not_the_round(
    rest_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SEGREP_ICEBERG_TOKEN")
    cat, defs = rest_env.catalog, rest_env.defs
    write_batch(cat, TABLE, batch(range(0, 5), "v1"))
    report = run_round(cat, defs, TABLE, submit=no_spark)
    assert report.status == "ok"
    failed = {x.site: x for x in report.published}["dr"]
    assert failed.status == PublishStatus.FAILED and "SEGREP_ICEBERG_TOKEN is not set" in failed.detail
    assert TOKEN not in report.text()


@pytest.mark.parametrize(
    ("entry", "needles"),
    [
        ("iceberg_catalog: {type: rest}\n", ("needs uri",)),
        ("iceberg_catalog: {type: nessie, uri: 'http://x'}\n", ("expected sql or rest", "'nessie'")),
        ("iceberg_catalog: {uri: 'http://x'}\n", ("uri only apply to type: rest",)),
        ("iceberg_catalog: {type: rest, uri: 'ftp://x'}\n", ("http:// or https:// URL", "ftp://x")),
        ("iceberg_catalog: {type: rest, uri: 'http://x', token_env: 'not a name'}\n", ("token_env",)),
        ("iceberg_catalog: {type: rest, uri: 'http://x', token: abc}\n", ("token",)),
        ("iceberg_catalog: [rest]\n", ("iceberg_catalog",)),
    ],
)
def test_a_bad_iceberg_catalog_entry_is_refused_and_writes_nothing(
    sqlite_env: Env, entry: str, needles: tuple[str, ...]
) -> None:
    path = sqlite_env.config.with_name("bad_catalog.yaml")
    path.write_text(entry + PUBLISHED)
    with unchanged(sqlite_env):
        assert_user_error(*cli(sqlite_env, "apply", config=path), *needles)
