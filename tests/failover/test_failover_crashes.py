"""A crash at each step of a failover and of a switchover, then a re-run that converges (issue 14 item 7).

The crash is a `segrep` process killed with SIGKILL where it hangs at the fault point (``NAME:hang``): no
exception handler runs, as after a real kill -9. Two tables, so that a failover can die between them.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.core import faults
from segrep.core.errors import WritesPausedError
from segrep.data.writer import write_batch
from segrep.replication.orchestrator import run_round
from tests.support.checks import leaders, triples
from tests.support.cli import cli, cli_command
from tests.support.env import Env
from tests.support.models import Model
from tests.support.rounds import no_spark
from tests.support.tables import TABLE, batch

OTHER = "orders"  # the second table of ORDERS_YAML (leader primary, replica dr)


def _killed_at(env: Env, point: str, *args: str) -> None:
    """Run ``segrep ARGS`` until it hangs at ``point``, then SIGKILL it."""
    env_vars = {**os.environ, faults.FAULTS_ENV: f"{point}:hang"}
    proc = subprocess.Popen(cli_command(env, *args), stderr=subprocess.PIPE, text=True, env=env_vars)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith(faults.HANG_MARK):
                break
        else:
            pytest.fail(f"segrep {' '.join(args)} ended without reaching {point} (exit {proc.wait()})")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)


def _sites(env: Env, table: str) -> set[str]:
    return {site for site, _ in leaders(env.catalog, table).values()}


def _moves(env: Env) -> int:
    with env.catalog.read() as s:
        return len(s.scalars(select(m.Failover)).all())


def test_a_failover_killed_before_its_commit_changed_nothing_and_a_rerun_moves(env: Env) -> None:
    Model().upsert(env, range(0, 20), "a")
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    before = leaders(env.catalog)
    _killed_at(env, "failover_before_commit", "failover", TABLE, "--to", "dr")
    assert leaders(env.catalog) == before and _moves(env) == 0
    code, _out, err = cli(env, "failover", TABLE, "--to", "dr")
    assert code == 0, err
    assert _sites(env, TABLE) == {"dr"} and _moves(env) == 1


def test_a_failover_killed_between_tables_moved_the_first_and_a_rerun_moves_the_rest(env: Env) -> None:
    Model().upsert(env, range(0, 20), "a")
    _killed_at(env, "failover_between_tables", "failover", TABLE, OTHER, "--to", "dr")
    assert _sites(env, TABLE) == {"dr"} and _sites(env, OTHER) == {"primary"}  # one transaction per table
    code, out, err = cli(env, "failover", TABLE, OTHER, "--to", "dr")
    assert code == 2 and "table events: site dr leads it already" in err, out + err  # the moved one is named
    code, _out, err = cli(env, "failover", OTHER, "--to", "dr")
    assert code == 0, err
    assert _sites(env, OTHER) == {"dr"} and _moves(env) == 2


def test_a_switchover_killed_after_its_drain_is_continued_by_a_rerun(env: Env) -> None:
    model = Model()
    model.upsert(env, range(0, 20), "a")
    _killed_at(env, "switchover_before_promote", "switchover", TABLE, "--to", "edge")
    assert _sites(env, TABLE) == {"primary"}
    with env.catalog.read() as s:  # the kill left writes paused: no handler ran
        assert None not in set(s.scalars(select(m.Partition.paused_us).join(m.Table).where(m.Table.name == TABLE)))
    with pytest.raises(WritesPausedError):
        write_batch(env.catalog, TABLE, batch([99], "during"))
    code, out, err = cli(env, "switchover", TABLE, "--to", "edge")  # continues the switchover under way
    assert code == 0, out + err
    assert _sites(env, TABLE) == {"edge"}
    model.upsert(env, range(20, 30), "b")  # writes resumed, at edge
    assert triples(env.catalog) == model.snapshot()
