"""What the model-based state machines share (tests/replication/test_round_model.py,
tests/topologies/test_topology_model.py): running one under hypothesis, a round with at most one fault, and
safe time checked against the independent replay of every write."""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Collection
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from segrep.catalog import Catalog
from segrep.core import faults
from segrep.core.errors import SegrepError, SplitIncompleteError
from segrep.core.states import SplitState
from segrep.replication.orchestrator import run_round
from segrep.replication.reports import RoundReport
from segrep.replication.unload import finish
from segrep.spark.launch import Submit
from segrep.split.workflow import PassPlan, commit_pass, finalize, plan_pass
from segrep.storage.transport import Copier, local_copier
from tests.support.checks import raw_winners, safe_times
from tests.support.env import Env
from tests.support.rounds import bring_up, take_down


def run_machine(machine: Any, examples_env: str, default_examples: int, steps: int = 10) -> None:
    """Run the state machine (examples from ``$examples_env``, else the default) and print its statistics."""
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=int(os.environ.get(examples_env, str(default_examples))),
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
    print(dict(sorted(machine.stats.items())))


def check_safe_times(
    catalog: Catalog,
    table: str,
    expected: dict[int, tuple[int, int, bool, str]],
    before: dict[str, int],
    log: list[str],
    away: Collection[str] = (),
) -> dict[str, int]:
    """Invariant 4: every site's stored safe time never decreases, and every key whose last write of all (the
    replay: key -> (version, origin, deleted, value)) is at or before it resolves there to exactly that write,
    tombstones included. A merge keeps only winners, so a superseded write is nowhere as of its own time: only
    the last write of each key is checked; a site that is down (``away``) only for the first part. Returns the
    safe times, for the next check."""
    now = safe_times(catalog, table)
    for site, us in now.items():
        assert us >= before.get(site, us), (site, us, before[site])
        if site in away:  # down: nothing can be read there now
            continue
        there = raw_winners(catalog, table, site)
        for key, (version, origin, deleted, _v) in expected.items():
            if version <= us:
                assert there.get((key,)) == (version, origin, deleted), (
                    f"safe time {us} at {site} claims key {key} written at {version}, but {site} has "
                    f"{there.get((key,))}\n" + "\n".join(log)
                )
    return now


def faulted_round(
    env: Env,
    table: str,
    end: int,
    fault: str,
    site: str,
    *,
    points: Collection[str],
    stats: Counter[str],
    submit: Submit,
    copier: Copier = local_copier,
    away: Collection[str] = (),
    failure: str = "",
) -> RoundReport | None:
    """One round up to ``end`` with at most one fault: a crash at a named fault point (``points``), or ``site``
    made unreachable for the round (``down``; sites ``away`` are down already). None when the round crashed,
    or failed because a site was down (its error must match the pattern ``failure``): the caller retries the same end
    next time, as Airflow retries a failed task."""
    aside = take_down(env, site) if fault == "down" and site not in away else None
    if fault in points:
        os.environ[faults.FAULTS_ENV] = fault
    try:
        return run_round(env.catalog, env.defs, table, end, submit=submit, copier=copier)
    except faults.InjectedFault as exc:
        assert fault in points and fault in str(exc), exc
        stats[f"crash {fault}"] += 1
    except SegrepError as exc:  # a merge could not read the files of a site that is down
        assert (fault == "down" or away) and re.search(failure, str(exc)), exc
        stats["round failed, site down"] += 1
    finally:
        os.environ.pop(faults.FAULTS_ENV, None)
        if aside is not None:
            bring_up(env, site, aside)
    return None


def run_split_pass(env: Env, split_id: int, submit: Submit, stats: Counter[str]) -> PassPlan | None:
    """One pass of a split as its DAG runs it: plan, the Spark job, commit, then SPLIT_FINALIZE (refused while
    the children lack something: counted) or UNLOAD_FINAL when due. None when the split is done already."""
    plan = plan_pass(env.catalog, env.defs, split_id)
    if plan.state == SplitState.DONE:
        return None
    if plan.manifest:
        submit("merge", ["--manifest", plan.manifest, "--result", str(plan.result)], name="split")
    commit_pass(env.catalog, plan)
    if plan.state == SplitState.SPLITTING:
        try:
            finalize(env.catalog, split_id, plan.cut_entry_id)
        except SplitIncompleteError:
            stats["split finalize refused"] += 1
    else:
        done = finish(env.catalog, env.defs, split_id)
        stats[f"split {done.state}"] += 1
    return plan
