"""Disaster drills: scripted disasters on a 3-site table (primary leads, dr and edge replicate), each healed as an
operator would with the documented commands, then rounds, then every site compared row for row with an
independent last-writer-wins replay of the acknowledged writes.

Goal per drill: 0 rows lost that any site held, 0 wrong rows served at any site, converged within 2 rounds
after healing. The drills (``--drills``, default all):

- ``site_vanishes``: a replica's root is renamed away while a ``segrep round`` runs; while gone its target is
  DOWN and the root is never recreated; renamed back, it converges.
- ``catalog_lost``: the catalog is deleted; ``segrep init``, ``segrep apply`` (the roots hold the old catalog's
  markers: reported down, not claimed), ``segrep site adopt`` and ``segrep catalog rebuild --site X
  --accept-loss`` for each site, rounds.
- ``leader_file_lost``: a leader file that the replicas hold is deleted; ``segrep catalog rebuild --site
  primary`` fetches it back from a replica, ``segrep repair``.
- ``return_rollback`` / ``return_merge``: failover to dr while primary is down (with writes primary alone
  held), writes at dr, primary returns; under rollback the set-aside rows are excluded from the replay exactly
  as ``segrep rollback list`` names them (and must be rows written while unreplicated); under merge nothing is
  lost. The merge runs Spark: not in ``--short``.
- ``kill_repair``, ``kill_gc``, ``kill_split``, ``kill_failover``, ``kill_switchover``, ``kill_bootstrap``: the
  command killed with SIGKILL at a random moment (``--kills`` times each), re-run, rounds. The split runs
  Spark: not in ``--short``.
- ``pg_restart``: a private PostgreSQL cluster (its own port, under a temporary directory; never the shared
  server) restarted while a round runs; skipped, with the reason, when the PostgreSQL binaries are absent.

Every writer, round and command is a real ``segrep`` process (``bench/chaos.py``'s machinery). The table is
published (``policy: {publish: iceberg}``): each check also reads every site's Iceberg table through pyiceberg
and compares it with what the site serves.

    python bench/drills.py --seed 7 --kills 5 --json bench/results/drills.json   # the full run
    python bench/drills.py --short --seed 3                                     # the test suite's run

Exit 1 if any drill missed its goal, with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from benchkit import background_load, log
from chaos import DEFINITIONS, KEYS, SITES, Batch, Chaos, Report, allowed_states, converge, published_differences

from segrep.catalog import Catalog
from segrep.catalog.apply import apply_definitions
from segrep.catalog.leadership import leadership
from segrep.catalog.migrate import upgrade
from segrep.catalog.publications import publication_states
from segrep.config.definitions import load_definitions
from segrep.data.reader import read_table
from segrep.data.writer import write_batch
from segrep.replication.rollback import list_rollbacks
from segrep.replication.round import lease_ttl_us
from segrep.replication.status import status_rows

SPARK_DRILLS = ("return_merge", "kill_split")
MAX_ROUNDS = 2  # the goal: converged within this many rounds after healing
# Fault points (segrep.core.faults) a kill drill hangs a command at, every other kill (the others: a random
# moment). disk_full is the first atomic local write: a file fetched or copied, not yet renamed into place.
HANG_AT = {
    "repair": ("disk_full",),
    "split": ("split_after_start", "split_before_finalize", "split_after_finalize", "split_before_parent_files"),
    "failover": ("failover_before_commit",),
    "switchover": ("switchover_before_promote",),
}


class DrillFailed(Exception):
    """A drill's invariant broke (a root recreated, a command that must succeed failed): the reason."""


@dataclass
class Outcome:
    drill: str
    ok: bool = False
    skipped: str = ""
    reason: str = ""
    rounds_to_converge: list[int] = field(default_factory=list)  # one per heal (a kill drill heals many times)
    seconds: float = 0.0
    rows: int = 0
    lost: int = 0
    wrong: int = 0
    set_aside: int = 0
    kills: int = 0
    notes: list[str] = field(default_factory=list)


class Drill(Chaos):
    """chaos.py's writers and rounds on a fresh 3-site table, plus what a drill checks after each heal."""

    def __init__(
        self, root: Path, url: str, rng: random.Random, outcome: Outcome, on_return: str, *, short: bool = False
    ) -> None:
        super().__init__(root, url, rng, Report(seed=0, catalog=url.split(":", 1)[0]))
        self.outcome, self.on_return = outcome, on_return
        # no back-off after a failed attempt: a healed site is tried at the next round
        # the table is published (chaos.DEFINITIONS): each check also reads every site's Iceberg table
        self.definitions = DEFINITIONS.replace("retry_delay_s: 1,", f"retry_delay_s: 0, on_return: {on_return},")
        self.replicated_upto = 0  # batches before this one reached every site (set aside: only later ones)
        self.sites = list(SITES)  # every site compared with the replay (a bootstrap drill adds some)
        self.short = short  # the suite's run (--short): a kill that did not land is noted, not a failure

    def setup(self) -> None:
        """``segrep init`` and ``segrep apply``, in this process (a second each saved: a drill's disaster comes
        later; catalog_lost runs both as processes after it)."""
        self.config.write_text(self.definitions)
        with self.catalog() as catalog:
            upgrade(catalog)
            apply_definitions(catalog, load_definitions(self.config))

    def out(self, *args: str) -> tuple[int, str, str]:
        cmd = [self.segrep, "--config", str(self.config), "--catalog", self.url, *args]
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=600, check=False)
        return done.returncode, done.stdout, done.stderr

    def must(self, *args: str) -> str:
        code, out, err = self.out(*args)
        if code != 0:
            raise DrillFailed(f"segrep {' '.join(args)}: exit {code}: {(err or out).strip()[-300:]}")
        return out

    @contextmanager
    def catalog(self) -> Iterator[Catalog]:
        """A connection of the driver's own, for as long as it looks (the catalog may be deleted or restarted)."""
        catalog = Catalog(self.url)
        try:
            yield catalog
        finally:
            catalog.dispose()

    def writes(self, n: int) -> None:
        """``n`` batches written in this process (the writers are not what a drill kills: chaos.py kills them)."""
        for _ in range(n):
            batch, rows = self.draw()
            with self.catalog() as catalog:
                write_batch(catalog, "chaos", rows, delete=batch.delete)
            batch.outcome = "acked"
            self.batches.append(batch)

    def replicated(self) -> bool:
        with self.catalog() as catalog:
            rows = status_rows(catalog, "chaos")
        return bool(rows) and all(r.pending_segments == 0 for r in rows)

    def pending(self, site: str) -> int:
        with self.catalog() as catalog:
            return sum(r.pending_segments for r in status_rows(catalog, "chaos") if r.target == site)

    def site_dir(self, site: str) -> Path:
        return self.root / "data" / "sites" / site

    def leaders(self) -> dict[str, int]:
        with self.catalog() as catalog:
            return dict(leadership(catalog, "chaos")[0].leaders)

    def heal_and_check(self, what: str) -> None:
        """Rounds until converged (at most MAX_ROUNDS), then every site against the replay."""
        self.report.converged, self.report.rounds_to_converge = False, 0
        converge(self, max_rounds=MAX_ROUNDS + 3)
        rounds = self.report.rounds_to_converge if self.report.converged else -1
        self.outcome.rounds_to_converge.append(rounds)
        if rounds < 0 or rounds > MAX_ROUNDS:
            raise DrillFailed(f"{what}: not converged within {MAX_ROUNDS} rounds after healing (took {rounds})")
        self.compare(what)

    def compare(self, what: str) -> None:
        aside = self.set_aside()
        batches = [Batch(b.n, [k for k in b.keys if (k, b.n) not in aside], b.delete, b.outcome) for b in self.batches]
        allowed = allowed_states(batches)
        with self.catalog() as catalog:
            tables = {site: read_table(catalog, "chaos", site=site) for site in self.sites}
        problems = []
        for site, t in tables.items():
            keys = t.column("k").to_pylist()
            held = dict(zip(keys, t.column("v").to_pylist(), strict=True))
            lost = sum(1 for k, states in allowed.items() if held.get(k) is None and None not in states)
            wrong = sum(1 for k, v in held.items() if v not in allowed.get(k, {None}))
            wrong += len(keys) - len(held)  # a key served twice
            self.outcome.lost, self.outcome.wrong = self.outcome.lost + lost, self.outcome.wrong + wrong
            if lost or wrong:
                problems.append(f"{site}: {lost} row(s) lost, {wrong} wrong of {len(held)}")
        self.outcome.rows = tables["primary"].num_rows
        self.outcome.set_aside = len(aside)
        if problems:
            raise DrillFailed(f"{what}: {'; '.join(problems)}")
        self.compare_published(what, tables)

    def compare_published(self, what: str, served: dict[str, pa.Table]) -> None:
        """Each site's published Iceberg table holds exactly the rows the site serves (the last round
        published every site whose copy moved): ``chaos.published_differences``."""
        differences = published_differences(self.url, served)
        problems = [f"{site}: {n} row(s) differ" for site, n in differences.items() if n]
        if problems:
            with self.catalog() as catalog, catalog.read() as s:
                states = [f"{x.site} {x.status} {x.detail}" for x in publication_states(s, "chaos")]
            raise DrillFailed(f"{what}: published tables differ: {'; '.join(problems)} (publications: {states})")

    def set_aside(self) -> set[tuple[int, int]]:
        """(key, batch) pairs the rollback files name as set aside (``list_rollbacks``: what ``segrep rollback
        list`` prints); each must be a write made while unreplicated (after ``replicated_upto``), or the drill
        fails: a row every site held was set aside."""
        with self.catalog() as catalog:
            files = list_rollbacks(catalog, "chaos")
        out: set[tuple[int, int]] = set()
        for f in files:
            path = self.site_dir(f.site) / f.relpath
            for row in pq.read_table(path, columns=["k", "v", "_deleted"]).to_pylist():
                k = row["k"]
                if row["_deleted"]:
                    named = [b.n for b in self.batches if b.delete and k in b.keys and b.n >= self.replicated_upto]
                else:
                    named = [int(row["v"][1:])]
                if not named or min(named) < self.replicated_upto:
                    raise DrillFailed(
                        f"rollback file {f.relpath} at {f.site} holds key {k} ({row}) written before the last "
                        "converged round: a row every site held was set aside"
                    )
                out |= {(k, n) for n in named}
        return out


@contextmanager
def away(path: Path, plain_file: bool) -> Iterator[None]:
    """``path`` renamed away (with a plain file in its place when ``plain_file``: unreachable rather than gone)."""
    aside = path.with_name(f"{path.name}.away")
    path.rename(aside)
    if plain_file:
        path.write_text("unreachable\n")
    try:
        yield
    finally:
        if plain_file:
            path.unlink()
        aside.rename(path)


def start(d: Drill, *args: str) -> subprocess.Popen[bytes]:
    cmd = [d.segrep, "--config", str(d.config), "--catalog", d.url, *args]
    return subprocess.Popen(cmd, env=d.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def prelude(d: Drill, writes: int = 3) -> None:
    """The table set up, written and replicated everywhere."""
    d.setup()
    d.writes(writes)
    d.heal_and_check("before the disaster")
    d.replicated_upto = len(d.batches)


# -- the drills --------------------------------------------------------------------------------------------------


def site_vanishes(d: Drill, kills: int) -> None:
    prelude(d)
    d.writes(2)
    root = d.site_dir("edge")
    proc = start(d, "round", "chaos")
    time.sleep(d.rng.uniform(0.8, 2.5))  # the process starts in about 1.5 s: before, during or after its copies
    with away(root, plain_file=False):
        proc.wait()
        if root.exists():
            raise DrillFailed("edge's root was recreated by the round it vanished under")
        d.writes(1)
        _code, out, _err = d.out("round", "chaos")
        if root.exists():
            raise DrillFailed("edge's root was recreated by a round while it was gone")
        line = next((x.strip() for x in out.splitlines() if x.strip().startswith("edge: ")), "")
        if not line.startswith("edge: down"):
            raise DrillFailed(f"edge is gone but the round did not say it is down: {line or out[-300:]}")
        pending = d.pending("edge")
        if not pending:
            raise DrillFailed("edge is gone but status shows nothing pending there")
        d.outcome.notes.append(f"while gone: {line[:120]}; root absent, {pending} segment(s) pending there")
    d.heal_and_check("edge's root renamed back")


def catalog_lost(d: Drill, kills: int) -> None:
    prelude(d)
    d.writes(2)
    d.run("round", "chaos")  # the last writes reach the replicas or not: the rebuild takes what the files hold
    d.writes(1)  # at primary only
    Path(d.url.removeprefix("sqlite:///")).unlink()
    d.must("init")
    out = d.must("apply")
    for site in SITES:
        if not (d.site_dir(site) / "_segrep_site.json").exists():
            raise DrillFailed(f"site {site}'s identity marker is gone after apply on a new catalog")
    for site in SITES:
        if f"down    site {site}: its root holds the marker of site {site}" not in out:
            raise DrillFailed(f"apply on a new catalog did not report site {site}'s root as down, not claimed")
        d.must("catalog", "rebuild", "--site", site, "--accept-loss")  # claims the root with its files
    d.heal_and_check("catalog rebuilt from every site")


def leader_file_lost(d: Drill, kills: int) -> None:
    prelude(d)
    held = [p for p in (d.site_dir("primary") / "chaos").rglob("*.parquet") if _at_replicas(d, p)]
    victim = d.rng.choice(sorted(held))
    victim.unlink()
    out = d.must("catalog", "rebuild", "--site", "primary", "--accept-loss")
    if "LOST" in out or "fetched from" not in out:
        raise DrillFailed(f"the rebuild did not fetch {victim.name} back from a replica: {out.strip()[-300:]}")
    d.must("repair", "chaos")
    d.heal_and_check("leader file fetched back and repaired")


def _at_replicas(d: Drill, path: Path) -> bool:
    rel = path.relative_to(d.site_dir("primary"))
    return all((d.site_dir(site) / rel).exists() for site in SITES[1:])


def old_leader_returns(d: Drill, kills: int) -> None:
    prelude(d)
    d.writes(2)  # primary alone holds these
    with away(d.site_dir("primary"), plain_file=True):
        d.must("failover", "chaos", "--to", "dr")
        d.writes(2)  # at dr
        d.run("round", "chaos")
    d.heal_and_check("primary returned")
    if d.on_return == "merge" and d.outcome.set_aside:
        raise DrillFailed(f"on_return merge set {d.outcome.set_aside} row(s) aside: nothing may be")


DrillFn = Callable[["Drill", int], None]


def _kill_drill(command: Callable[[Drill, int], list[str]], prepare: DrillFn | None = None) -> DrillFn:
    """A drill that kills ``command`` with SIGKILL ``kills`` times (every other attempt hung at a fault point
    of the command, the others at a random moment; an attempt that finished before its kill is checked too and
    another made, up to 3 x ``kills``), re-runs it when it did not finish, heals after each."""

    def drill(d: Drill, kills: int) -> None:
        prelude(d)
        started = time.monotonic()
        d.must("status", "chaos")  # a process's start-up: kills land after it, inside the command
        startup = took = time.monotonic() - started
        i = 0
        while d.outcome.kills < kills and i < 3 * kills:  # a command that finished first is tried again
            if i:  # the prelude wrote and replicated before the first
                d.writes(1)
                d.run("round", "chaos")
                d.replicated_upto = len(d.batches)
            if prepare is not None:
                prepare(d, i)
            args = command(d, i)
            points = HANG_AT.get(args[0], ())
            if points and i % 2 == 0:  # caught exactly at a point inside the command
                point = d.rng.choice(points)
                how = f"at {point}"
                code, killed = d.run(*args, faults=f"{point}:hang", kill_after=startup * 2 + 3)
            else:  # at a random moment of its run (as long as its last whole run took, when one did)
                after = d.rng.uniform(0.6 * took, took) if took != startup else d.rng.uniform(0.8, 1.1) * startup
                how = f"after {after:.1f} s"
                began = time.monotonic()
                code, killed = d.run(*args, kill_after=after)
                took = took if killed else time.monotonic() - began
            d.outcome.kills += killed
            d.outcome.notes.append(f"{' '.join(args)}: {'killed' if killed else 'finished before the kill'} {how}")
            if not killed and code != 0:
                raise DrillFailed(f"segrep {' '.join(args)} (not killed) exited {code}: {d.report.errors}")
            if killed and _needed(d, args):
                d.must(*args)  # re-run: the documented recovery of each of these commands
            d.heal_and_check(f"attempt {i + 1}: {' '.join(args)} ({'killed' if killed else 'finished first'})")
            i += 1
        if d.outcome.kills < kills:
            shortfall = f"only {d.outcome.kills} of {kills} kill(s) landed in {3 * kills} attempts"
            if d.short:  # the suite's run checks rows, not timing on a loaded machine
                d.outcome.notes.append(shortfall)
            else:
                raise DrillFailed(shortfall)

    return drill


def _needed(d: Drill, args: list[str]) -> bool:
    """A killed failover or switchover that committed is not re-run (it would refuse: the site leads)."""
    if args[0] in ("failover", "switchover"):
        return args[-1] not in d.leaders() or len(d.leaders()) > 1
    return True


def _other_leader(d: Drill, i: int) -> list[str]:
    return ["--to", "dr" if "dr" not in d.leaders() else "primary"]


def _drop_replica_file(d: Drill, i: int) -> None:
    site = d.rng.choice(SITES[1:])
    files = sorted((d.site_dir(site) / "chaos").rglob("*.parquet"))
    d.rng.choice(files).unlink()


def _new_replica(d: Drill, i: int) -> None:
    """A site added to the table's replicas (``segrep apply`` makes it JOINING) for the bootstrap to join."""
    site = f"spare{i}"
    d.definitions = d.definitions.replace(
        "  edge: {id: 3, uri: sites/edge}\n",
        f"  edge: {{id: 3, uri: sites/edge}}\n  {site}: {{id: {4 + i}, uri: sites/{site}}}\n",
    ).replace("replicas: [dr, edge", f"replicas: [dr, edge, {site}")
    d.config.write_text(d.definitions)
    d.must("apply")
    d.sites.append(site)


def _split_args(d: Drill, i: int) -> list[str]:
    """``segrep split`` of the widest live partition (as ``table describe`` lists it) at a key inside it."""
    out = d.must("table", "describe", "chaos")
    ranges: dict[str, tuple[int, int]] = {}
    for line in out.splitlines():
        cells = line.split()
        if len(cells) > 3 and cells[0].isdigit() and cells[3] == "LIVE":
            begin, end = cells[1].strip("[,"), cells[2].rstrip(")")
            ranges[cells[0]] = (0 if begin == "-inf" else int(begin), KEYS if end == "+inf" else int(end))
    if not ranges:
        raise DrillFailed(f"no live partition in `table describe`: {out[-300:]}")
    pid, (lo, hi) = max(ranges.items(), key=lambda r: r[1][1] - r[1][0])
    return ["split", "chaos", pid, "--at", str(d.rng.randint(lo + 1, hi - 1))]


def _failover_args(d: Drill, i: int) -> list[str]:
    return ["failover", "chaos", *_other_leader(d, i)]


DRILLS: dict[str, tuple[DrillFn, str]] = {
    "site_vanishes": (site_vanishes, "rollback"),
    "catalog_lost": (catalog_lost, "rollback"),
    "leader_file_lost": (leader_file_lost, "rollback"),
    "return_rollback": (old_leader_returns, "rollback"),
    "return_merge": (old_leader_returns, "merge"),
    "kill_repair": (_kill_drill(lambda d, i: ["repair", "chaos"], _drop_replica_file), "rollback"),
    "kill_gc": (_kill_drill(lambda d, i: ["gc", "chaos"]), "rollback"),
    "kill_split": (
        _kill_drill(_split_args),
        "rollback",
    ),
    "kill_failover": (_kill_drill(_failover_args), "rollback"),
    "kill_switchover": (_kill_drill(lambda d, i: ["switchover", "chaos", *_other_leader(d, i)]), "rollback"),
    "kill_bootstrap": (_kill_drill(lambda d, i: ["bootstrap", "chaos", f"spare{i}"], _new_replica), "rollback"),
    "pg_restart": (lambda d, kills: None, "rollback"),  # run by pg_drill: it owns its PostgreSQL cluster
}


# -- a private PostgreSQL cluster --------------------------------------------------------------------------------


def pg_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return found[-1].parent if found else None


def quiet_port(rng: random.Random) -> int:
    """A free loopback port below the kernel's ephemeral range: a fixed port (or one the kernel handed out) can be
    taken by any test's outgoing connection meanwhile (CI's pg_restart once failed to bind 55432)."""
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(100):
        port = rng.randrange(max(1025, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise DrillFailed(f"no free loopback port below {low} for the drill's PostgreSQL")


class PrivatePostgres:
    """A PostgreSQL cluster of the drill's own (trust auth, a quiet port, socket in its directory); run as the
    ``postgres`` user when the drill runs as root (initdb refuses root)."""

    def __init__(self, bindir: Path, rng: random.Random) -> None:
        self.bindir = bindir
        self.rng = rng
        self.where = Path(tempfile.mkdtemp(prefix="segrep-drills-pg-"))  # its own: the postgres user must enter it
        self.data = self.where / "pgdata"
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.where, "postgres")
        self.port = quiet_port(rng)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def ctl(self, *args: str) -> None:
        opts = f"-p {self.port} -k {self.where} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = self.where / "log"
        # run from its own directory: the postgres user cannot enter the caller's (a test's is root's, mode 700)
        cmd = [
            *self.as_user,
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            opts,
            "-w",
            "-l",
            str(log),
            *args,
        ]
        try:
            _check(cmd, cwd=self.where)
        except DrillFailed as e:
            tail = log.read_text(errors="replace").strip()[-600:] if log.exists() else "(no server log)"
            raise DrillFailed(f"{e}; server log: {tail}") from None

    def __enter__(self) -> PrivatePostgres:
        initdb = [*self.as_user, str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres"]
        _check(initdb, cwd=self.where)
        failed: DrillFailed | None = None
        for attempt in range(3):
            if attempt:
                self.port = quiet_port(self.rng)  # the port was taken between the check and the server's bind
            try:
                self.ctl("start")
                return self
            except DrillFailed as e:
                failed = e
        assert failed is not None
        raise failed

    def __exit__(self, *exc: object) -> None:
        try:
            self.ctl("stop", "-m", "immediate")
        finally:
            shutil.rmtree(self.where, ignore_errors=True)


def _check(cmd: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, cwd=cwd)
    if done.returncode != 0:
        raise DrillFailed(
            f"{Path(cmd[cmd.index('--') + 1 if '--' in cmd else 0]).name}: exit {done.returncode}: "
            f"{(done.stderr or done.stdout).strip()[-300:]}"
        )


def pg_restart(d: Drill, pg: PrivatePostgres) -> None:
    prelude(d)
    d.writes(2)
    proc = start(d, "round", "chaos")
    time.sleep(d.rng.uniform(1.2, 2.5))
    pg.ctl("restart", "-m", "fast")
    proc.wait()
    d.outcome.notes.append(f"the round the restart hit exited {proc.returncode}")
    if proc.returncode != 0:
        # the round died with its leases held (the catalog went away under it): like a killed round's, they
        # block the next rounds until they lapse, which healing waits out (README: "a crashed round does not
        # stall replication")
        wait_s = lease_ttl_us() / 1_000_000 + 1
        d.outcome.notes.append(f"waited {wait_s:.0f} s for the failed round's leases to lapse")
        time.sleep(wait_s)
    d.writes(1)
    d.heal_and_check("PostgreSQL restarted during a round")


# -- the run -----------------------------------------------------------------------------------------------------


def run_drill(name: str, seed: int, kills: int, work: Path, *, short: bool = False) -> Outcome:
    outcome = Outcome(name)
    started = time.monotonic()
    fn, on_return = DRILLS[name]
    root = work / name
    root.mkdir(parents=True)
    rng = random.Random(f"{seed}:{name}")
    try:
        if name == "pg_restart":
            bindir = pg_bin()
            if bindir is None:
                outcome.skipped = "no PostgreSQL binaries under /usr/lib/postgresql/*/bin"
                return outcome
            with PrivatePostgres(bindir, random.Random(f"{seed}:port")) as pg:
                pg_restart(Drill(root, pg.url, rng, outcome, on_return, short=short), pg)
        else:
            url = f"sqlite:///{root / 'data' / 'catalog.db'}"
            fn(Drill(root, url, rng, outcome, on_return, short=short), kills)
        outcome.ok = True
    except DrillFailed as e:
        outcome.reason = str(e)
    finally:
        outcome.seconds = round(time.monotonic() - started, 1)
    return outcome


def format_outcome(o: Outcome) -> str:
    if o.skipped:
        return f"{o.drill:18} SKIPPED: {o.skipped}"
    head = (
        f"{o.drill:18} {'OK' if o.ok else 'FAILED'}  rounds to converge {o.rounds_to_converge}  {o.seconds} s  "
        f"rows {o.rows}, lost {o.lost}, wrong {o.wrong}, set aside {o.set_aside}"
        + (f", kills {o.kills}" if o.drill.startswith("kill_") else "")
    )
    return "\n".join([head, *(f"    {n}" for n in o.notes), *([f"    reason: {o.reason}"] if o.reason else [])])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--drills", default=",".join(DRILLS), help=f"comma-separated subset of: {', '.join(DRILLS)}")
    ap.add_argument("--kills", type=int, default=5, help="kills per command in the kill drills")
    ap.add_argument("--short", action="store_true", help="the test suite's run: 1 kill each, no Spark drills")
    ap.add_argument("--json", type=Path, default=None, help="also write the outcomes here")
    ap.add_argument("--background-load", type=int, default=0, metavar="N", help="N CPU-bound processes meanwhile")
    ap.add_argument("--keep", action="store_true", help="keep the working directory")
    args = ap.parse_args(argv)
    names = [x.strip() for x in args.drills.split(",") if x.strip()]
    unknown = [x for x in names if x not in DRILLS]
    if unknown:
        ap.error(f"unknown drill(s) {', '.join(unknown)}; known: {', '.join(DRILLS)}")
    kills = 1 if args.short else args.kills
    work = Path(tempfile.mkdtemp(prefix="segrep-drills-"))
    outcomes: list[Outcome] = []
    try:
        with background_load(args.background_load):
            for name in names:
                if args.short and name in SPARK_DRILLS:
                    outcomes.append(Outcome(name, skipped="needs Spark (--short runs no Spark)"))
                    continue
                log(f"drill {name}")
                outcomes.append(run_drill(name, args.seed, kills, work, short=args.short))
                log(format_outcome(outcomes[-1]))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"disaster drills, seed {args.seed}, {kills} kill(s) per command, background load {args.background_load}")
    for o in outcomes:
        print(format_outcome(o))
    failed = [o for o in outcomes if not o.ok and not o.skipped]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=2))
    if failed:
        print("FAILED: " + "; ".join(f"{o.drill}: {o.reason}" for o in failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
