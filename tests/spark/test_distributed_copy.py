"""The Spark distributed copy: fast-forward batches at or above the policy's byte threshold go through one
spark-submit of spark_jobs/distributed_copy.py per batch, with the same verification as in-process copies."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from segrep.data.reader import read_table
from segrep.data.writer import write_batch
from segrep.replication.orchestrator import run_round
from segrep.spark import launch
from segrep.storage.live_rates import read_rate
from tests.support.env import ORDERS_YAML, make_env
from tests.support.s3 import S3Endpoint, s3_events_yaml, secrets_of

pytestmark = pytest.mark.spark

EVENTS_POLICY = "    replicas: [dr, edge]\n    policy: {spark_copy_threshold_bytes: 1}\n"


def _rows(keys: range, tag: str) -> pa.Table:
    n = len(keys)
    return pa.table(
        {
            "tenant": [f"t{k % 3}" for k in keys],
            "seq": list(keys),
            "payload": [f"{tag}{k}" for k in keys],
            "at": pa.array([None] * n, pa.timestamp("us", tz="UTC")),
        }
    )


def test_batches_above_the_threshold_are_copied_by_spark(tmp_path: Path) -> None:
    env = make_env(
        tmp_path, f"sqlite:///{tmp_path}/catalog.db", ORDERS_YAML.replace("    replicas: [dr, edge]\n", EVENTS_POLICY)
    )
    write_batch(env.catalog, "events", _rows(range(0, 200), "a"))
    write_batch(env.catalog, "events", _rows(range(100, 300), "b"))
    calls: list[str] = []

    def counting_submit(app: str, args: list[str], *, name: str, master: str | None = None) -> None:
        calls.append(app)
        launch.submit(app, args, name=name, master="local[2]")

    report = run_round(env.catalog, env.defs, "events", submit=counting_submit)

    assert calls == ["distributed_copy", "distributed_copy"]  # one application per target's batch, no merge
    assert report.status == "ok"
    assert {site: r.spark_apps for site, r in report.targets.items()} == {"dr": 1, "edge": 1}
    assert all(r.segments_copied == 2 for r in report.targets.values())
    key = [("tenant", "ascending"), ("seq", "ascending")]
    leader = read_table(env.catalog, "events").sort_by(key)
    assert leader.num_rows == 300
    for site in ("dr", "edge"):
        assert read_table(env.catalog, "events", site).sort_by(key).equals(leader)
    env.catalog.dispose()


def test_the_distributed_copy_reaches_s3_sites_with_their_own_options(
    s3_endpoints: tuple[S3Endpoint, S3Endpoint], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The executors have not loaded the definitions: each item carries both sites' store options (endpoint,
    region, credentials reference; no secret), and the secrets come from the application's environment."""
    a, b = s3_endpoints
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    for name, value in {**a.env("DR_S3"), **b.env("EDGE_S3")}.items():
        monkeypatch.setenv(name, value)
    yaml = s3_events_yaml(a, b, uuid.uuid4().hex[:12]).replace(
        "policy: {retry_delay_s: 0}", "policy: {retry_delay_s: 0, spark_copy_threshold_bytes: 1}"
    )
    env = make_env(tmp_path, f"sqlite:///{tmp_path}/catalog.db", yaml)
    write_batch(env.catalog, "events", _rows(range(0, 200), "a"))
    calls: list[str] = []

    def counting_submit(app: str, args: list[str], *, name: str, master: str | None = None) -> None:
        calls.append(app)
        items = Path(args[args.index("--items") + 1]).read_text()
        assert not [s for s in secrets_of(a, b) if s in items], "a secret in the copy items"
        launch.submit(app, args, name=name, master="local[2]")

    report = run_round(env.catalog, env.defs, "events", submit=counting_submit)
    assert calls == ["distributed_copy", "distributed_copy"] and report.status == "ok", report
    key = [("tenant", "ascending"), ("seq", "ascending")]
    leader = read_table(env.catalog, "events").sort_by(key)
    for site in ("dr", "edge"):
        assert read_table(env.catalog, "events", site).sort_by(key).equals(leader), site
    env.catalog.dispose()


def test_a_batch_over_a_capped_link_carries_the_share_its_tasks_follow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over a capped link each item carries its share and the batch's rate file, which the driver keeps
    current while the application runs and the executors' copies read again every second (issue 36); the
    file is gone once the batch is done. A target without a link gets neither."""
    rates = tmp_path / "rates"
    rates.mkdir()
    monkeypatch.setenv("SEGREP_LINK_RATES_DIR", str(rates))
    yaml = ORDERS_YAML.replace("    replicas: [dr, edge]\n", EVENTS_POLICY)
    env = make_env(
        tmp_path,
        f"sqlite:///{tmp_path}/catalog.db",
        f"{yaml}links:\n  - {{from: primary, to: dr, max_bytes_per_second: 4MB}}\n",
    )
    write_batch(env.catalog, "events", _rows(range(0, 200), "a"))
    seen: list[dict[str, Any]] = []

    def checking_submit(app: str, args: list[str], *, name: str, master: str | None = None) -> None:
        items = json.loads(Path(args[args.index("--items") + 1]).read_text())
        for item in items:
            if item["rate_file"] is not None:  # what the executors read: the share the item starts with
                assert read_rate(item["rate_file"], item["source"], item["target"]) == item["bytes_per_s"]
        seen.extend(items)
        launch.submit(app, args, name=name, master="local[2]")

    report = run_round(env.catalog, env.defs, "events", submit=checking_submit)
    assert report.status == "ok", report
    link = env.defs.link("primary", "dr")
    assert link is not None and link.max_bytes_per_second is not None
    to_dr = [i for i in seen if i["target"] == "dr"]
    to_edge = [i for i in seen if i["target"] == "edge"]
    assert to_dr and to_edge
    assert all(i["rate_file"] and 0 < i["bytes_per_s"] * len(to_dr) <= link.max_bytes_per_second for i in to_dr)
    assert all(i["rate_file"] is None and i["bytes_per_s"] is None for i in to_edge)
    assert list(rates.iterdir()) == []  # removed with the driver's slot
    key = [("tenant", "ascending"), ("seq", "ascending")]
    leader = read_table(env.catalog, "events").sort_by(key)
    for site in ("dr", "edge"):
        assert read_table(env.catalog, "events", site).sort_by(key).equals(leader)
    env.catalog.dispose()
