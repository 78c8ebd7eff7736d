"""The failover's cut (``--at safe-time``) under the links' budget (issue 36, DESIGN 17): its fold runs inside a
failback's link pacing with the definitions' links, so an input read across a link with limits goes at a
failback's share of it; the fold's inputs are the new leader's own chain, so none crosses a link and no slot
is left behind."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from segrep.catalog import link_slots as lk
from segrep.catalog.link_lease import LinkPacing
from segrep.core import hlc
from segrep.core.links import CopyPriority
from segrep.failover.promote import Cut, failover
from segrep.replication.orchestrator import run_round
from segrep.spark.link_pacing import crossing, paced_merge
from segrep.spark.manifest import Manifest
from tests.support.checks import triples
from tests.support.env import ORDERS_YAML, make_env, sqlite_url
from tests.support.failback import rows_past_a_cut
from tests.support.models import Model
from tests.support.rounds import no_spark
from tests.support.tables import TABLE

LINKED_YAML = ORDERS_YAML + "links:\n  - between: [primary, dr]\n    max_bytes_per_second: 50MB\n"


def test_the_cut_folds_under_a_failbacks_link_pacing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_env(tmp_path, sqlite_url(tmp_path), LINKED_YAML)
    model = Model()
    kept, cut_us = rows_past_a_cut(env, model)  # keys 20-39 rewritten after the cut (at dr too, later)
    run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    folds: list[tuple[CopyPriority, Counter[tuple[str, str]]]] = []

    @contextmanager
    def spying(path: str, pacing: LinkPacing) -> Iterator[Manifest]:
        with paced_merge(path, pacing) as manifest:
            folds.append((pacing.what, crossing(manifest)))
            assert pacing.limited("primary", "dr") and pacing.limited("dr", "primary")  # the definitions' link
            yield manifest

    monkeypatch.setattr("segrep.failover.cut.paced_merge", spying)
    report = failover(env.catalog, env.defs, [TABLE, "orders"], to="dr", cut=Cut.SAFE_TIME, submit=no_spark)
    assert report.cut_us == cut_us
    assert {c.table: c.partitions_cut for c in report.cuts} == {TABLE: 2, "orders": 0}
    assert folds == [(CopyPriority.FAILBACK, Counter())]  # one fold, at dr, of dr's own chain: nothing crosses
    assert triples(env.catalog) == kept
    with env.catalog.read() as s:
        assert lk.slots(s, hlc.now_us()) == []
    env.catalog.dispose()
