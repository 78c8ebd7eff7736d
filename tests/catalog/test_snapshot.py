"""The replication snapshot: a read of chosen partitions leaves out the table-wide site sets, and says so."""

from __future__ import annotations

import pytest

from segrep.catalog.snapshot import snapshot
from segrep.data.writer import write_batch
from tests.support.env import Env
from tests.support.tables import TABLE, batch


def test_a_snapshot_of_chosen_partitions_refuses_table_wide_questions(env: Env) -> None:
    """Each fast-forward offer reads its own partition without the table-wide query of which sites replicate
    the table; asking that of such a snapshot raises instead of answering with empty sets."""
    write_batch(env.catalog, TABLE, batch(range(10), "a"))
    with env.catalog.read() as s:
        whole = snapshot(s, TABLE)
        pid = whole.partitions[0].partition.partition_id
        chosen = snapshot(s, TABLE, [pid])
    assert {whole.sites[i].name for i in whole.replica_site_ids} == {"dr", "edge"}
    assert whole.joining_site_ids == frozenset() and whole.stalled_site_ids == frozenset()
    assert [p.partition.partition_id for p in chosen.partitions] == [pid]
    assert chosen.replica_sites is None
    for question in ("replica_site_ids", "joining_site_ids", "stalled_site_ids"):
        with pytest.raises(RuntimeError, match="chosen partitions"):
            getattr(chosen, question)
