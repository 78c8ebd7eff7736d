"""Spark jobs on sites on S3-compatible stores (issue 13 item 3), on two moto endpoints, Spark in local mode.

`events` is led by `dr` (a prefix on endpoint a); `primary` is local and `edge` is on endpoint b, each S3 site
with its own keys by reference (DR_S3_*, EDGE_S3_*; no AWS_* variable is set). The executors read every segment
through the package's own file systems with the store options the manifests carry, and the driver writes each
output at the S3 leader: a fork merge (incoming from the local site and from the other endpoint), majors
(round and compaction), a split's rewrites and merges, verify's digests, and `read_dataframe` all run on the
session's SparkSession; `spark_jobs/read_table.py` runs once through spark-submit, whose executors find the
keys in the environment the application inherited. No secret is in any manifest or output.

The session's JVM was started before this test set its variables, so the test hands them to the Python
workers through the SparkContext's executor environment (as `spark.executorEnv.*` would); spark-submit, the
production path, simply inherits them. The merges are pinned to Spark (``SEGREP_MERGE_ENGINE``): they are small
enough to run in process otherwise (tests/replication/test_site_kinds.py merges on S3 sites in process).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from segrep.config.stores import CredentialsRef, StoreOptions
from segrep.core.errors import SegrepError
from segrep.core.states import SplitState
from segrep.data.reader import read_table
from segrep.data.spark_reader import read_dataframe
from segrep.maintenance import verify as verify_module
from segrep.maintenance.compaction import compact
from segrep.maintenance.verify import RowCheck, Verdict, verify
from segrep.maintenance.verify_spark import SparkDigests
from segrep.replication.orchestrator import run_round
from segrep.replication.unload import finish_unloaded
from segrep.spark import launch
from segrep.spark.manifest import Manifest
from segrep.spark.merge_runner import ENGINE_ENV
from segrep.split.run import run_split
from segrep.split.workflow import find_split
from tests.support.checks import assert_replicas_equal_leader, partitions, triples
from tests.support.env import Env, make_env, sqlite_url
from tests.support.models import Model
from tests.support.rounds import no_spark, ok_or_waiting_for_a_merge, set_leader
from tests.support.s3 import S3Endpoint, s3_events_yaml, secrets_of
from tests.support.spark import spark_submit_in
from tests.support.tables import TABLE


def _yaml(a: S3Endpoint, b: S3Endpoint) -> str:
    """`events` led by dr (S3 endpoint a), every pair digested on Spark, compaction after 3 minors."""
    text = s3_events_yaml(a, b, uuid.uuid4().hex[:12])
    led_by_dr = "    leader: dr\n    replicas: [primary, edge]\n"
    text = text.replace("    leader: primary\n    replicas: [dr, edge]\n", led_by_dr)
    policy = "policy: {retry_delay_s: 0, verify_spark_threshold_bytes: 1, compact_min_segments: 3}"
    text = text.replace("policy: {retry_delay_s: 0}", policy)
    assert led_by_dr in text and policy in text
    return text


@pytest.fixture
def s3_led(
    s3_endpoints: tuple[S3Endpoint, S3Endpoint], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark: Any
) -> Iterator[Env]:
    """The environment, and the S3 keys in this process's environment and in the Spark workers'."""
    a, b = s3_endpoints
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    keys = {**a.env("DR_S3"), **b.env("EDGE_S3")}
    for name, value in keys.items():
        monkeypatch.setenv(name, value)
    workers = spark.sparkContext.environment
    saved = {name: workers.get(name) for name in keys}
    workers.update(keys)
    env = make_env(tmp_path, sqlite_url(tmp_path), _yaml(a, b))
    try:
        yield env
    finally:
        env.catalog.dispose()
        for name, value in saved.items():
            if value is None:
                workers.pop(name, None)
            else:
                workers[name] = value


def recording(spark: Any, manifests: list[Manifest]) -> Any:
    """``submit`` running the job in this SparkSession, keeping each merge manifest it ran."""
    inner = spark_submit_in(spark)

    def submit(app: str, args: Sequence[str], *, name: str, master: str | None = None) -> None:
        if app == "merge":
            manifests.append(Manifest.load(args[args.index("--manifest") + 1]))
        inner(app, args, name=name, master=master)

    return submit


def rounds(env: Env, submit: Any, max_rounds: int = 6) -> None:
    """Rounds until one copies and merges nothing, each allowed to run Spark."""
    for _ in range(max_rounds):
        rep = run_round(env.catalog, env.defs, TABLE, submit=submit)
        assert ok_or_waiting_for_a_merge(rep), rep
        if not rep.merges.items and not any(t.segments_copied or t.outcomes for t in rep.targets.values()):
            return
    pytest.fail(f"no idle round after {max_rounds}")


def all_sites_read(env: Env, model: Model) -> None:
    assert triples(env.catalog) == model.snapshot()
    assert_replicas_equal_leader(env.catalog, ("primary", "edge"))


def fork_everywhere(env: Env, model: Model) -> None:
    """dr leads and replicates; primary (local) leads a while, then edge (endpoint b); dr leads again."""
    model.upsert(env, range(60), "a")
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).status == "ok"
    set_leader(env.catalog, "primary")
    model.upsert(env, range(40, 70), "p")
    model.delete(env, range(0, 5))
    set_leader(env.catalog, "edge")
    model.upsert(env, range(65, 80), "e")  # newer than primary's 65-69
    set_leader(env.catalog, "dr")
    model.upsert(env, range(50, 60), "d")  # newer than primary's 50-59
    model.delete(env, range(45, 48))  # newer deletes of keys primary updated


def test_spark_jobs_read_and_write_segments_on_s3_sites(
    s3_led: Env,
    s3_endpoints: tuple[S3Endpoint, S3Endpoint],
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env, model = s3_led, Model()
    manifests: list[Manifest] = []
    submit = recording(spark, manifests)
    monkeypatch.setenv(ENGINE_ENV, "spark")

    # a fork merge at the S3 leader, reading forks on the local site and on the other endpoint
    fork_everywhere(env, model)
    rounds(env, submit)
    merges = [it for mf in manifests for it in mf.items if it.kind == "merge"]
    assert merges and {it.leader_site for it in merges} == {"dr"}
    assert {f.site for it in merges for f in it.incoming} == {"primary", "edge"}
    assert {f.site for it in merges for f in it.visible} == {"dr"}
    all_sites_read(env, model)

    # compaction: majors folded at the S3 leader, fast-forwarded to the replicas
    model.upsert(env, range(80, 100), "c")
    rounds(env, no_spark)
    report = compact(env.catalog, env.defs, TABLE, force=True, submit=submit)
    assert report.committed == len(partitions(env.catalog)) and report.dropped == []
    assert manifests[-1].items and {it.kind for it in manifests[-1].items} == {"major"}
    rounds(env, no_spark)
    all_sites_read(env, model)

    # verify: every pair digested on Spark (S3 and local sides), digests equal to the in-process ones
    in_process = verify(env.catalog, TABLE, record=False)
    reads: list[int] = []
    real = verify_module.placement_rows
    monkeypatch.setattr(verify_module, "placement_rows", counting(real, reads))
    on_spark = verify(env.catalog, TABLE, record=False, spark=SparkDigests.for_table(env.defs, TABLE, submit))
    assert on_spark.spark_apps == 1 and len(on_spark.rows) == 2 * len(partitions(env.catalog))
    assert all(r.on_spark and r.verdict == Verdict.EQUAL for r in on_spark.rows) and reads == []
    assert _digests(on_spark.rows) == _digests(in_process.rows) and in_process.rows[0].leader is not None

    # a split of [-inf, m) at the S3 leader: rewrites read and written on S3, children replicated
    model.upsert(env, range(100, 120), "s")
    parent, before = partitions(env.catalog)[0], len(manifests)
    split = run_split(env.catalog, env.defs, TABLE, parent, ["b"], submit=submit)
    assert split.state == SplitState.UNLOAD and split.finish.replicas_only  # till the children reach replicas
    rewrites = [it for mf in manifests[before:] for it in mf.items if it.kind == "split"]
    assert rewrites and {(it.leader_site, f.site) for it in rewrites for f in it.incoming} == {("dr", "dr")}
    rounds(env, no_spark)  # the children reach the replicas; the round's commit retires the parent
    assert find_split(env.catalog, TABLE, parent).state == SplitState.DONE
    assert finish_unloaded(env.catalog, env.defs, TABLE) == []
    all_sites_read(env, model)

    # the Spark reader at the S3 sites, and the read job through spark-submit at edge (endpoint b)
    for site in ("dr", "edge"):
        expected = sorted(tuple(r.values()) for r in read_table(env.catalog, TABLE, site).to_pylist())
        got = sorted(tuple(r) for r in read_dataframe(spark, env.catalog, TABLE, site).collect())
        assert got == expected and len(got) == len(model.rows), site
    job_output = read_job(env, tmp_path / "edge-out", "edge")
    got_rows = pq.read_table(tmp_path / "edge-out").to_pylist()
    assert sorted(map(_key, got_rows)) == sorted(map(_key, read_table(env.catalog, TABLE, "edge").to_pylist()))

    assert_no_secret_in_manifests(env, secrets_of(*s3_endpoints), job_output)


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return row["tenant"], row["seq"], row["payload"], row["at"]


def counting(real: Any, reads: list[int]) -> Any:
    """``placement_rows`` noting each placement read in process."""

    def placement_rows(info: Any, pf: Any) -> Any:
        reads.append(pf.placement_id)
        return real(info, pf)

    return placement_rows


def _digests(rows: Sequence[RowCheck]) -> list[tuple[Any, ...]]:
    return sorted((r.partition_id, r.site, r.verdict, r.leader, r.replica) for r in rows)


def read_job(env: Env, out: Path, site: str) -> str:
    """spark_jobs/read_table.py through spark-submit as ``launch`` starts it (its environment: this process's,
    keys included), with the definitions file; the job's output, to look for secrets in."""
    args = ["--catalog", env.url, "--config", str(env.config), TABLE, "--site", site, "--output", str(out)]
    cmd = launch.command("read_table", args, name="segrep-read-s3", master="local[2]")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=launch.spark_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def assert_no_secret_in_manifests(env: Env, secrets: list[str], job_output: str) -> None:
    """Manifests carry each site's options and credentials reference, never a secret; nor does any other file
    of the work directory, nor the read job's output."""
    written = [p for p in env.root.rglob("*") if p.is_file()]
    manifests = [p for p in written if p.suffix == ".json" and "manifest" in p.name]
    assert manifests, sorted(map(str, written))
    references = set()
    for path in manifests:
        doc = json.loads(path.read_text())
        for item in doc["items"]:
            for ref in item.get("files", []) + item.get("incoming", []) + item.get("visible", []):
                creds = ref["options"]["credentials"]
                references.add((ref["site"], None if creds is None else creds["env_prefix"]))
    assert {("dr", "DR_S3"), ("edge", "EDGE_S3"), ("primary", None)} <= references
    for path in written:
        text = path.read_bytes().decode("latin-1")
        for secret in secrets:
            assert secret not in text, f"a secret appears in {path}"
    for secret in secrets:
        assert secret not in job_output, "a secret appears in the read job's output"


# -- the options' JSON form --------------------------------------------------------------------------------------


def test_store_options_travel_as_json_and_are_checked_on_the_way_back() -> None:
    full = StoreOptions(
        endpoint="http://127.0.0.1:9000",
        region="eu-west-1",
        path_style=False,
        connect_timeout_s=2.0,
        request_timeout_s=30.0,
        retries=3,
        credentials=CredentialsRef(env_prefix="DR_S3"),
    )
    for options in (full, StoreOptions(), StoreOptions(credentials=CredentialsRef(airflow_conn_id="s3_dr"))):
        doc = json.loads(json.dumps(options.to_doc()))
        assert doc == dataclasses.asdict(options)  # what a manifest's asdict writes
        assert StoreOptions.from_doc(doc) == options
    bad = [
        {"endpoint": "http://key:secret@host"},
        {"retries": 99},
        {"connect_timeout_s": -1},
        {"credentials": {"env_prefix": "DR_S3", "airflow_conn_id": "x"}},
        {"credentials": {"secret_access_key": "x"}},
        {"surprise": 1},
        [],
    ]
    for doc in bad:
        with pytest.raises(SegrepError, match="store options"):
            StoreOptions.from_doc(doc)
