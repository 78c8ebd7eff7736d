"""OpenLineage events of segrep's DAG runs, as a lineage backend (Marquez) receives them: each copy of a table is
the dataset ``segrep://<site>/<table>``, a task's COMPLETE (or FAIL) event names the copies it read and wrote,
and segrep's facets carry the real numbers (compared with the round reports in the catalog, and with the
failover assessment the library makes itself).

How: ``dag.test`` does call the provider's listener in Airflow 3.3 (the task runner calls its
``on_task_instance_running`` / ``_success`` / ``_failed`` hooks around each task, as in a worker), provided
the provider was configured when the process loaded Airflow's plugins: Airflow builds its listener manager
once per process, and the provider registers no listener while it has no transport. In this pytest worker
another test may have loaded the plugins first, so the DAGs run in a process of their own
(``tests/support/lineage_runner.py``: ``dag.test`` on request, one Airflow start-up for the module) started
with the provider configured as a deployment configures it: ``AIRFLOW__OPENLINEAGE__TRANSPORT`` set to the
client's file transport, ``AIRFLOW__OPENLINEAGE__NAMESPACE``. The events are read back from the file.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
import yaml

from segrep.catalog.apply import apply_definitions
from segrep.data.writer import write_batch
from segrep.replication.orchestrator import run_round
from tests.support.airflow import REPO, edge_rejoins, events_batch, rounds
from tests.support.rounds import no_spark

POLICY = {"schedule": "5m", "start_date": "2026-11-01", "retries": 0, "retry_delay_s": 0}
NAMESPACE = "segrep-lineage-tests"
SEGREP_ENV = ("SEGREP_CONFIG", "SEGREP_CATALOG_URL", "SEGREP_SPARK_PY_FILES", "SEGREP_SPARK_PYTHON")
SEGREP_ENV += ("SEGREP_SPARK_JOBS", "SEGREP_SPARK_CONN_ID")
RUN_TIMEOUT_S = 240


class Runner:
    """The module's DAG-running process (tests/support/lineage_runner.py) and the events file it writes."""

    def __init__(self, proc: subprocess.Popen[str], events: Path, log: Path) -> None:
        self.proc, self.events, self.log = proc, events, log

    def run(self, dag_id: str, conf: dict[str, Any] | None = None, *, ends: str = "success") -> list[dict[str, Any]]:
        """Run ``dag_id`` once with the test's SEGREP_* environment; the run must end in state ``ends``. The
        events its tasks sent, in order (a DAG run's own events are sent in the background, so they may come
        later: the run's state is the runner's answer)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        offset = self.events.stat().st_size if self.events.exists() else 0
        request = {"env": {k: os.environ.get(k) for k in SEGREP_ENV}, "dag_id": dag_id, "conf": conf}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], RUN_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        assert line, f"the lineage runner gave no answer:\n{self.log.read_text()[-4000:]}"
        answer = json.loads(line)
        assert answer.get("state") == ends, f"{answer}\n{self.log.read_text()[-4000:]}"
        with self.events.open() as f:
            f.seek(offset)
            return [json.loads(event) for event in f.read().splitlines()]


@pytest.fixture(scope="module")
def lineage_runner(airflow_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runner]:
    where = tmp_path_factory.mktemp("lineage")
    events, log = where / "openlineage.jsonl", where / "runner.log"
    env = {
        **os.environ,
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events), "append": True}),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": NAMESPACE,
    }
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.lineage_runner"],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
    try:
        yield Runner(proc, events, log)
    finally:
        stdin: IO[str] | None = proc.stdin
        if stdin is not None:
            stdin.close()  # the runner ends at the end of its input
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _complete(sent: list[dict[str, Any]], dag_id: str, task_id: str, ends: str = "COMPLETE") -> dict[str, Any]:
    """The task's COMPLETE (or ``ends``) event: the one that carries its datasets and facets."""
    found = [e for e in sent if e["job"]["name"] == f"{dag_id}.{task_id}" and e["eventType"] == ends]
    assert len(found) == 1, [(e["job"]["name"], e["eventType"]) for e in sent]
    assert found[0]["job"]["namespace"] == NAMESPACE
    return found[0]


def _names(datasets: list[dict[str, Any]]) -> list[str]:
    return [f"{d['namespace']}/{d['name']}" for d in datasets]


def _copies(event: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per output copy (``segrep://<site>/<table>``): its segrepCopy facet."""
    return {f"{d['namespace']}/{d['name']}": d["outputFacets"]["segrepCopy"] for d in event["outputs"]}


V1_SCHEMA = (1, [("tenant", "string", 1), ("seq", "int64", 2), ("payload", "string", 3), ("at", "timestamp", 4)])
# payload renamed to body (its field id kept), note added with a default (the next id)
V2_SCHEMA = (
    2,
    [
        ("tenant", "string", 1),
        ("seq", "int64", 2),
        ("body", "string", 3),
        ("at", "timestamp", 4),
        ("note", "string", 5),
    ],
)


def events_at_version_2(env: Any) -> None:
    """`events` moves to V2_SCHEMA through the definitions file and apply, as an operator changes it."""
    doc = yaml.safe_load(env.config.read_text())
    doc["tables"]["events"]["columns"] = {
        "tenant": "string",
        "seq": "int64",
        "body": {"type": "string", "renamed_from": "payload"},
        "at": "timestamp",
        "note": {"type": "string", "default": "-"},
    }
    env.config.write_text(yaml.safe_dump(doc, sort_keys=False))
    apply_definitions(env.catalog, env.defs)


def _schemas(datasets: list[dict[str, Any]]) -> list[tuple[int, list[tuple[str, str, int]]]]:
    """Each dataset's schema facets: (version, [(name, type, field id)])."""
    out = []
    for d in datasets:
        ids = d["facets"]["segrepSchema"]["fieldIds"]
        fields = [(f["name"], f["type"], ids[f["name"]]) for f in d["facets"]["schema"]["fields"]]
        out.append((d["facets"]["segrepSchema"]["version"], fields))
    return out


@pytest.mark.parametrize("path", ["one_task", "mapped"])
def test_a_round_names_the_leader_copy_and_each_replica_with_what_it_got(
    segrep_env: Any, lineage_runner: Runner, path: str
) -> None:
    """A small round reports in its `round` task, a big one (the mapped path) in `report`: either way one
    COMPLETE event reads primary's copy and writes dr's and edge's, with the bytes, segments and safe time of
    the round report the catalog keeps."""
    env = segrep_env({**POLICY, "one_task_round_max_bytes": 0} if path == "mapped" else POLICY)
    write_batch(env.catalog, "events", events_batch(list(range(60)), "a"))

    sent = lineage_runner.run("segrep_replicate_events")

    event = _complete(sent, "segrep_replicate_events", "round" if path == "one_task" else "report")
    last = rounds(env)[-1]
    report = last.report
    assert _names(event["inputs"]) == ["segrep://primary/events"]
    assert _names(event["outputs"]) == ["segrep://dr/events", "segrep://edge/events"]
    for site in ("dr", "edge"):
        copy = _copies(event)[f"segrep://{site}/events"]
        target = report["targets"][site]
        assert target["bytes_copied"] > 0 and target["segments_copied"] > 0
        assert copy["bytesCopied"] == target["bytes_copied"]
        assert copy["segmentsCopied"] == target["segments_copied"]
        assert copy["bytesFrom"] == {"primary": target["bytes_copied"]}
        assert copy["safeTimeUs"] == report["safe_time_us"][site]
        assert copy["status"] == "ok" and copy["roundIds"] == [last.round_id]
        stats = next(d for d in event["outputs"] if d["namespace"] == f"segrep://{site}")["outputFacets"]
        assert stats["outputStatistics"] == {
            **stats["outputStatistics"],
            "size": target["bytes_copied"],
            "fileCount": target["segments_copied"],
        }
    columns = [("tenant", "string"), ("seq", "int64"), ("payload", "string"), ("at", "timestamp")]
    for copy in [*event["inputs"], *event["outputs"]]:  # every copy with the table's current schema
        assert [(f["name"], f["type"]) for f in copy["facets"]["schema"]["fields"]] == columns
        assert copy["facets"]["segrepSchema"]["version"] == 1
        assert copy["facets"]["segrepSchema"]["fieldIds"] == {"tenant": 1, "seq": 2, "payload": 3, "at": 4}
    (facet_round,) = event["run"]["facets"]["segrepRounds"]["rounds"]
    assert facet_round["roundId"] == last.round_id and facet_round["status"] == "ok"
    assert event["run"]["facets"]["parent"]["job"]["name"] == "segrep_replicate_events"  # under the DAG run
    if path == "mapped":  # the copying tasks themselves name no segrep dataset: one record per round
        ff = [e for e in sent if ".fast_forward_" in e["job"]["name"] and e["eventType"] == "COMPLETE"]
        assert len(ff) == 2 and all(e["outputs"] == [] for e in ff)


def test_a_failed_round_still_names_the_copy_it_made(segrep_env: Any, lineage_runner: Runner) -> None:
    """edge is down (its site's directory is gone): the round copies to dr, then fails on edge. Its FAIL event
    names both copies: dr's with what it got, edge's with status down and nothing copied."""
    import shutil

    env = segrep_env(POLICY)
    write_batch(env.catalog, "events", events_batch(list(range(60)), "a"))
    shutil.rmtree(env.site_dir("edge"))

    sent = lineage_runner.run("segrep_replicate_events", ends="failed")

    event = _complete(sent, "segrep_replicate_events", "round", ends="FAIL")
    report = rounds(env)[-1].report
    copies = _copies(event)
    assert _names(event["inputs"]) == ["segrep://primary/events"] and sorted(copies) == [
        "segrep://dr/events",
        "segrep://edge/events",
    ]
    dr, edge = copies["segrep://dr/events"], copies["segrep://edge/events"]
    assert dr["status"] == "ok" and dr["bytesCopied"] == report["targets"]["dr"]["bytes_copied"] > 0
    assert edge["status"] == "down" and edge["bytesCopied"] == edge["segmentsCopied"] == 0
    assert event["run"]["facets"]["segrepRounds"]["rounds"][0]["status"] == "failed"


def test_failover_carries_its_loss_and_moves_the_source_of_the_replicas(
    segrep_env: Any, lineage_runner: Runner
) -> None:
    """One failover run to dr: its `assess` (always a dry run) carries what the move gives up, as the library
    assesses it (independently, here, before the run); `failover` reads primary's copy and writes dr's, the new
    leader's, with the same loss; its verifying round then copies from dr to the other sites. The table changed
    its schema (version 2) after the first round: every copy of both steps carries version 2's columns."""
    from segrep.failover.promote import failover

    env = segrep_env(POLICY)
    write_batch(env.catalog, "events", events_batch(list(range(0, 40)), "a"))
    run_round(env.catalog, env.defs, "events", submit=no_spark)
    events_at_version_2(env)
    write_batch(env.catalog, "events", events_batch(list(range(30, 50)), "lost"))  # at primary only
    (move,) = failover(env.catalog, env.defs, ["events"], to="dr", dry_run=True).moves
    expected = move.assessment
    assert expected.rows_lost == 20 and expected.segments_lost > 0 and move.partitions_moved > 0

    sent = lineage_runner.run("segrep_failover", {"tables": ["events"], "site": "dr", "dry_run": False})

    assess = _complete(sent, "segrep_failover", "assess")
    facet = assess["run"]["facets"]["segrepFailover"]
    assert facet["dryRun"] is True and facet["kind"] == "failover" and facet["toSite"] == "dr"
    loss = (expected.segments_lost, expected.rows_lost, expected.bytes_lost)
    assert (facet["lostSegments"], facet["lostRows"], facet["lostBytes"]) == loss
    (table,) = facet["tables"]
    assert (table["table"], table["fromSite"], table["toSite"]) == ("events", "primary", "dr")
    assert (table["lostSegments"], table["lostRows"], table["lostBytes"]) == loss
    assert table["partitionsMoved"] == move.partitions_moved and "failoverId" not in table  # assessed only
    assert _names(assess["inputs"]) == ["segrep://primary/events"] and assess["outputs"] == []
    assert _schemas(assess["inputs"]) == [V2_SCHEMA]

    moved = _complete(sent, "segrep_failover", "failover")
    assert _names(moved["inputs"]) == ["segrep://primary/events"]
    assert _names(moved["outputs"]) == ["segrep://dr/events"]
    assert _schemas([*moved["inputs"], *moved["outputs"]]) == [V2_SCHEMA, V2_SCHEMA]
    facet = moved["run"]["facets"]["segrepFailover"]
    assert facet["dryRun"] is False and (facet["lostSegments"], facet["lostRows"], facet["lostBytes"]) == loss
    assert facet["tables"][0]["partitionsMoved"] == move.partitions_moved and facet["tables"][0]["failoverId"]
    verify = _complete(sent, "segrep_failover", "verify")
    assert _names(verify["inputs"]) == ["segrep://dr/events"]  # the new leader's copy feeds the replicas now
    assert _names(verify["outputs"]) == ["segrep://edge/events", "segrep://primary/events"]


def test_bootstrap_names_the_joining_copy_and_what_its_catch_up_copied(segrep_env: Any, lineage_runner: Runner) -> None:
    """edge joins a table holding data: `bootstrap` writes edge's copy (its decisions as a facet), and `catch_up`
    carries what its rounds copied there, summed over them, as the catalog's round reports have it."""
    env = segrep_env(POLICY)
    edge_rejoins(env)

    sent = lineage_runner.run("segrep_bootstrap", {"table": "events", "site": "edge", "mode": "auto"})

    joined = _complete(sent, "segrep_bootstrap", "bootstrap")
    assert _names(joined["inputs"]) == ["segrep://primary/events"]
    assert _names(joined["outputs"]) == ["segrep://edge/events"]
    facet = joined["run"]["facets"]["segrepBootstrap"]
    assert (facet["table"], facet["site"], facet["mode"]) == ("events", "edge", "auto") and facet["joiningPlacements"]
    assert all(d["facets"]["segrepSchema"]["version"] == 1 for d in [*joined["inputs"], *joined["outputs"]])
    assert [f["name"] for f in joined["outputs"][0]["facets"]["schema"]["fields"]] == ["tenant", "seq", "payload", "at"]
    caught_up = _complete(sent, "segrep_bootstrap", "catch_up")
    copy = _copies(caught_up)["segrep://edge/events"]
    by_id = {r.round_id: r.report for r in rounds(env)}
    copied = [by_id[i]["targets"]["edge"] for i in copy["roundIds"]]
    assert copy["bytesCopied"] == sum(t["bytes_copied"] for t in copied) > 0
    assert copy["segmentsCopied"] == sum(t["segments_copied"] for t in copied)
    assert copy["safeTimeUs"] == by_id[copy["roundIds"][-1]]["safe_time_us"]["edge"]


def test_split_copy_pass_names_the_copy_it_read_and_the_children_it_wrote(
    segrep_env: Any, lineage_runner: Runner
) -> None:
    """A split of partition 5 at "a1" (its rewrite small enough to run in the task): `copy_commit` reads
    primary's copy (the parent's leader) and writes primary's (the children's leaders), with the pass as a
    facet: one rewrite per parent segment and child, every item committed, the bytes read per site."""
    from sqlalchemy import select

    from segrep.catalog import models as m

    env = segrep_env({**POLICY, "merge_engine": "auto"})
    for keys, tag in ((range(0, 60), "a"), (range(30, 90), "b")):
        write_batch(env.catalog, "events", events_batch(list(keys), tag))
    run_round(env.catalog, env.defs, "events", submit=no_spark)
    with env.catalog.read() as s:
        leader = s.scalar(select(m.Partition.leader_placement_id).where(m.Partition.partition_id == 5))
        parent = s.scalars(select(m.Segment.byte_size).where(m.Segment.placement_id == leader)).all()

    sent = lineage_runner.run("segrep_split_events", {"partition": 5, "split_keys": ["a1"]})

    copy = _complete(sent, "segrep_split_events", "copy_commit")
    assert _names(copy["inputs"]) == ["segrep://primary/events"]
    assert _names(copy["outputs"]) == ["segrep://primary/events"]
    facet = copy["run"]["facets"]["segrepSplit"]
    assert (facet["table"], facet["phase"]) == ("events", "copy") and facet["splitId"] > 0
    assert facet["rewrites"] == 2 * len(parent) and facet["itemsCommitted"] == facet["rewrites"] + facet["merges"]
    assert facet["bytesRead"] == {"primary": 2 * sum(parent)}
    assert _schemas([*copy["inputs"], *copy["outputs"]]) == [V1_SCHEMA, V1_SCHEMA]
    unload = _complete(sent, "segrep_split_events", "unload_commit")
    assert unload["outputs"] == [] and "segrepSplit" not in unload["run"]["facets"]  # nothing left to unload


def test_rounds_of_two_tables_in_one_task_are_both_recorded() -> None:
    """A failover's `verify` records one round per table, one call each: the task's record keeps both tables'
    copies and both rounds (``merged``), as the listener then sends them."""
    from segrep.core.schema_versions import Column, SchemaVersion
    from segrep.replication.reports import RoundReport, RoundStatus, TargetReport
    from segrep.spark.results import CommitSummary
    from segrep_airflow.lineage_facets import merged, rounds_lineage

    def report(round_id: int, table: str, copied: int) -> RoundReport:
        target = TargetReport("edge", segments_copied=1, bytes_copied=copied, bytes_from={"dr": copied})
        return RoundReport(
            round_id, table, 1_000, RoundStatus.OK, [], {"edge": target}, CommitSummary(), {"edge": 999}, 0
        )

    v2 = SchemaVersion(2, (Column(1, "k", "int64"), Column(3, "renamed", "string")))
    both = merged(
        rounds_lineage([report(1, "orders", 10)], {"orders": ["dr"]}),
        rounds_lineage([report(2, "events", 20)], {"events": ["dr"]}, {"events": v2}),
    )

    assert [(d.namespace, d.name) for d in both.inputs] == [("segrep://dr", "orders"), ("segrep://dr", "events")]
    copied = {d.name: d.outputFacets["segrepCopy"].bytesCopied for d in both.outputs}
    assert copied == {"orders": 10, "events": 20}
    assert [r["roundId"] for r in both.run_facets["segrepRounds"].rounds] == [1, 2]
    facets = {(d.namespace, d.name): d.facets for d in [*both.inputs, *both.outputs]}
    assert facets[("segrep://dr", "orders")] == {} and facets[("segrep://edge", "orders")] == {}  # none given
    for where in (("segrep://dr", "events"), ("segrep://edge", "events")):
        assert [(f.name, f.type) for f in facets[where]["schema"].fields] == [("k", "int64"), ("renamed", "string")]
        assert (facets[where]["segrepSchema"].version, facets[where]["segrepSchema"].fieldIds) == (
            2,
            {"k": 1, "renamed": 3},
        )
