"""Chaos run: writers and rounds killed with SIGKILL at random moments, a catalog restart, a full disk and a site
that goes away; then heal, run rounds until idle, and compare every site with an independent replay.

Seeded (``--seed``): the same seed draws the same batches, actions and kill delays (what a kill interrupts still
depends on timing). Every writer and round is a real ``segrep`` process. Faults, once each:
- the PostgreSQL server restarted while a round runs (``--catalog postgres`` only; it restarts the whole local
  cluster, so never run this beside other users of it);
- a full disk for a while (``SEGREP_FAULTS=disk_full:enospc``: every atomic local write fails with ENOSPC);
- a replica site unreachable for a while (its directory replaced by a plain file).

A write acknowledged (exit 0) must be there; a killed write may or may not be (it commits in one transaction,
so all of it or none). After healing, rounds run until every target has nothing pending and a round is ok.
Checked: every replica equals the leader row for row; the leader equals the replay (each key holds the value
of its last acknowledged write, or of a killed write after it); no key appears twice.

    python bench/chaos.py --seed 7 --kills 60 --catalog postgres     # the full run (figures in the README)
    python bench/chaos.py --seed 7 --kills 8 --catalog sqlite --no-pg-restart   # the short run the tests use
    python bench/chaos.py --kill-recovery --catalog postgres   # kill -9 at each point -> next replication, s

Prints a report and writes JSON (``--json``); exit 1 if a row was lost, duplicated, resurrected or wrong, or
the sites did not converge.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

PG_URL = os.environ.get("SEGREP_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
SITES = ("primary", "dr", "edge")
HANG_POINTS = ("before_copy", "after_copy_before_commit", "after_commit_before_ack", "before_checkpoint")
KEYS = 2000
DEFINITIONS = """\
data_dir: data
sites:
  primary: {id: 1, uri: sites/primary}
  dr: {id: 2, uri: sites/dr}
  edge: {id: 3, uri: sites/edge}
tables:
  chaos:
    columns: {k: int64, v: string}
    primary_key: [k]
    partition_key: k
    split_points: [1000]
    leader: primary
    replicas: [dr, edge]
    policy: {schedule: "@hourly", start_date: 2026-11-01, retry_delay_s: 1, publish: iceberg}
"""


@dataclass
class Batch:
    """One write as the driver sent it, and what became of it."""

    n: int
    keys: list[int]
    delete: bool
    outcome: str = "pending"  # acked | killed | failed


@dataclass
class Report:
    seed: int
    catalog: str
    kills: int = 0
    write_kills: int = 0
    round_kills: int = 0
    writes_acked: int = 0
    writes_killed: int = 0
    writes_failed: int = 0
    rounds_started: int = 0
    faults: list[str] = field(default_factory=list)
    rounds_to_converge: int = 0
    seconds_heal_to_converge: float = 0.0
    converged: bool = False
    rows_at_leader: int = 0
    rows_lost: int = 0
    rows_resurrected: int = 0
    rows_wrong: int = 0
    duplicates: int = 0
    replica_differences: dict[str, int] = field(default_factory=dict)
    # rows in which each site's published Iceberg table (read by pyiceberg) differs from what the site serves
    published_differences: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)  # how commands that were not killed failed, counted
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.converged and not (
            self.rows_lost
            or self.rows_resurrected
            or self.rows_wrong
            or self.duplicates
            or any(self.replica_differences.values())
            or any(self.published_differences.values())
        )


class Chaos:
    def __init__(self, root: Path, url: str, rng: random.Random, report: Report) -> None:
        self.root, self.url, self.rng, self.report = root, url, rng, report
        self.config = root / "segrep.yaml"
        self.segrep = str(Path(sys.executable).with_name("segrep"))
        self.batches: list[Batch] = []
        self.env = {k: v for k, v in os.environ.items() if k not in ("SEGREP_FAULTS", "SEGREP_CONFIG")}

    def run(self, *args: str, faults: str | None = None, kill_after: float | None = None) -> tuple[int, bool]:
        """A segrep process; killed with SIGKILL after ``kill_after`` seconds if still running. (exit, killed)"""
        env = dict(self.env)
        if faults:
            env["SEGREP_FAULTS"] = faults
        cmd = [self.segrep, "--config", str(self.config), "--catalog", self.url, *args]
        with tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
            try:
                proc.wait(timeout=kill_after if kill_after is not None else 600)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return -9, True
            if proc.returncode != 0:
                err.seek(0)
                first = (err.read().strip().splitlines() or ["(no message)"])[-1]
                why = f"{args[0]}: {first[:160]}"
                self.report.errors[why] = self.report.errors.get(why, 0) + 1
            return proc.returncode, False

    def setup(self) -> None:
        self.config.write_text(DEFINITIONS)
        for args in (("init",), ("apply",)):
            code, _ = self.run(*args)
            if code != 0:
                raise SystemExit(f"segrep {args[0]} failed (exit {code})")

    def draw(self) -> tuple[Batch, pa.Table]:
        """The next batch, drawn from the seed: 20 to 200 keys, a delete one time in five (its keys only)."""
        n = len(self.batches)
        keys = sorted(self.rng.sample(range(KEYS), self.rng.randint(20, 200)))
        batch = Batch(n, keys, delete=self.rng.random() < 0.2)
        columns = {"k": pa.array(keys, pa.int64())} | ({} if batch.delete else {"v": [f"b{n}"] * len(keys)})
        return batch, pa.table(columns)

    def write(self, kill_after: float | None, faults: str | None = None) -> None:
        batch, rows = self.draw()
        path = self.root / "batches" / f"{batch.n:05d}.parquet"
        path.parent.mkdir(exist_ok=True)
        pq.write_table(rows, path)
        args = ["write", "chaos", str(path), *(["--delete"] if batch.delete else [])]
        code, killed = self.run(*args, faults=faults, kill_after=kill_after)
        batch.outcome = "killed" if killed else ("acked" if code == 0 else "failed")
        self.batches.append(batch)
        self.report.write_kills += killed

    def round(self, kill_after: float | None, faults: str | None = None) -> None:
        self.report.rounds_started += 1
        _code, killed = self.run("round", "chaos", faults=faults, kill_after=kill_after)
        self.report.round_kills += killed

    def replicated(self) -> bool:
        """Nothing pending at any target, as `segrep status` says."""
        out = subprocess.run(
            [self.segrep, "--config", str(self.config), "--catalog", self.url, "status", "chaos", "--json"],
            env=self.env,
            capture_output=True,
            text=True,
        )
        rows = json.loads(out.stdout)["replication"] if out.returncode == 0 else []
        return bool(rows) and all(r["pending_segments"] == 0 for r in rows)

    @contextmanager
    def site_down(self, site: str) -> Iterator[None]:
        d = self.root / "data" / "sites" / site
        aside = d.with_name(f"{site}.away")
        d.mkdir(parents=True, exist_ok=True)
        d.rename(aside)
        d.write_text("unreachable")
        try:
            yield
        finally:
            d.unlink()
            aside.rename(d)


def restart_postgres() -> None:
    versions = os.listdir("/etc/postgresql")
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", versions[0], "main", "restart"], check=True, capture_output=True
    )


def drive(chaos: Chaos, kills: int, pg_restart: bool) -> None:
    """Random writes and rounds, about half of them killed at a random moment, until ``kills`` kills; the
    faults happen once each, a third, half and two thirds of the way."""
    rng, report = chaos.rng, chaos.report
    fault_at = {"disk_full": kills // 3, "site_down": kills // 2, "pg_restart": (2 * kills) // 3}
    done: set[str] = set()
    while report.write_kills + report.round_kills < kills:
        killed = report.write_kills + report.round_kills
        if killed >= fault_at["disk_full"] and "disk_full" not in done:
            done.add("disk_full")
            report.faults.append("disk full (ENOSPC) for 2 writes and 2 rounds")
            for _ in range(2):
                chaos.write(None, faults="disk_full:enospc")
                chaos.round(None, faults="disk_full:enospc")
        if killed >= fault_at["site_down"] and "site_down" not in done:
            done.add("site_down")
            report.faults.append("site edge unreachable for 3 writes and 3 rounds")
            with chaos.site_down("edge"):
                for _ in range(3):
                    chaos.write(None)
                    chaos.round(None)
        if pg_restart and killed >= fault_at["pg_restart"] and "pg_restart" not in done:
            done.add("pg_restart")
            report.faults.append("PostgreSQL restarted during a round")
            proc = subprocess.Popen(
                [chaos.segrep, "--config", str(chaos.config), "--catalog", chaos.url, "round", "chaos"],
                env=chaos.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(rng.uniform(0.5, 1.5))
            restart_postgres()
            proc.wait()
        kill_after = rng.uniform(0.3, 2.5) if rng.random() < 0.5 else None
        if rng.random() < 0.6:
            chaos.write(kill_after)
        elif kill_after is not None and rng.random() < 0.4:  # caught exactly at a point inside the round
            chaos.round(4.0, faults=f"{rng.choice(HANG_POINTS)}:hang")
        else:
            chaos.round(kill_after)
    report.kills = report.write_kills + report.round_kills


def converge(chaos: Chaos, max_rounds: int = 40) -> None:
    """Rounds until a round is ok with nothing pending at any target (waiting out back-off and leases)."""
    report = chaos.report
    started = time.monotonic()
    for n in range(1, max_rounds + 1):
        code, _ = chaos.run("round", "chaos")
        if code == 0 and _replicated(chaos):
            report.rounds_to_converge = n
            report.converged = True
            break
        time.sleep(2)
    report.seconds_heal_to_converge = round(time.monotonic() - started, 1)


def allowed_states(batches: list[Batch]) -> dict[int, set[str | None]]:
    """Per key, what the leader may hold: the state after its last acknowledged write (None: absent), or
    after any killed write that came later (a killed write is all there or not at all)."""
    allowed: dict[int, set[str | None]] = {}
    for b in batches:
        if b.outcome == "failed":
            continue
        state = None if b.delete else f"b{b.n}"
        for k in b.keys:
            if b.outcome == "acked":
                allowed[k] = {state}
            else:
                allowed.setdefault(k, {None}).add(state)
    return allowed


def check(chaos: Chaos) -> None:
    from segrep.catalog import Catalog
    from segrep.data.reader import read_table

    report = chaos.report
    catalog = Catalog(chaos.url)
    try:
        tables = {site: read_table(catalog, "chaos", site=None if site == "primary" else site) for site in SITES}
    finally:
        catalog.dispose()
    leader = tables["primary"]
    report.rows_at_leader = leader.num_rows
    keys = leader.column("k").to_pylist()
    report.duplicates = len(keys) - len(set(keys))
    held = dict(zip(keys, leader.column("v").to_pylist(), strict=True))
    allowed = allowed_states(chaos.batches)
    for k, states in allowed.items():
        got = held.get(k)
        if got in states:
            continue
        if got is None:
            report.rows_lost += 1
        elif None in states and len(states) == 1:
            report.rows_resurrected += 1
        else:
            report.rows_wrong += 1
    report.rows_wrong += sum(1 for k in held if k not in allowed)  # written only by writes that failed
    want = set(zip(keys, held.values(), strict=True))
    for site in SITES[1:]:
        t = tables[site]
        got_rows = set(zip(t.column("k").to_pylist(), t.column("v").to_pylist(), strict=True))
        report.replica_differences[site] = len(want ^ got_rows) + (t.num_rows - len(got_rows))
    report.published_differences = published_differences(chaos.url, tables)
    report.writes_acked = sum(b.outcome == "acked" for b in chaos.batches)
    report.writes_killed = sum(b.outcome == "killed" for b in chaos.batches)
    report.writes_failed = sum(b.outcome == "failed" for b in chaos.batches)


def published_differences(url: str, served: dict[str, pa.Table]) -> dict[str, int]:
    """Per site, the rows in which its published Iceberg table, read by pyiceberg from the catalog, differs
    from what the site serves (``served``): (k, v) pairs in one and not the other, a key published twice; a
    site with no table counts every row it serves (at least 1)."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchTableError

    from segrep.publish.site_catalog import CATALOG_NAME

    out = {}
    ice = load_catalog(CATALOG_NAME, type="sql", uri=url)
    try:
        for site, want in served.items():
            want_rows = set(zip(want.column("k").to_pylist(), want.column("v").to_pylist(), strict=True))
            try:
                got = ice.load_table((site, "chaos")).scan().to_arrow()
            except NoSuchTableError:
                out[site] = max(len(want_rows), 1)
                continue
            got_rows = set(zip(got.column("k").to_pylist(), got.column("v").to_pylist(), strict=True))
            out[site] = len(want_rows ^ got_rows) + (got.num_rows - len(got_rows))
    finally:
        ice.engine.dispose()
    return out


@contextmanager
def catalog_url(kind: str, root: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{root / 'data' / 'catalog.db'}"
        return
    from sqlalchemy import create_engine, text

    def ddl(statement: str) -> None:  # a new connection each time: the run restarts the server in between
        engine = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(text(statement))
        finally:
            engine.dispose()

    schema = f"chaos_{uuid.uuid4().hex[:8]}"
    ddl(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    finally:
        ddl(f'DROP SCHEMA "{schema}" CASCADE')


def chaos_run(seed: int, kills: int, kind: str, pg_restart: bool, root: Path) -> Report:
    report = Report(seed=seed, catalog=kind)
    started = time.monotonic()
    with catalog_url(kind, root) as url:
        chaos = Chaos(root, url, random.Random(seed), report)
        chaos.setup()
        drive(chaos, kills, pg_restart and kind == "postgres")
        converge(chaos)
        check(chaos)
    report.seconds = round(time.monotonic() - started, 1)
    return report


def kill_recovery(kind: str, root: Path) -> dict[str, float]:
    """Per point of a round: a round caught there is killed with SIGKILL (its leases at the default lifetime),
    a write follows, then a round of a later interval every 2 s until the replicas hold that write. Seconds
    from the kill to the first round that replicated it (the target: 60)."""
    out: dict[str, float] = {}
    for point in HANG_POINTS:
        run_root = root / point
        run_root.mkdir(parents=True)
        with catalog_url(kind, run_root) as url:
            chaos = Chaos(run_root, url, random.Random(0), Report(seed=0, catalog=kind))
            chaos.setup()
            chaos.write(None)
            chaos.round(4.0, faults=f"{point}:hang")  # killed while hanging at the point
            killed = time.monotonic()
            chaos.write(None)
            while chaos.report.rounds_started < 60:
                chaos.round(None)
                if _replicated(chaos):
                    break
                time.sleep(2)
            out[point] = round(time.monotonic() - killed, 1)
    return out


def _replicated(chaos: Chaos) -> bool:
    return chaos.replicated()


def format_report(r: Report) -> str:
    return "\n".join(
        [
            f"chaos run, seed {r.seed}, {r.catalog} catalog: {'OK' if r.ok else 'FAILED'} in {r.seconds} s",
            f"  kills: {r.kills} (writers {r.write_kills}, rounds {r.round_kills}); rounds started {r.rounds_started}",
            f"  writes: {r.writes_acked} acknowledged, {r.writes_killed} killed, {r.writes_failed} failed cleanly",
            f"  faults: {'; '.join(r.faults) or 'none'}",
            f"  converged: {r.converged} after {r.rounds_to_converge} round(s), {r.seconds_heal_to_converge} s "
            "from healing",
            f"  leader rows {r.rows_at_leader}: lost {r.rows_lost}, resurrected {r.rows_resurrected}, wrong "
            f"{r.rows_wrong}, duplicates {r.duplicates}",
            f"  replica differences: {r.replica_differences}",
            f"  published Iceberg tables vs what each site serves, rows differing: {r.published_differences}",
            "  commands that failed (not killed):",
            *(f"    {n} x {why}" for why, n in sorted(r.errors.items(), key=lambda e: -e[1])),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--kills", type=int, default=60)
    ap.add_argument("--catalog", choices=("postgres", "sqlite"), default="postgres")
    ap.add_argument("--no-pg-restart", action="store_true", help="do not restart the PostgreSQL cluster")
    ap.add_argument("--json", type=Path, default=None, help="also write the report here")
    ap.add_argument("--keep", action="store_true", help="keep the working directory")
    ap.add_argument("--kill-recovery", action="store_true", help="only measure kill -9 -> next replication")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="segrep-chaos-"))
    if args.kill_recovery:
        try:
            seconds = kill_recovery(args.catalog, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        for point, s in seconds.items():
            print(f"kill -9 at {point}: replicated {s} s after the kill ({'MET' if s <= 60 else 'NOT MET'}: <= 60 s)")
        return 0 if all(s <= 60 for s in seconds.values()) else 1
    try:
        report = chaos_run(args.seed, args.kills, args.catalog, not args.no_pg_restart, root)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(format_report(report))
    if args.json:
        args.json.write_text(json.dumps({**asdict(report), "ok": report.ok}, indent=2))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
