"""What the model-based state machines share (tests/replication/test_round_model.py,
tests/topologies/test_topology_model.py): running one under hypothesis, and safe time checked against the
independent replay of every write."""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from segrep.catalog import Catalog
from tests.support.checks import raw_winners, safe_times


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
