"""Benchmark: replication lag through a real Airflow scheduler (issues 16 and 33).

A table `events` (primary -> dr) runs through a real scheduler (LocalExecutor) and the api-server, both started
here in a throw-away AIRFLOW_HOME, while a batch is written at the leader every `--batch-every-s` seconds.
Every `--sample-s` seconds the lag at dr is sampled as ``segrep status`` computes it (now minus dr's safe
time). After `--minutes` it prints p50, p99 and max of the lag against the target, the DAG runs' durations as
Airflow recorded them and each task's median duration (what one task process costs).

Modes (`--mode`):
- `interval` (default): the DAG on a fixed schedule of `--interval-s` seconds; target p99 <= interval + 15 s.
- `on_write`: `schedule: on_write` (`min_interval` 10 s): every batch written posts its asset event through the
  REST API (``write_batch(defs=...)``, as `segrep write` does); target p99 <= 20 s idle, <= 45 s with 2 busy.
- `empty`: no schedule and nothing written; `--empty-rounds` manual runs triggered one after another through
  the REST API, each timed from the trigger to its success (target <= 5 s on an idle machine).
`--background-load N` runs N CPU-bound processes for the whole measurement ("under load", reproducibly).

Run by hand: `python bench/airflow_lag.py --minutes 10 --interval-s 30 --batch-every-s 10`, or
`--mode empty`. `--keep` keeps the Airflow home (logs of every task). Writes bench/results/airflow-lag-<mode>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
from benchkit import background_load

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
AIRFLOW = str(BIN / "airflow")
DAG_ID = "segrep_replicate_events"

YAML = """
data_dir: {data}
sites:
  primary: {{id: 1, uri: sites/primary}}
  dr: {{id: 2, uri: sites/dr}}
tables:
  events:
    columns: {{tenant: string, seq: int64, payload: string}}
    primary_key: [tenant, seq]
    partition_key: tenant
    split_points: [m]
    leader: primary
    replicas: [dr]
    policy: {{schedule: {schedule}, start_date: "{start}", retries: 2, retry_delay_s: 5}}
"""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


class Stack:
    """The Airflow processes of the bench, each in its own process group, stopped by their own ids."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home, self.env = home, env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def cli(self, *args: str) -> str:
        proc = subprocess.run([AIRFLOW, *args], env=self.env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"airflow {' '.join(args)}: {proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        return proc.stdout

    def start(self, name: str, *args: str) -> None:
        out = (self.home / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            [AIRFLOW, *args], env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        out.close()

    def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # workers left behind


def batch(n: int, size: int) -> pa.Table:
    keys = range(n * size, (n + 1) * size)
    return pa.table(
        {
            "tenant": [f"t{k % 7}" if k % 2 else f"a{k % 5}" for k in keys],
            "seq": pa.array(list(keys), pa.int64()),
            "payload": [f"batch {n} row {k}" for k in keys],
        }
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("interval", "on_write", "empty"), default="interval")
    ap.add_argument("--minutes", type=float, default=10.0, help="how long to ingest and sample (default 10)")
    ap.add_argument("--interval-s", type=int, default=30, help="the replication schedule (default 30 s)")
    ap.add_argument("--batch-every-s", type=float, default=10.0, help="one batch written this often (default 10)")
    ap.add_argument("--sample-s", type=float, default=5.0, help="lag sampled this often (default 5)")
    ap.add_argument("--rows", type=int, default=2000, help="rows per batch")
    ap.add_argument("--empty-rounds", type=int, default=10, help="manual runs timed in --mode empty")
    ap.add_argument("--background-load", type=int, default=0, help="N CPU-bound processes while measuring")
    ap.add_argument("--keep", action="store_true", help="keep the Airflow home and the sites")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    out = args.json or REPO / "bench" / "results" / f"airflow-lag-{args.mode}.json"

    root = Path(tempfile.mkdtemp(prefix="segrep-airflow-lag-"))
    home = root / "airflow"
    home.mkdir()
    start = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S")
    config = root / "segrep.yaml"
    schedule = {"empty": "null", "on_write": "on_write, min_interval: 10s"}.get(args.mode, f'"{args.interval_s}s"')
    config.write_text(YAML.format(data=root / "data", schedule=schedule, start=start))
    api_port = free_port()
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "SEGREP_CONFIG": str(config),
        "SEGREP_CATALOG_URL": f"sqlite:///{root / 'catalog.db'}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",  # the bench's REST calls need no login
        "AIRFLOW__API_AUTH__JWT_SECRET": "segrep-bench-only-" + "0123456789abcdef" * 4,
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
        "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type": "spark", "host": "local[*]"}',
        "PYTHONWARNINGS": "ignore:Could not import graphviz:UserWarning",
        "SEGREP_AIRFLOW_API_URL": f"http://127.0.0.1:{api_port}",  # where writes post their asset events
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "True",
    }
    os.environ.update({k: env[k] for k in ("SEGREP_CONFIG", "SEGREP_CATALOG_URL", "SEGREP_AIRFLOW_API_URL")})
    from segrep.catalog import Catalog

    for cmd in (["init"], ["apply"]):
        subprocess.run([str(BIN / "segrep"), *cmd], env=env, check=True, capture_output=True)
    catalog = Catalog(env["SEGREP_CATALOG_URL"])
    stack = Stack(home, env)
    api = f"http://127.0.0.1:{api_port}"
    load_before = os.getloadavg()
    try:
        log(f"airflow db migrate, DAGs serialised (home {home})")
        stack.cli("db", "migrate")
        stack.cli("dags", "reserialize")
        stack.start("api-server", "api-server", "-H", "127.0.0.1", "-p", str(api_port))
        _wait_healthy(api)
        stack.start("scheduler", "scheduler")
        stack.cli("dags", "unpause", DAG_ID)
        with background_load(args.background_load):
            if args.mode == "empty":
                result = _empty_rounds(api, args.empty_rounds)
            else:
                result = _ingest_and_sample(catalog, args)
            load_during = os.getloadavg()
        runs = json.loads(
            next(x for x in stack.cli("dags", "list-runs", DAG_ID, "-o", "json").splitlines() if x.startswith("["))
        )
    finally:
        stack.stop()
        catalog.dispose()
    durations = _run_durations(runs)
    result = {
        "mode": args.mode,
        "background_load": args.background_load,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_at_end": [round(x, 2) for x in load_during],
        **result,
        "runs": len(runs),
        "runs_failed": sum(1 for r in runs if r.get("state") == "failed"),
        "runs_unfinished": sum(1 for r in runs if r.get("state") not in ("success", "failed")),  # at the end
        "run_seconds_median": round(statistics.median(durations), 1) if durations else None,
        "run_seconds_max": round(max(durations), 1) if durations else None,
        "task_seconds_median": _task_durations(home),
    }
    met = result["measured_s"] <= result["target_s"]
    print("| measure | value |\n|---|---|")
    for key, value in result.items():
        print(f"| {key} | {value} |")
    verdict = "MET" if met else "NOT MET"
    print(f"\n{result['measure']} {result['measured_s']} s vs target {result['target_s']} s: {verdict}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if args.keep:
        print(f"kept: {root} (Airflow logs under {home / 'logs'})")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if met else 1


def _wait_healthy(api: str, timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{api}/api/v2/monitor/health", timeout=2):
                return
        except OSError:
            if time.time() > deadline:
                raise RuntimeError("the api-server did not come up") from None
            time.sleep(0.5)


def _ingest_and_sample(catalog: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Write a batch every ``batch_every_s`` and sample dr's lag every ``sample_s`` for ``minutes``."""
    from segrep.config.definitions import load_definitions
    from segrep.data.writer import write_batch
    from segrep.replication.status import status_rows

    defs = load_definitions() if args.mode == "on_write" else None  # with defs, a write posts its event
    samples: list[tuple[float, float]] = []
    log(f"ingesting a batch every {args.batch_every_s:.0f} s for {args.minutes} min; mode {args.mode}")
    t0 = time.time()
    end = t0 + args.minutes * 60
    next_batch, next_sample, n = t0, t0, 0
    while time.time() < end:
        now = time.time()
        if now >= next_batch:
            write_batch(catalog, "events", batch(n, args.rows), defs=defs)
            n += 1
            next_batch += args.batch_every_s
        if now >= next_sample:
            lag = next(r.lag_s for r in status_rows(catalog, "events") if r.target == "dr")
            if lag is not None:
                samples.append((now - t0, lag))
                log(f"lag at dr {lag:7.1f} s")
            next_sample += args.sample_s
        time.sleep(0.2)
    # The first interval after the unpause is warm-up (the scheduler, the first task processes): left out.
    steady = [lag for at, lag in samples if at >= args.interval_s] or [lag for _, lag in samples]
    return {
        "measure": "lag p99",
        "minutes": args.minutes,
        "interval_s": args.interval_s,
        "batch_every_s": args.batch_every_s,
        "batches": n,
        "samples": len(steady),
        "lag_p50_s": round(percentile(steady, 50), 1),
        "measured_s": round(percentile(steady, 99), 1),
        "lag_max_s": round(max(steady), 1),
        "target_s": 20 if args.mode == "on_write" else args.interval_s + 15,
    }


def _empty_rounds(api: str, count: int) -> dict[str, Any]:
    """Trigger ``count`` manual runs one after another; each timed from the trigger call to its success."""
    took: list[float] = []
    with httpx.Client(base_url=api, timeout=300) as client:  # a loaded machine answers slowly
        token = client.get("/auth/token").json()["access_token"]
        client.headers["Authorization"] = f"Bearer {token}"
        for k in range(count):
            started = time.perf_counter()
            made = client.post(f"/api/v2/dags/{DAG_ID}/dagRuns", json={"logical_date": None})
            made.raise_for_status()
            run_id = made.json()["dag_run_id"]
            while True:
                state = client.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}").json()["state"]
                if state in ("success", "failed"):
                    break
                time.sleep(0.05)
            took.append(time.perf_counter() - started)
            log(f"empty round {k + 1}/{count}: {state} in {took[-1]:.1f} s")
            if state != "success":
                raise RuntimeError(f"run {run_id} ended {state}")
    warm = took[1:] or took  # the first run pays for the first task processes' imports
    return {
        "measure": "empty round, trigger to success, median",
        "empty_rounds": count,
        "first_s": round(took[0], 2),
        "measured_s": round(statistics.median(warm), 2),
        "max_s": round(max(warm), 2),
        "target_s": 5.0,
    }


def _run_durations(runs: list[dict[str, Any]]) -> list[float]:
    """Each finished run's seconds from start to end, as Airflow recorded them."""
    out = []
    for r in runs:
        if r.get("start_date") and r.get("end_date"):
            started = datetime.fromisoformat(str(r["start_date"]))
            ended = datetime.fromisoformat(str(r["end_date"]))
            out.append((ended - started).total_seconds())
    return out


def _task_durations(home: Path) -> dict[str, float]:
    """Median seconds of each task of the replication DAG, from Airflow's metadata database."""
    import sqlite3

    con = sqlite3.connect(home / "airflow.db")
    try:
        rows = con.execute(
            "SELECT task_id, duration FROM task_instance WHERE dag_id = ? AND duration IS NOT NULL", (DAG_ID,)
        ).fetchall()
    finally:
        con.close()
    by_task: dict[str, list[float]] = {}
    for task_id, duration in rows:
        by_task.setdefault(task_id, []).append(float(duration))
    return {t: round(statistics.median(v), 2) for t, v in sorted(by_task.items())}


if __name__ == "__main__":
    sys.exit(main())
