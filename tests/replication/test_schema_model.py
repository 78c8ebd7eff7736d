"""Model-based test of schema evolution (issue 35 item 6, DESIGN 16) interleaved with everything that moves rows.

A hypothesis state machine on a two-partition table replicated primary -> dr, edge (``on_return: merge``)
interleaves:
- writes (upserts and deletes of a few of ten keys) at the leaders, with the current schema or, as a writer not
  yet redeployed, with the columns of an older version;
- schema changes through ``apply`` of the definitions: add a column (nullable or with a default), widen
  (int32 -> int64, float32 -> float64), rename, soft drop, reorder, one to three steps per change;
- changes that must be refused (narrowing, a type family change, a key column renamed, retyped or dropped, a
  dropped or renamed column's name reused, a default changed), and a batch of a column set no version had:
  each leaves every catalog row and every file as it was;
- rounds; failovers to another site (the old leader's unreplicated writes are forks the rounds merge, often
  written at another schema version than the new leader's); compactions (in process, every third on Spark);
- a split of the first partition (sync or async) started at one step and advanced one pass at others.

The oracle applies the same changes to plain rows: each write keeps its values by field id; a row reads at the
current schema as its own value for each current field id, else that column's default (or null). After every
step: the catalog's current schema is the oracle's (field ids, names, types, in order); committed files match
their sha256; acks are prefixes of the offer order; every row any site serves is the current projection of some
write of that key (no value under a wrong name, no default where a value was written). At the end (split
finished, rounds until idle): the leaders and every replica hold exactly the projection of the last-writer-wins
replay of every write, and ``verify`` finds every replica equal to its leader.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.apply import apply_definitions
from segrep.catalog.schemas import current_schema
from segrep.core.errors import ConfigError, NotFoundError, RefusedError, SchemaMismatchError
from segrep.core.states import SplitState
from segrep.data.reader import read_table
from segrep.data.writer import WriteResult, write_batch
from segrep.failover.promote import failover
from segrep.maintenance.compaction import compact
from segrep.maintenance.verify import verify
from segrep.replication.orchestrator import run_round
from segrep.replication.unload import finish_unloaded
from segrep.split.workflow import start_split
from tests.support.badinput import unchanged
from tests.support.checks import assert_acks_are_prefixes, assert_files_match_catalog, partitions
from tests.support.env import make_env
from tests.support.machines import run_machine, run_split_pass
from tests.support.spark import merge_engine, spark_submit_in

pytestmark = pytest.mark.spark

TABLE = "kv"
SITES = ("primary", "dr", "edge")
SITE_IDS = {"primary": 1, "dr": 2, "edge": 3}
KEYS = range(10)
ARROW = {
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "string": pa.string(),
}
WIDER = {"int32": "int64", "float32": "float64"}
CHANGES = ("add", "add", "widen", "rename", "drop", "reorder")
REFUSALS = ("narrow", "family", "rename key", "retype key", "drop key", "reuse name", "new default", "unknown columns")


@dataclass(frozen=True)
class Col:
    """One column of the oracle's schema: its field id never changes; ``default`` is what rows written before it
    existed (and writers that lack it) read as."""

    field_id: int
    name: str
    type: str
    default: Any = None

    def spec(self, renamed_from: str | None = None) -> str:
        """The column's line in the definitions."""
        extra = f", renamed_from: {renamed_from}" if renamed_from else ""
        if self.default is not None:
            value = f"'{self.default}'" if isinstance(self.default, str) else self.default
            extra += f", default: {value}"
        return f"      {self.name}: {{type: {self.type}{extra}}}\n"


@dataclass(frozen=True)
class Written:
    """One key of one write as the writer reported it, with its values by field id (a delete has none)."""

    key: int
    version: int
    origin: int
    deleted: bool
    values: dict[int, Any]


START = (Col(1, "k", "int64"), Col(2, "v", "string"), Col(3, "n", "int32"), Col(4, "f", "float32"))


def definitions(columns: tuple[Col, ...], renamed: dict[int, str] | None = None) -> str:
    """The definitions file of the table with ``columns`` (``renamed``: field id -> the name it had before)."""
    renamed = renamed or {}
    body = "".join(c.spec(renamed.get(c.field_id)) for c in columns)
    return (
        "data_dir: data\nsites:\n"
        + "".join(f"  {s}: {{id: {i}, uri: sites/{s}}}\n" for s, i in SITE_IDS.items())
        + f"tables:\n  {TABLE}:\n    columns:\n{body}    primary_key: [k]\n    split_points: [5]\n"
        "    leader: primary\n    replicas: [dr, edge]\n"
        "    policy: {retry_delay_s: 0, on_return: merge, compact_min_segments: 3}\n"
    )


def value_of(type_: str, counter: int, key: int, field_id: int) -> Any:
    """A value that every type it may widen to holds exactly (floats in quarters)."""
    if type_.startswith("int"):
        return counter * 1000 + key * 10 + field_id % 10
    if type_.startswith("float"):
        return key + counter * 0.25 + field_id * 0.5
    return f"w{counter}k{key}f{field_id}"


class SchemaMachine(RuleBasedStateMachine):
    spark: ClassVar[Any] = None
    stats: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="segrep-schema-model-"))
        self.columns: tuple[Col, ...] = START
        self.history: list[tuple[Col, ...]] = [START]
        self.names_used = {c.name for c in START}
        self.next_field_id = 5
        self.env = make_env(self.tmp, f"sqlite:///{self.tmp}/catalog.db", definitions(START))
        self.pids = partitions(self.env.catalog, TABLE)
        self.submit = spark_submit_in(self.spark)
        self.writes: list[Written] = []
        self.split_id: int | None = None
        self.counter = 0
        self.log: list[str] = []

    # -- the oracle ----------------------------------------------------------------------------------------------

    def project(self, w: Written) -> dict[str, Any]:
        """The row a write reads as at the current schema."""
        return {c.name: w.key if c.field_id == 1 else w.values.get(c.field_id, c.default) for c in self.columns}

    def replay(self) -> list[dict[str, Any]]:
        """Last writer wins over every write, projected to the current schema, by key."""
        winners: dict[int, Written] = {}
        for w in self.writes:
            old = winners.get(w.key)
            if old is None or (w.version, w.origin) > (old.version, old.origin):
                winners[w.key] = w
        return [self.project(w) for _k, w in sorted(winners.items()) if not w.deleted]

    # -- rules -----------------------------------------------------------------------------------------------------

    @initialize(keys=st.lists(st.sampled_from(KEYS), min_size=3, max_size=10, unique=True), data=st.data())
    def some_data(self, keys: list[int], data: st.DataObject) -> None:
        """Every example starts with rows at version 1, replicated, and a first change."""
        self.write(keys, False, 0)
        self.replication_round()
        self.schema_change(data.draw(st.lists(st.sampled_from(CHANGES), min_size=1, max_size=3)), data)

    @rule(
        batches=st.lists(
            st.tuples(
                st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True),
                st.sampled_from([False, False, True]),
                st.sampled_from([0, 0, 1, 2]),
            ),
            min_size=1,
            max_size=3,
        )
    )
    def writes(self, batches: list[tuple[list[int], bool, int]]) -> None:
        for keys, deleting, older in batches:
            self.write(keys, deleting, older)

    def write(self, keys: list[int], deleting: bool, older: int) -> None:
        """Upsert or delete ``keys``; with ``older`` > 0 the writer sends the columns of that many versions ago
        (as far back as the table goes)."""
        self.counter += 1
        cols = self.history[max(0, len(self.history) - 1 - older)]
        batch = pa.table(
            {
                c.name: pa.array(
                    [k if c.field_id == 1 else value_of(c.type, self.counter, k, c.field_id) for k in keys],
                    ARROW[c.type],
                )
                for c in cols
            }
        )
        result = write_batch(self.env.catalog, TABLE, batch.select(["k"]) if deleting else batch, delete=deleting)
        current = {c.field_id for c in self.columns}
        for k in keys:
            values = (
                {}
                if deleting
                else {
                    c.field_id: value_of(c.type, self.counter, k, c.field_id)
                    for c in cols
                    if c.field_id != 1 and c.field_id in current  # a dropped column's values are discarded
                }
            )
            self.record(k, deleting, values, result)
        self.stats["writes at an older version" if cols is not self.columns and not deleting else "writes"] += 1
        self.log.append(f"write {keys} delete={deleting} at v{self.history.index(cols) + 1} of {len(self.history)}")

    def record(self, key: int, deleting: bool, values: dict[int, Any], result: WriteResult) -> None:
        seg = {s.partition_id: s for s in result.segments}[self.pid_of(key)]
        self.writes.append(Written(key, seg.version, SITE_IDS[seg.site], deleting, values))

    def pid_of(self, key: int) -> int:
        with self.env.catalog.read() as s:
            parts = q.serving_partitions(s, q.table_info(s, TABLE))
        return next(p.partition_id for p in reversed(parts) if p.begin_key is None or p.begin_key <= key)

    @rule(steps=st.lists(st.sampled_from(CHANGES), min_size=1, max_size=3), data=st.data())
    def schema_change(self, steps: list[str], data: st.DataObject) -> None:
        """``apply`` of definitions that change the schema; the catalog must take exactly the oracle's new
        version (checked after every step by ``catalog_schema_is_the_oracles``)."""
        columns = list(self.columns)
        renamed: dict[int, str] = {}
        done: list[str] = []
        first_new = self.next_field_id
        for step in steps:
            others = [i for i, c in enumerate(columns) if c.field_id != 1]
            if step == "add":
                type_ = data.draw(st.sampled_from(["int32", "string", "float32"]))
                default = data.draw(st.sampled_from([None, value_of(type_, 0, 7, 0)]))
                name = self.fresh_name("c")
                columns.append(Col(self.next_field_id, name, type_, default))
                self.next_field_id += 1
            elif step == "widen":
                can = [i for i in others if columns[i].type in WIDER]
                if not can:
                    continue
                i = data.draw(st.sampled_from(can))
                columns[i] = replace(columns[i], type=WIDER[columns[i].type])
            elif step == "rename":
                i = data.draw(st.sampled_from(others))
                if columns[i].field_id in renamed or columns[i].field_id >= first_new:
                    continue  # (a column added by this change is simply added under its new name)
                renamed[columns[i].field_id] = columns[i].name
                columns[i] = replace(columns[i], name=self.fresh_name("r"))
            elif step == "drop":
                if len(others) < 2:
                    continue
                i = data.draw(st.sampled_from(others))
                if columns[i].field_id in renamed or columns[i].field_id >= first_new:
                    continue  # (a column added by this change is simply not added)
                del columns[i]
            else:  # reorder: the value columns reversed
                columns = [columns[0], *reversed(columns[1:])]
            done.append(step)
        if tuple(columns) == self.columns:
            return
        # the catalog numbers a change's new columns in the order the definitions list them
        new_ids = iter(range(first_new, self.next_field_id))
        columns = [replace(c, field_id=next(new_ids)) if c.field_id >= first_new else c for c in columns]
        self.env.config.write_text(definitions(tuple(columns), renamed))
        changes = apply_definitions(self.env.catalog, self.env.defs)
        assert any(f"schema v{len(self.history)} -> v{len(self.history) + 1}" in c.what for c in changes), changes
        self.columns = tuple(columns)
        self.history.append(self.columns)
        for step in done:
            self.stats[f"change: {step}"] += 1
        self.log.append(f"schema v{len(self.history)}: {done} -> {[(c.field_id, c.name, c.type) for c in columns]}")

    def fresh_name(self, prefix: str) -> str:
        name = f"{prefix}{len(self.names_used)}"
        self.names_used.add(name)
        return name

    @precondition(lambda self: bool(self.writes))  # a table without segments may simply be created again
    @rule(kind=st.sampled_from(REFUSALS))
    def refused_change(self, kind: str) -> None:
        """A change `apply` must refuse (or a batch no version had): nothing in the catalog or on any site
        changes."""
        if kind == "unknown columns":
            self.unknown_columns()
            return
        columns = list(self.columns)
        renamed: dict[int, str] = {}
        values = [i for i, c in enumerate(columns) if c.field_id != 1]
        if kind == "narrow":
            wide = [i for i in values if columns[i].type in ("int64", "float64")]
            i = wide[0] if wide else 0  # the key column is int64 at least
            columns[i] = replace(columns[i], type={"int64": "int32", "float64": "float32"}[columns[i].type])
        elif kind == "family":
            i = values[0]
            columns[i] = replace(columns[i], type="string" if columns[i].type != "string" else "int64")
        elif kind == "rename key":
            renamed[1] = "k"
            columns[0] = replace(columns[0], name="key")
        elif kind == "retype key":
            columns[0] = replace(columns[0], type="string")
        elif kind == "drop key":
            del columns[0]
        elif kind == "reuse name":
            gone = sorted(self.names_used - {c.name for c in columns} - {"k"})
            if not gone:
                return
            columns.append(Col(0, gone[0], "string"))
        else:  # new default on an existing column
            i = values[0]
            columns[i] = replace(
                columns[i], default=value_of(columns[i].type, 0, 3, 1) if columns[i].default is None else None
            )
            if columns[i].default is None:
                return  # removing a default is accepted (the definitions may omit it)
        self.env.config.write_text(definitions(tuple(columns), renamed))
        try:
            before = self.env.config.read_text()
            with unchanged(self.env), pytest.raises((RefusedError, ConfigError)) as refused:
                apply_definitions(self.env.catalog, self.env.defs)
            assert before == self.env.config.read_text()
        finally:
            self.env.config.write_text(definitions(self.columns))
        self.stats[f"refused: {kind}"] += 1
        self.log.append(f"refused {kind}: {refused.value}")

    def unknown_columns(self) -> None:
        """A batch of a column set no version had is refused, naming the column; nothing is written."""
        batch = pa.table({"k": pa.array([1, 2], pa.int64()), "nosuch": pa.array(["x", "y"])})
        with unchanged(self.env), pytest.raises(SchemaMismatchError, match="nosuch"):
            write_batch(self.env.catalog, TABLE, batch)
        self.stats["refused: unknown columns"] += 1

    @rule()
    def replication_round(self) -> None:
        report = run_round(self.env.catalog, self.env.defs, TABLE, submit=self.submit)
        self.log.append("round: " + str(report).replace("\n", "\n  "))
        assert not report.failed, str(report)
        self.stats["rounds"] += 1
        self.stats["merges committed"] += report.merges.committed
        self.stats["segments copied"] += sum(t.segments_copied for t in report.targets.values())

    @rule(site=st.sampled_from(SITES), then_write=st.lists(st.sampled_from(KEYS), max_size=3, unique=True))
    def failover_to(self, site: str, then_write: list[int]) -> None:
        """`segrep failover` at latest: what the old leader had not replicated comes back as a fork (written at
        whatever version it was) that the rounds merge."""
        try:
            failover(self.env.catalog, self.env.defs, [TABLE], to=site)
        except (RefusedError, NotFoundError) as exc:
            self.log.append(f"failover -> {site} refused: {exc}")
            return
        self.stats["failovers"] += 1
        self.log.append(f"failover -> {site}")
        if then_write:
            self.write(then_write, False, 0)

    @rule(force=st.sampled_from([True, True, False]))
    def compaction(self, force: bool) -> None:
        self.stats["compactions"] += 1
        engine = "spark" if self.stats["compactions"] % 3 == 0 else "in_process"
        with merge_engine(engine):
            report = compact(self.env.catalog, self.env.defs, TABLE, force=force, submit=self.submit)
        self.stats["majors committed"] += report.committed
        self.log.append(f"compaction ({engine}, force={force}): {report.committed} committed")

    @precondition(lambda self: self.split_id is None)
    @rule(at=st.sampled_from([2, 3]), is_async=st.booleans())
    def split_start(self, at: int, is_async: bool) -> None:
        ref = start_split(self.env.catalog, TABLE, self.pids[0], [at], is_async=is_async)
        self.split_id = ref.split_id
        self.stats["splits"] += 1
        self.log.append(f"split {self.pids[0]} at {at} async={is_async}")

    @precondition(lambda self: self.split_id is not None)
    @rule()
    def split_pass(self) -> None:
        """One pass of the split: plan, the Spark job, commit, then SPLIT_FINALIZE or UNLOAD_FINAL when due."""
        assert self.split_id is not None
        plan = run_split_pass(self.env, self.split_id, self.submit, self.stats)
        if plan is None:
            return
        self.stats["split passes"] += 1
        self.log.append(f"split pass {plan.phase}")

    # -- invariants --------------------------------------------------------------------------------------------

    @invariant()
    def catalog_schema_is_the_oracles(self) -> None:
        with self.env.catalog.read() as s:
            version = current_schema(s, q.table_info(s, TABLE).table_id)
        got = [(c.field_id, c.name, c.type) for c in version.columns]
        assert got == [(c.field_id, c.name, c.type) for c in self.columns], self.fail(f"catalog schema {got}")
        assert version.version == len(self.history), self.fail(f"catalog at v{version.version}")

    @invariant()
    def committed_files_never_change(self) -> None:
        assert_files_match_catalog(self.env)

    @invariant()
    def acks_follow_offer_order(self) -> None:
        assert_acks_are_prefixes(self.env.catalog, TABLE)

    @invariant()
    def every_site_serves_projections_of_written_rows(self) -> None:
        names = [c.name for c in self.columns]
        for site in (None, *SITES):
            got = read_table(self.env.catalog, TABLE, site)
            assert got.column_names == names, self.fail(f"{site or 'leaders'} columns {got.column_names}")
            for c in self.columns:
                assert got.schema.field(c.name).type == ARROW[c.type], self.fail(f"{site}: {got.schema}")
            for row in got.to_pylist():
                made = [self.project(w) for w in self.writes if w.key == row["k"] and not w.deleted]
                assert row in made, self.fail(f"{site or 'leaders'} serves {row}, written were {made}")

    def fail(self, message: str) -> str:
        return "\n".join([message, *self.log])

    # -- quiescence ----------------------------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            self.quiesce()
        finally:
            self.env.catalog.dispose()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def quiesce(self) -> None:
        if self.split_id is not None:
            for _ in range(4):  # a pass can meet a root that moved (a failover): the next one re-plans
                self.split_pass()
        for _ in range(10):
            report = run_round(self.env.catalog, self.env.defs, TABLE, submit=self.submit)
            finish_unloaded(self.env.catalog, self.env.defs, TABLE)
            self.log.append("quiesce: " + str(report).replace("\n", "\n  "))
            busy = any(t.outcomes or t.status != "ok" for t in report.targets.values())
            if not busy and not report.merges.items:
                break
        else:
            pytest.fail(self.fail("no idle round"))
        if self.split_id is not None:
            with self.env.catalog.read() as s:
                assert s.get(m.Split, self.split_id).state == SplitState.DONE, self.fail("split not done")
        want = self.replay()
        for site in (None, *SITES):
            got = read_table(self.env.catalog, TABLE, site).sort_by("k").to_pylist()
            assert got == want, self.fail(f"{site or 'leaders'}: {got}\n!= {want}")
        report = verify(self.env.catalog, TABLE, record=False)
        assert report.differences == 0, self.fail(str(report))
        self.stats["examples"] += 1
        self.stats[f"examples ending at v{len(self.history)}"] += 1


def test_schema_state_machine(spark: Any) -> None:
    SchemaMachine.spark = spark
    run_machine(SchemaMachine, "SEGREP_MODEL_EXAMPLES", 12, steps=15)
