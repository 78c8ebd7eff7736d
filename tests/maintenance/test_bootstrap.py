"""Bootstrap and join (DESIGN section 7: the xCluster decision tree), on SQLite and PostgreSQL, without Spark.

A site added to a table's replicas while the table holds data joins through ``segrep bootstrap``: rounds feed
it from the newest major segment while writes go on, and JOIN_FINALIZE makes its placements LIVE once it
holds the leader's newest segment. A target that already holds files of the table is refused unless the mode
says ``adopt`` (only if the files resolve to the leader's rows) or ``replace`` (moved aside under
``.replaced/``). A replica that stayed away past the retention is re-bootstrapped into a new placement. A
crash inside a bootstrap changes nothing; a crash in a round that feeds a joining site is retried.
Majors are folded in process (small merges need no Spark: ``spark.merge_runner``).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sqlalchemy import select

from segrep.catalog import models as m
from segrep.catalog.apply import apply_definitions
from segrep.core import faults, hlc
from segrep.core.errors import RefusedError, SegrepError
from segrep.data.reader import placement_files
from segrep.maintenance import bootstrap as bootstrap_mod
from segrep.maintenance.bootstrap import bootstrap
from segrep.maintenance.compaction import compact
from segrep.maintenance.gc import collect
from segrep.replication.orchestrator import run_round
from segrep.replication.status import status_rows
from segrep.storage.identity import MARKER_NAME
from segrep.storage.site import Site
from tests.support.checks import (
    assert_each_segment_once,
    assert_files_match_catalog,
    assert_safe_time_honest,
    catalog_state,
    lease_count,
    partitions,
    safe_times,
    triples,
)
from tests.support.cli import cli
from tests.support.env import ORDERS_YAML, Env, env_fixture, make_env, sqlite_url
from tests.support.maintenance import (
    all_sites_read_the_model,
    assert_lists_hold_exactly_what_chains_need,
    assert_sites_hold_exactly_the_catalog,
    catalog_relpaths,
    files_at,
)
from tests.support.models import Model
from tests.support.rounds import bring_up, no_spark, round_until_idle, take_down
from tests.support.tables import TABLE

POLICY = "    policy: {retry_delay_s: 0, compact_min_segments: 2}\n"
DR_ONLY_YAML = ORDERS_YAML.replace("    replicas: [dr, edge]\n", "    replicas: [dr]\n" + POLICY)
BOTH_YAML = ORDERS_YAML.replace("    replicas: [dr, edge]\n", "    replicas: [dr, edge]\n" + POLICY)
ALL_SITES = ("primary", "dr", "edge")


# -- helpers ----------------------------------------------------------------------------------------------------


def placements_at(env: Env, site: str, *, removed: bool = False) -> list[m.Placement]:
    """The events placements at ``site`` (active ones, or only removed ones), by partition."""
    with env.catalog.read() as s:
        cond = m.Placement.removed_us.is_not(None) if removed else m.Placement.removed_us.is_(None)
        rows = s.scalars(
            select(m.Placement)
            .join(m.Site, m.Site.site_id == m.Placement.site_id)
            .where(m.Site.name == site, m.Placement.partition_id.in_(partitions(env.catalog)), cond)
            .order_by(m.Placement.partition_id)
        ).all()
        s.expunge_all()
        return list(rows)


def catalog_rows(env: Env) -> dict[str, list[str]]:
    """Every catalog row but the round bookkeeping (files left out)."""
    return {k: v for k, v in catalog_state(env).items() if k != "files"}


def states(env: Env, site: str) -> list[tuple[str, bool]]:
    return [(pl.state, pl.needs_bootstrap) for pl in placements_at(env, site)]


def add_edge(env: Env) -> list[str]:
    env.config.write_text(BOTH_YAML)
    return [str(c) for c in apply_definitions(env.catalog, env.defs)]


def note(env: Env, site: str) -> str:
    return next(r.note() for r in status_rows(env.catalog, TABLE) if r.target == site)


def with_majors(env: Env, model: Model) -> None:
    """Writes, a round, more writes and deletes, a compaction of both partitions, a round, GC: the leader
    lists one major per partition."""
    model.upsert(env, range(60), "a")
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).status == "ok"
    model.upsert(env, range(40, 90), "b")
    model.delete(env, range(0, 10))
    assert compact(env.catalog, env.defs, TABLE, submit=no_spark).committed == 2
    round_until_idle(env)
    collect(env.catalog, env.defs, TABLE)


def digests(root: Path) -> dict[str, str]:
    """Every file under a site's root but its identity marker, with its sha256."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file() and p.name != MARKER_NAME
    }


def leader_segment_files(env: Env, pid: int) -> list[str]:
    """Relpaths of the leader's visible segments of one partition."""
    _info, pfs = placement_files(env.catalog, TABLE)
    return [seg.relpath for pf in pfs if pf.partition_id == pid for seg in pf.segments]


def plant_copies(env: Env, pid: int, site: str = "edge") -> list[str]:
    """Copy the leader's visible files of a partition to ``site`` (data equal to the source)."""
    rels = leader_segment_files(env, pid)
    for rel in rels:
        target = env.site_dir(site) / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(env.site_dir("primary") / rel, target)
    return rels


def plant_relaid(env: Env, pid: int, site: str = "edge", *, drop_last_row: bool = False) -> str:
    """One file with every raw row of the leader's visible segments (so resolving to the same rows), under a
    new name; with ``drop_last_row`` one row is missing (different data)."""
    rels = leader_segment_files(env, pid)
    rows = pa.concat_tables(
        [Site("primary", str(env.site_dir("primary"))).read_segment(r).replace_schema_metadata(None) for r in rels]
    )
    rows = rows.sort_by([("tenant", "ascending"), ("seq", "ascending"), ("_version", "ascending")])
    if drop_last_row:
        rows = rows.slice(0, rows.num_rows - 1)
    rel = f"{TABLE}/{pid}/{'ee' * 16}.parquet"
    Site(site, str(env.site_dir(site))).write_segment(rel, rows, {"planted": True})
    return rel


def out_of_retention(env: Env, model: Model) -> None:
    """dr is down while the leader writes and compacts; GC far in the future marks dr as needing a bootstrap."""
    model.upsert(env, range(40), "a")
    round_until_idle(env)
    aside = take_down(env, "dr")
    model.upsert(env, range(30, 70), "b")
    model.delete(env, range(0, 5))
    assert compact(env.catalog, env.defs, TABLE, submit=no_spark).committed == 2
    assert run_round(env.catalog, env.defs, TABLE, submit=no_spark).failed == ["dr"]
    retention_us = env.defs.table(TABLE).policy.max_retention_s * 1_000_000
    report = collect(env.catalog, env.defs, TABLE, now_us=hlc.now_us() + retention_us + 60_000_000)
    assert len(report.needs_bootstrap) == 2
    bring_up(env, "dr", aside)
    assert [nb for _s, nb in states(env, "dr")] == [True, True]


@pytest.fixture
def dr_only(catalog_url: str, tmp_path: Path) -> Any:
    yield from env_fixture(tmp_path, catalog_url, DR_ONLY_YAML)


@pytest.fixture
def dr_only_sqlite(tmp_path: Path) -> Any:
    yield from env_fixture(tmp_path, sqlite_url(tmp_path), DR_ONLY_YAML)


@pytest.fixture
def both_sqlite(tmp_path: Path) -> Any:
    yield from env_fixture(tmp_path, sqlite_url(tmp_path), BOTH_YAML)


@pytest.fixture
def both(catalog_url: str, tmp_path: Path) -> Any:
    yield from env_fixture(tmp_path, catalog_url, BOTH_YAML)


# -- a new site joins -------------------------------------------------------------------------------------------


def test_a_new_site_joins_while_writes_continue(dr_only: Env) -> None:
    env = dr_only
    model = Model()
    with_majors(env, model)
    changes = add_edge(env)
    assert "add     replica edge of table events (JOINING: run `segrep bootstrap events edge`)" in changes
    assert states(env, "edge") == [("JOINING", True), ("JOINING", True)]
    assert note(env, "edge") == "joining; NEEDS BOOTSTRAP: run segrep bootstrap events edge"
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)  # nothing flows before the bootstrap
    assert rep.targets["edge"].outcomes == {} and triples(env.catalog, "edge") == []
    assert "edge" not in rep.safe_time_us

    model.upsert(env, range(90, 100), "c")  # writes go on
    report = bootstrap(env.catalog, env.defs, TABLE, "edge")
    assert len(report.joining) == 2 and report.joining == [pl.placement_id for pl in placements_at(env, "edge")]
    assert all("JOINING, fed from the newest major" in a for a in report.actions), report.actions
    assert states(env, "edge") == [("JOINING", False), ("JOINING", False)]
    assert note(env, "edge") == "joining"

    until = hlc.now_us()
    before_d = Model()
    before_d.rows = dict(model.rows)
    model.upsert(env, range(100, 110), "d")  # committed after the next round's interval end
    rep = run_round(env.catalog, env.defs, TABLE, until, submit=no_spark)
    assert rep.targets["edge"].outcomes == {"FAST_FORWARD": 4}  # the majors, then the c minors
    assert rep.spark_apps == 0 and "edge" not in rep.safe_time_us
    assert states(env, "edge") == [("JOINING", False), ("JOINING", False)]  # it lacks the leader's d segments
    assert triples(env.catalog, "edge") == before_d.snapshot()

    model.upsert(env, range(110, 120), "e")
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert rep.targets["edge"].outcomes == {"FAST_FORWARD": 4} and rep.status == "ok"
    assert states(env, "edge") == [("LIVE", False), ("LIVE", False)]  # JOIN_FINALIZE in the round's commit
    assert rep.safe_time_us["edge"] == rep.end_us - 1 and note(env, "edge") == ""
    all_sites_read_the_model(env, model, ALL_SITES)

    model.upsert(env, range(5, 15), "f")
    model.delete(env, range(50, 55))
    round_until_idle(env)
    all_sites_read_the_model(env, model, ALL_SITES)
    assert triples(env.catalog, "edge") == triples(env.catalog)
    assert_each_segment_once(env.catalog, ALL_SITES)
    assert_files_match_catalog(env)
    assert lease_count(env.catalog) == 0
    collect(env.catalog, env.defs, TABLE)
    assert_sites_hold_exactly_the_catalog(env, ALL_SITES)


def test_bootstrap_of_a_table_without_data_is_live_at_once(dr_only_sqlite: Env) -> None:
    env = dr_only_sqlite
    changes = add_edge(env)  # no data: apply adds LIVE placements, no bootstrap needed
    assert "add     replica edge of table events (LIVE)" in changes
    assert states(env, "edge") == [("LIVE", False), ("LIVE", False)]
    report = bootstrap(env.catalog, env.defs, TABLE, "edge")
    assert all("already replicating" in a for a in report.actions) and report.joining == []
    model = Model()
    model.upsert(env, range(20), "a")
    round_until_idle(env)
    all_sites_read_the_model(env, model, ALL_SITES)


# -- a target that already holds data ---------------------------------------------------------------------------


def test_existing_data_is_refused_by_default_and_adopt_only_takes_equal_data(dr_only_sqlite: Env) -> None:
    env = dr_only_sqlite
    model = Model()
    model.upsert(env, range(50), "a")
    model.upsert(env, range(30, 70), "b")
    model.delete(env, range(0, 5))
    round_until_idle(env)
    p0, p1 = partitions(env.catalog)
    copies = plant_copies(env, p0)  # partition p0: the leader's own files, byte for byte
    different = plant_relaid(env, p1, drop_last_row=True)  # partition p1: one row short
    add_edge(env)
    before = catalog_state(env)

    with pytest.raises(RefusedError, match=r"edge already holds 3 file\(s\) of events partition") as exc:
        bootstrap(env.catalog, env.defs, TABLE, "edge")
    assert "nothing changed" in str(exc.value) and "--mode adopt" in str(exc.value)
    assert catalog_state(env) == before
    code, out, err = cli(env, "bootstrap", TABLE, "edge")
    assert code == 2 and err.count("\n") == 1 and err.startswith("segrep: error: bootstrap of events at edge refused")
    assert catalog_state(env) == before

    with pytest.raises(RefusedError, match=f"partition {p1}: cannot adopt the data at edge: its rows differ"):
        bootstrap(env.catalog, env.defs, TABLE, "edge", "adopt")  # all or nothing: p0 is not adopted either
    assert catalog_state(env) == before

    garbage = env.site_dir("edge") / different
    garbage.write_bytes(b"not parquet at all")
    with pytest.raises(RefusedError, match="its files cannot be read"):
        bootstrap(env.catalog, env.defs, TABLE, "edge", "adopt")
    assert catalog_state(env) == {**before, "files": catalog_state(env)["files"]}

    relaid = plant_relaid(env, p1)  # overwrites the bad file: now every raw row, resolving to the leader's
    assert relaid == different
    code, out, err = cli(env, "bootstrap", TABLE, "edge", "--mode", "adopt")
    assert code == 0, err
    assert f"partition {p0}: adopted {len(copies)} file(s) equal to the source" in out
    assert f"partition {p1}: adopted 1 file(s) equal to the source" in out
    assert states(env, "edge") == [("JOINING", False), ("JOINING", False)]

    model.upsert(env, range(70, 80), "c")
    round_until_idle(env)
    assert states(env, "edge") == [("LIVE", False), ("LIVE", False)]
    all_sites_read_the_model(env, model, ALL_SITES)
    assert_files_match_catalog(env)  # the adopted copies were overwritten by verified copies of equal bytes
    assert files_at(env, "edge") - {relaid} == catalog_relpaths(env, "edge")
    grace_us = env.defs.table(TABLE).policy.orphan_grace_s * 1_000_000
    collect(env.catalog, env.defs, TABLE, now_us=hlc.now_us() + grace_us + 1_000_000)  # the re-laid file: orphan
    assert_sites_hold_exactly_the_catalog(env, ALL_SITES)
    all_sites_read_the_model(env, model, ALL_SITES)


def test_replace_moves_the_old_data_aside_and_never_deletes_it(dr_only_sqlite: Env) -> None:
    env = dr_only_sqlite
    model = Model()
    model.upsert(env, range(50), "a")
    round_until_idle(env)
    p0, p1 = partitions(env.catalog)
    plant_copies(env, p0)
    plant_relaid(env, p1, drop_last_row=True)
    old = digests(env.site_dir("edge"))
    assert len(old) == 2
    add_edge(env)

    report = bootstrap(env.catalog, env.defs, TABLE, "edge", "replace")
    assert sum("existing file(s) moved aside" in a for a in report.actions) == 2
    aside = env.site_dir("edge") / ".replaced"
    moved = digests(aside)
    assert len(moved) == 2 and all(rel.split("/", 1)[1] in old for rel in moved)  # .replaced/<stamp>/<old path>
    assert {rel.split("/", 1)[1]: h for rel, h in moved.items()} == old  # the same bytes, kept aside
    assert files_at(env, "edge") == set()

    model.upsert(env, range(50, 60), "b")
    round_until_idle(env)
    assert states(env, "edge") == [("LIVE", False), ("LIVE", False)]
    all_sites_read_the_model(env, model, ALL_SITES)
    far = hlc.now_us() + 100 * 86400 * 1_000_000
    collect(env.catalog, env.defs, now_us=far)
    assert digests(aside) == moved  # GC never touches what was moved aside
    assert_sites_hold_exactly_the_catalog(env, ALL_SITES)


def test_a_site_dropped_and_added_back_keeps_its_known_files_for_gc(dr_only_sqlite: Env) -> None:
    """Files the catalog lists at the site (its removed placement's) are not foreign data: no refusal, nothing
    moved (catalog rows would point at nothing); a file the catalog does not know still counts."""
    env = dr_only_sqlite
    model = Model()
    add_edge(env)  # no data yet: LIVE at once
    model.upsert(env, range(30), "a")
    round_until_idle(env)
    env.config.write_text(DR_ONLY_YAML)
    assert any("remove  replica edge of table events" in str(c) for c in apply_definitions(env.catalog, env.defs))
    model.upsert(env, range(30, 40), "b")
    round_until_idle(env)
    old_files = files_at(env, "edge")
    assert len(old_files) == 2
    add_edge(env)
    assert states(env, "edge") == [("JOINING", True), ("JOINING", True)]
    p0 = partitions(env.catalog)[0]
    foreign = env.site_dir("edge") / TABLE / str(p0) / f"{'ab' * 16}.parquet"
    foreign.write_bytes(b"someone else's file")
    with pytest.raises(RefusedError, match=rf"edge already holds 1 file\(s\) of events partition {p0} "):
        bootstrap(env.catalog, env.defs, TABLE, "edge")
    report = bootstrap(env.catalog, env.defs, TABLE, "edge", "replace")
    assert f"partition {p0}: 1 existing file(s) moved aside" in report.actions
    assert files_at(env, "edge") == old_files and len(digests(env.site_dir("edge") / ".replaced")) == 1
    assert_files_match_catalog(env)
    model.upsert(env, range(40, 50), "c")
    round_until_idle(env)
    assert states(env, "edge") == [("LIVE", False), ("LIVE", False)]
    all_sites_read_the_model(env, model, ALL_SITES)
    assert_files_match_catalog(env)
    gc = collect(env.catalog, env.defs, TABLE)
    assert sum(d.reason == "removed placement: the leader holds it" for d in gc.deletions) == 2
    assert_sites_hold_exactly_the_catalog(env, ALL_SITES)
    assert old_files <= files_at(env, "edge")  # the same segments, now listed by the new placements
    all_sites_read_the_model(env, model, ALL_SITES)


# -- a replica away past retention --------------------------------------------------------------------------------


def test_a_replica_past_retention_is_rebootstrapped_into_a_new_placement(both: Env) -> None:
    env = both
    model = Model()
    out_of_retention(env, model)
    assert "NEEDS BOOTSTRAP: run segrep bootstrap events dr" in note(env, "dr")
    old = placements_at(env, "dr")
    stale = triples(env.catalog, "dr")
    rep = run_round(env.catalog, env.defs, TABLE, submit=no_spark)
    assert rep.targets["dr"].outcomes == {} and triples(env.catalog, "dr") == stale

    code, out, err = cli(env, "bootstrap", TABLE, "dr")
    assert code == 0, err
    new = placements_at(env, "dr")
    for before, after in zip(old, new, strict=True):
        assert after.placement_id != before.placement_id and after.partition_id == before.partition_id
        assert (
            f"placement {before.placement_id} fell out of retention; REMOVED, new placement "
            f"{after.placement_id} joins from the newest major segment" in out
        )
    removed = placements_at(env, "dr", removed=True)
    assert [pl.placement_id for pl in removed] == [pl.placement_id for pl in old]
    assert all(pl.state == "REMOVED" and pl.removed_us for pl in removed)
    assert states(env, "dr") == [("JOINING", False), ("JOINING", False)]
    assert "NEEDS BOOTSTRAP" not in note(env, "dr")
    # invariant 4: the new placements are what a reader at dr sees now, and they hold nothing yet, so no safe
    # time may claim anything there until they are LIVE again
    assert triples(env.catalog, "dr") == [] and "dr" not in safe_times(env.catalog)

    model.upsert(env, range(70, 80), "c")
    reports = round_until_idle(env)
    assert reports[0].targets["dr"].outcomes == {"FAST_FORWARD": 4}  # the majors and the new minors
    assert states(env, "dr") == [("LIVE", False), ("LIVE", False)]
    assert "dr" in reports[-1].safe_time_us
    assert_safe_time_honest(env.catalog, TABLE, "dr", safe_times(env.catalog)["dr"])
    all_sites_read_the_model(env, model, ALL_SITES)

    gc = collect(env.catalog, env.defs, TABLE)
    gone = [d for d in gc.deletions if d.placement_id in {pl.placement_id for pl in old}]
    assert gone and all(d.reason == "removed placement: the leader holds it" for d in gone)
    assert_sites_hold_exactly_the_catalog(env, ALL_SITES)
    assert_lists_hold_exactly_what_chains_need(env)
    all_sites_read_the_model(env, model, ALL_SITES)
    assert_files_match_catalog(env)


# -- crashes --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["join", "replace", "rejoin"])
def test_a_crash_inside_bootstrap_before_the_commit_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    yaml_text = BOTH_YAML if path == "rejoin" else DR_ONLY_YAML
    env = make_env(tmp_path, f"sqlite:///{tmp_path}/catalog.db", yaml_text)
    model = Model()
    site, mode = ("dr", "auto") if path == "rejoin" else ("edge", "replace" if path == "replace" else "auto")
    if path == "rejoin":
        out_of_retention(env, model)
    else:
        model.upsert(env, range(50), "a")
        round_until_idle(env)
        if path == "replace":
            p0, p1 = partitions(env.catalog)
            plant_copies(env, p0)
            plant_relaid(env, p1, drop_last_row=True)
        add_edge(env)
    old_files = digests(env.site_dir(site))
    before = catalog_rows(env)

    if path == "replace":
        real_move, moves = bootstrap_mod._move_aside, []

        def dying_move(storage: Site, rel: str, stamp: int) -> None:
            moves.append(rel)
            if len(moves) == 2:
                raise OSError("killed while moving files aside")
            real_move(storage, rel, stamp)

        monkeypatch.setattr(bootstrap_mod, "_move_aside", dying_move)
    else:

        def dying(*args: Any) -> None:
            raise RuntimeError("killed inside the bootstrap transaction")

        monkeypatch.setattr(bootstrap_mod, "_live_if_nothing_to_copy", dying)
    with pytest.raises((OSError, RuntimeError), match="killed"):
        bootstrap(env.catalog, env.defs, TABLE, site, mode)
    monkeypatch.undo()
    assert catalog_rows(env) == before
    if path == "replace":  # one file went aside before the crash: moved, not lost
        now = digests(env.site_dir(site))
        assert sorted(now.values()) == sorted(old_files.values()) and len(now) == len(old_files)

    report = bootstrap(env.catalog, env.defs, TABLE, site, mode)  # the re-run
    assert len(report.joining) == 2
    if path == "replace":
        kept = digests(env.site_dir(site) / ".replaced")
        assert sorted(kept.values()) == sorted(old_files.values())  # every old file, across both attempts
    model.upsert(env, range(80, 90), "z")
    round_until_idle(env)
    assert states(env, site) == [("LIVE", False), ("LIVE", False)]
    all_sites_read_the_model(env, model, ALL_SITES)
    collect(env.catalog, env.defs, TABLE)
    assert_sites_hold_exactly_the_catalog(env, ALL_SITES)
    env.catalog.dispose()


@pytest.mark.parametrize(
    "point", ["before_copy", "after_copy_before_commit", "after_commit_before_ack", "before_checkpoint"]
)
def test_a_crash_in_a_round_feeding_a_joining_site(
    dr_only_sqlite: Env, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    env = dr_only_sqlite
    model = Model()
    with_majors(env, model)
    add_edge(env)
    bootstrap(env.catalog, env.defs, TABLE, "edge")
    model.upsert(env, range(100, 110), "c")
    end = hlc.now_us()
    monkeypatch.setenv(faults.FAULTS_ENV, point)
    with pytest.raises(faults.InjectedFault):
        run_round(env.catalog, env.defs, TABLE, end, target="edge", submit=no_spark)
    monkeypatch.delenv(faults.FAULTS_ENV)
    assert_files_match_catalog(env)
    rep = run_round(env.catalog, env.defs, TABLE, end, submit=no_spark)  # the retried task
    assert rep.status == "ok"
    round_until_idle(env)
    assert states(env, "edge") == [("LIVE", False), ("LIVE", False)]
    all_sites_read_the_model(env, model, ALL_SITES)
    assert_each_segment_once(env.catalog, ALL_SITES)
    assert lease_count(env.catalog) == 0
    collect(env.catalog, env.defs, TABLE, now_us=hlc.now_us() + 2 * 86400 * 1_000_000)
    assert_sites_hold_exactly_the_catalog(env, ALL_SITES)


# -- bad input ------------------------------------------------------------------------------------------------------


def test_bootstrap_bad_input_changes_nothing(dr_only_sqlite: Env) -> None:
    env = dr_only_sqlite
    Model().upsert(env, range(10), "a")
    round_until_idle(env)
    before = catalog_state(env)
    cases: list[tuple[tuple[str, str, str], type[Exception], str]] = [
        (("events", "edge", "auto"), RefusedError, "site edge is not a replica of events"),
        (("events", "primary", "auto"), RefusedError, "site primary is the leader of events"),
        (("events", "mars", "auto"), SegrepError, "unknown site 'mars'"),
        (("events", "../x", "auto"), SegrepError, "invalid site name"),
        (("nope", "dr", "auto"), SegrepError, "unknown table 'nope'"),
        (("events", "dr", "sideways"), SegrepError, "unknown bootstrap mode 'sideways'"),
    ]
    for args, kind, message in cases:
        with pytest.raises(kind, match=message.replace("(", r"\(").replace(".", r"\.")):
            bootstrap(env.catalog, env.defs, *args)
        assert catalog_state(env) == before, args
    report = bootstrap(env.catalog, env.defs, TABLE, "dr")
    assert all("already replicating (LIVE); nothing to do" in a for a in report.actions)
    assert catalog_state(env) == before
    code, _out, err = cli(env, "bootstrap", TABLE, "dr", "--mode", "sideways")
    assert code == 2 and "Invalid value for '--mode'" in err
    code, _out, err = cli(env, "bootstrap", TABLE, "edge")
    assert code == 2 and err.startswith("segrep: error: site edge is not a replica of events")
    assert catalog_state(env) == before
