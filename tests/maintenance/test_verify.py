"""`segrep verify` (DESIGN section 13), on SQLite and PostgreSQL: rows compared with the leader's as of the
replica's safe time, files against the catalog; differences named, exit 1; equal, exit 0; bad input exit 2."""

from __future__ import annotations

import json
from collections.abc import Callable

import pyarrow as pa
import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.catalog.verifications import last_verifications
from segrep.core import hlc
from tests.support.badinput import assert_user_error, unchanged
from tests.support.cli import cli
from tests.support.damage import add_row_like, change_payload, copies_at, copy_holding, drop_row, rewrite_segment
from tests.support.env import Env
from tests.support.models import Model
from tests.support.rounds import bring_up, round_until_idle, take_down
from tests.support.tables import TABLE


def replicated(env: Env) -> Model:
    model = Model()
    model.upsert(env, range(40), "a")
    model.upsert(env, range(20, 60), "b")
    model.delete(env, range(0, 4))
    round_until_idle(env)
    return model


def verify_json(env: Env, *args: str) -> tuple[int, dict[str, object], str]:
    code, out, err = cli(env, "verify", TABLE, "--json", *args)
    return code, json.loads(out), err


def test_equal_replicas_exit_0_and_each_site_is_recorded(env: Env) -> None:
    replicated(env)
    code, out, err = cli(env, "verify", TABLE, "--files", "--max-bytes-per-second", "0")
    assert code == 0, out + err
    assert "all equal" in out and "4 of 4 replica partition(s) equal" in out
    with env.catalog.read() as s:
        states = last_verifications(s, TABLE)
        checks = s.scalars(select(m.FileCheck)).all()
        listed = s.scalars(select(m.Segment)).all()
    assert [(v.site, v.kind, v.outcome, v.differences) for v in states] == [
        ("dr", "rows+files", "equal", 0),
        ("edge", "rows+files", "equal", 0),
        ("primary", "files", "equal", 0),
    ]
    assert len(checks) == len(listed) > 0
    assert all(c.problem is None and c.last_good_us == c.checked_us for c in checks)


def test_a_replica_only_behind_its_safe_time_is_not_flagged(env: Env) -> None:
    model = replicated(env)
    model.upsert(env, range(100, 110), "late")  # written after the round: the replicas do not hold it yet
    model.delete(env, range(20, 22))
    code, doc, err = verify_json(env)
    assert code == 0, (doc, err)
    # pinned past what the replicas hold, the same replicas differ: the pin is what keeps them equal above
    code, doc, _ = verify_json(env, "--site", "dr", "--at", str(hlc.now_us()))
    assert code == 1
    missing = {tuple(k) for r in doc["rows"] for k in r["only_at_leader"]}  # type: ignore[index, union-attr]
    changed = {tuple(k) for r in doc["rows"] for k in r["only_at_replica"]}  # type: ignore[index, union-attr]
    assert missing == {(["a", "b", "x", "y"][k % 4], k) for k in range(100, 110)}
    assert changed == {("a", 20), ("b", 21)}


@pytest.mark.parametrize(
    ("change", "kind", "key"),
    [
        (change_payload(8, "tampered"), "different", ["a", 8]),
        (drop_row(8), "only_at_leader", ["a", 8]),
        (add_row_like(8, 1000), "only_at_replica", ["a", 1000]),
    ],
    ids=["one-row-changed", "one-row-short", "one-row-extra"],
)
def test_a_row_difference_at_a_replica_is_named_by_key(
    env: Env, change: Callable[[pa.Table], pa.Table], kind: str, key: list[object]
) -> None:
    replicated(env)
    target = copy_holding(env, "dr", 8)
    first = target.partition_id
    rewrite_segment(env, target, change)
    code, doc, err = verify_json(env)
    assert code == 1 and "1 difference(s)" in err
    bad = [r for r in doc["rows"] if r["verdict"] != "equal"]  # type: ignore[union-attr, index]
    assert len(bad) == 1
    assert (bad[0]["site"], bad[0]["partition_id"], bad[0]["differences"]) == ("dr", first, 1)
    assert bad[0][kind] == [key], bad[0]
    code, out, _ = cli(env, "verify", TABLE)
    assert code == 1 and f"partition {first} at dr" in out and str(key[1]) in out
    with env.catalog.read() as s:
        states = {v.site: v for v in last_verifications(s, TABLE)}
    assert (states["dr"].outcome, states["dr"].differences) == ("different", 1)
    assert (states["edge"].outcome, states["edge"].differences) == ("equal", 0)


def test_verify_files_names_every_bad_file(env: Env) -> None:
    replicated(env)
    leader, replica = copies_at(env, "primary")[0], copies_at(env, "edge")[-1]
    leader.path.write_bytes(leader.path.read_bytes()[:-10])
    replica.path.unlink()
    code, out, err = cli(env, "verify", TABLE, "--files")
    assert code == 1, out + err
    assert f"DAMAGED: {leader.path} at primary" in out and "the leader's copy" in out
    assert f"MISSING: {replica.path} at edge" in out
    with env.catalog.read() as s:
        checks = {(c.placement_id, c.segment_id): c for c in s.scalars(select(m.FileCheck))}
    assert checks[(leader.placement_id, leader.segment_id)].problem is not None
    assert checks[(leader.placement_id, leader.segment_id)].last_good_us is None
    # only the site asked for is scrubbed; its rows cannot be compared where the leader's file is damaged
    code, doc, _ = verify_json(env, "--files", "--site", "dr")
    assert code == 1 and doc["files"]["problems"] == []  # type: ignore[index]
    unreadable = [r for r in doc["rows"] if r["verdict"] != "equal"]  # type: ignore[union-attr, index]
    assert [(r["partition_id"], r["verdict"]) for r in unreadable] == [(leader.partition_id, "unreadable")]
    assert "at the leader" in unreadable[0]["detail"] and str(leader.path) in unreadable[0]["detail"]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("verify", "nosuch"), ("unknown table", "nosuch")),
        (("verify", TABLE, "--site", "mars"), ("unknown site", "mars")),
        (("verify", "orders", "--site", "edge"), ("edge", "holds no placement of orders")),
        (("verify", TABLE, "--at", "yesterday"), ("--at", "yesterday")),
        (("verify", TABLE, "--at", "-5"), ("--at",)),
        (("verify", TABLE, "--at", str(2**63)), ("--at",)),
        (("verify", TABLE, "--files", "--max-bytes-per-second", "-1"), ("--max-bytes-per-second",)),
        (("repair", "nosuch"), ("nosuch",)),
        (("repair", TABLE, "--site", "mars"), ("unknown site", "mars")),
        (("repair", "orders", "--site", "edge"), ("edge",)),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(env: Env, args: tuple[str, ...], needles: tuple[str]) -> None:
    replicated(env)
    with unchanged(env):
        code, out, err = cli(env, *args)
    assert_user_error(code, out, err, *needles)


def test_a_bad_scrub_rate_in_the_environment_is_bad_input(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    replicated(env)
    monkeypatch.setenv("SEGREP_SCRUB_BYTES_PER_S", "fast")
    with unchanged(env):
        code, out, err = cli(env, "verify", TABLE, "--files")
    assert_user_error(code, out, err, "SEGREP_SCRUB_BYTES_PER_S", "fast")


def test_a_site_that_cannot_be_reached_is_a_difference_not_bad_input(env: Env) -> None:
    replicated(env)
    aside = take_down(env, "dr")
    try:
        code, out, err = cli(env, "verify", TABLE, "--site", "dr", "--files")
    finally:
        bring_up(env, "dr", aside)
    assert code == 1, out + err
    assert "UNREADABLE" in out and "difference(s)" in err
    assert cli(env, "verify", TABLE, "--site", "dr", "--files")[0] == 0


def test_status_shows_the_last_verification_and_what_to_run(env: Env) -> None:
    replicated(env)
    replica = copies_at(env, "edge")[-1]
    replica.path.unlink()
    assert cli(env, "verify", TABLE, "--files")[0] == 1
    code, out, err = cli(env, "status", TABLE)
    assert code == 0, err
    edge = next(line for line in out.splitlines() if line.split()[:2] == [TABLE, "edge"])
    assert " diff " in edge and f"run segrep repair {TABLE} --site edge" in edge
    dr = next(line for line in out.splitlines() if line.split()[:2] == [TABLE, "dr"])
    assert " equal " in dr and "segrep repair" not in dr
    assert cli(env, "repair", TABLE)[0] == 0
    assert cli(env, "verify", TABLE, "--files")[0] == 0
    code, doc_text, _ = cli(env, "status", TABLE, "--json")
    rows = {r["target"]: r for r in json.loads(doc_text)["replication"]}
    assert rows["edge"]["last_verified"]["differences"] == 0 and "segrep repair" not in rows["edge"]["note"]
