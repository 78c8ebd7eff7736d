"""The old leader's return after a failover (issue 14 item 3), under both `on_return` policies.

`primary` leads `events`, takes writes it never replicates, and goes down; `segrep failover` promotes `dr`,
which takes writes that reach `edge`. When `primary` is back:
- `rollback` (the default): its unreplicated rows go to a rollback file at `primary`, exactly those rows
  (checked against the batches written, not against the engine); its chain is rewound and it fast-forwards
  from `dr` incrementally; nothing of the lost rows reaches `dr`; `segrep rollback drop` deletes the file.
- `merge`: the lost rows are pushed to `dr` and merged (Spark), last writer wins.
"""

from __future__ import annotations

from typing import Any

import pyarrow.parquet as pq
import pytest

from segrep.replication.fast_forward import fast_forward_target
from segrep.replication.orchestrator import run_round
from segrep.replication.round import TargetUnreachable
from tests.support.badinput import unchanged
from tests.support.checks import assert_replicas_equal_leader, triples
from tests.support.cli import cli
from tests.support.env import Env
from tests.support.failback import lose_primary
from tests.support.models import Model
from tests.support.rounds import bring_up, inprocess_submit, no_spark
from tests.support.tables import TABLE

pytestmark = pytest.mark.spark


def test_the_old_leader_returns_with_its_lost_rows_in_a_rollback_file(outage_env: Env) -> None:
    env = outage_env  # no back-off after a failed attempt: the return is tried at the next round
    kept, lost, aside = lose_primary(env, Model())
    kept.upsert(env, range(100, 120), "after")  # at dr
    down = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert down.targets["primary"].status == "down" and down.targets["edge"].status == "ok"

    bring_up(env, "primary", aside)
    back = run_round(env.catalog, env.defs, TABLE, submit=no_spark)  # rollback, then fast-forward from dr
    assert back.targets["primary"].status == "ok", back.targets["primary"]
    assert back.targets["primary"].segments_copied == 2  # the `after` segments only: incremental, no bootstrap
    assert back.merges.items == 0  # nothing of the lost rows is pushed to dr
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert triples(env.catalog) == kept.snapshot()
    assert_replicas_equal_leader(env.catalog, ("primary", "edge"))

    code, out, err = cli(env, "rollback", "list", TABLE)
    assert code == 0, err
    files = [line.split() for line in out.splitlines()[1:]]
    assert len(files) == 2 and {f[2] for f in files} == {"primary"}, out  # one file per partition, at primary
    assert sum(int(f[4]) for f in files) == len(lost)
    got = set()
    for f in files:
        rows = pq.read_table(env.site_dir("primary") / f[-1]).to_pylist()
        got |= {(r["tenant"], r["seq"], r["payload"], r["_deleted"]) for r in rows}
    assert got == lost  # exactly the rows primary alone held, as written (tombstones included)

    code, out, err = cli(env, "rollback", "drop", TABLE, "--site", "primary")
    assert code == 0 and out.count("dropped ") == 2, out + err
    _code, out, _ = cli(env, "rollback", "list")
    assert out.strip() == "no rollback files"


def test_a_site_still_holding_what_a_failover_gave_up_cannot_lead_until_it_is_rolled_back(outage_env: Env) -> None:
    """Found by the failover state machine: `primary` gave up rows, stayed down, and was promoted again; its
    chain still held the given-up segments, so they were served again. Now it is refused by name until a
    round has set them aside; then it can lead, and the given-up rows stay in the rollback file only."""
    env = outage_env
    kept, lost, aside = lose_primary(env, Model())
    with unchanged(env):
        code, _out, err = cli(env, "failover", TABLE, "--to", "primary")
    assert code == 2 and "primary cannot lead" in err and "that failover #1 gave up" in err, err
    code, out, err = cli(env, "failover", TABLE)  # the automatic choice (a tie, to the lower id) passes it over
    assert code == 0 and "failover of events: dr -> edge" in out, out + err
    assert "candidate primary: holds 40 rows, lacks 0 (cannot lead: it still holds 2 segment(s)" in out, out

    bring_up(env, "primary", aside)
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)  # primary's given-up rows go to its rollback file
    code, out, err = cli(env, "failover", TABLE, "--to", "primary")
    assert code == 0, err
    for _ in range(2):
        run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert triples(env.catalog) == kept.snapshot()  # the given-up rows did not come back
    assert_replicas_equal_leader(env.catalog, ("dr", "edge"))
    code, out, err = cli(env, "rollback", "list", TABLE)
    assert code == 0 and sum(int(line.split()[4]) for line in out.splitlines()[1:] if " primary " in line) == len(
        lost
    ), out


def test_with_on_return_merge_the_lost_rows_are_merged_into_the_new_leader(merge_sqlite_env: Env, spark: Any) -> None:
    env = merge_sqlite_env
    model = Model()
    _kept, _lost, aside = lose_primary(env, model)  # `model` keeps the lost rows: they come back
    model.upsert(env, range(100, 120), "after")
    model.upsert(env, range(50, 55), "newer")  # newer than primary's lost rows for these keys
    calls: list[str] = []
    down = run_round(env.catalog, env.defs, TABLE, submit=inprocess_submit(spark, calls))
    assert down.plan is not None and down.plan.pushes.get("SITE_DOWN") == 4  # primary's pushes wait ...
    assert down.targets["edge"].status == "ok"  # ... and edge is replicated meanwhile
    bring_up(env, "primary", aside)
    reports = [run_round(env.catalog, env.defs, TABLE, submit=inprocess_submit(spark, calls)) for _ in range(4)]
    assert sum(r.merges.committed for r in reports) and not calls  # merged, in process (a small merge)
    assert triples(env.catalog) == model.snapshot()  # lost rows kept, newer writes won, deletes applied
    assert_replicas_equal_leader(env.catalog, ("primary", "edge"))
    _code, out, _ = cli(env, "rollback", "list")
    assert out.strip() == "no rollback files"


def test_a_returned_leader_not_yet_rolled_back_fails_as_a_target(outage_env: Env) -> None:
    """The fast-forward's set-up counts the segments a failover with ``on_return: rollback`` gave up that the
    target's placements still list (``catalog.snapshot.given_up_held``): back before any plan could set
    them aside (here no plan ran: an Airflow fast-forward task started after `primary` came back, its plan
    task before), `primary` fails as a target, naming them, and the next round rolls it back and serves it."""
    env = outage_env
    kept, _lost, aside = lose_primary(env, Model())
    bring_up(env, "primary", aside)
    with pytest.raises(TargetUnreachable, match=r"site primary still holds \d+ segment\(s\) a failover gave up"):
        fast_forward_target(env.catalog, env.defs, TABLE, "primary")

    back = run_round(env.catalog, env.defs, TABLE, submit=no_spark)  # rollback, then fast-forward from dr
    assert back.targets["primary"].status == "ok", back.targets["primary"]
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert triples(env.catalog) == kept.snapshot()
    assert_replicas_equal_leader(env.catalog, ("primary", "edge"))
