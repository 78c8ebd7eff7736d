"""Benchmark: the operator page (plugins/segrep_page) at 10,000 partitions, target: rendered in under a second.

Run by hand (`python bench/operator_page.py`); prints a markdown table with each measure and MET / NOT MET.
The catalog is PostgreSQL (a fresh schema, dropped at the end), built with COPY (benchkit.fill_chains): a
table ``kv`` with ``--partitions`` partitions (10,000) x 3 placements (``primary`` leading, ``dr``, ``dr2``),
``--segments`` history segments per placement summed over the partitions, all acked, and ``--new``
partitions (every one by default: the worst case for the pending counts) with one segment at the leader that
no replica holds. Then ``--days`` of round reports (one round every ``--round-every-s``) for the lag chart.

Measured, medians of ``--repeats`` (after one warm-up):
a. ``status_rows``: the numbers of ``segrep status`` (the page's numbers);
b. ``build_overview``: (a) plus leadership, the lag history and the failovers;
c. the page: ``GET /`` of the plugin's app (its test client, in process), HTML with the chart data, the user's
   authorization replaced by "may read every table" (the auth manager's check is Airflow's, not the page's);
d. ``GET /metrics`` (Prometheus text), same.
Profiled (cProfile, top entries on stderr) when the page misses the target, or with ``--profile``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchkit import fill_chains, log, make_env, pg_schema, profile_top, timed, verdict

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.replication.overview import build_overview
from segrep.replication.status import status_rows

TABLE = "kv"
TARGET_S = 1.0
ROOT = Path(__file__).resolve().parents[1]


def add_rounds(catalog: Catalog, days: int, every_s: int) -> int:
    """Finished rounds of ``kv`` over the last ``days``, each report with the safe time it left at dr and dr2
    (the lag after a round: 5 to 65 s, growing and shrinking) and the targets' statuses."""
    now = time.time_ns() // 1000
    count = days * 86400 // every_s
    rows: list[dict[str, Any]] = []
    with catalog.write() as s:
        table_id = s.query(m.Table.table_id).filter(m.Table.name == TABLE).scalar()
        for k in range(count):
            end = now - (count - k) * every_s * 1_000_000
            lag = (5 + k % 60) * 1_000_000
            report = {
                "targets": {site: {"site": site, "status": "ok"} for site in ("dr", "dr2")},
                "safe_time_us": {"dr": end - lag, "dr2": end - 2 * lag},
                "spark_apps": 0,
            }
            rows.append(
                {
                    "table_id": table_id,
                    "interval_start_us": end - every_s * 1_000_000,
                    "interval_end_us": end,
                    "status": "ok",
                    "started_us": end + 1_000_000,
                    "finished_us": end + 3_000_000,
                    "report": report,
                }
            )
        s.execute(m.Round.__table__.insert(), rows)
    return count


def median_of(repeats: int, fn: Any, *args: Any) -> tuple[Any, float]:
    fn(*args)  # warm-up: connection pool, imports, templates
    samples = []
    out = None
    for _ in range(repeats):
        out, took = timed(fn, *args)
        samples.append(took)
    return out, statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--segments", type=int, default=40_000, help="history segments per placement (sum)")
    parser.add_argument("--new", type=int, default=None, help="partitions with a pending segment (default: all)")
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--round-every-s", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    new = args.partitions if args.new is None else args.new

    work = Path(tempfile.mkdtemp(prefix="segrep-bench-page-"))
    os.environ.setdefault("AIRFLOW_HOME", str(work / "airflow"))  # the app imports nothing of Airflow here
    sys.path.insert(0, str(ROOT / "plugins"))
    from fastapi.testclient import TestClient

    from segrep_page import access
    from segrep_page.app import create_app
    from segrep_page.source import Source

    with pg_schema("bench_page") as (schema, url):
        body = {"columns": {"k": "int64", "v": "binary"}, "primary_key": ["k"], "split_points": []}
        body["policy"] = {"rpo": "15m"}
        started = time.perf_counter()
        catalog, _defs = make_env(work, url, ["primary", "dr", "dr2"], TABLE, body)
        facts = fill_chains(catalog, schema, TABLE, partitions=args.partitions, history=args.segments, new=new)
        rounds = add_rounds(catalog, args.days, args.round_every_s)
        build_s = time.perf_counter() - started
        log(f"built {args.partitions} partitions, {facts}, {rounds} rounds")
        os.environ["SEGREP_CATALOG_URL"] = url

        rows, status_s = median_of(args.repeats, status_rows, catalog, TABLE)
        assert all(r.pending_segments == facts["new_segments"] for r in rows), rows
        overview, overview_s = median_of(args.repeats, lambda: build_overview(catalog, rpo={TABLE: 900}))
        points = sum(len(sr.points) for t in overview.tables for sr in t.history)

        app = create_app(Source(str(work / "segrep.yaml")))
        app.dependency_overrides[access.current_user] = lambda: None
        access.authorize = lambda user, tables: access.Viewer("bench", frozenset(tables))  # type: ignore[assignment]
        client = TestClient(app)

        def get(path: str) -> int:
            response = client.get(path)
            assert response.status_code == 200, response.text[:500]
            return len(response.content)

        size, page_s = median_of(args.repeats, get, "/")
        metrics_size, metrics_s = median_of(args.repeats, get, "/metrics")
        if page_s > TARGET_S or args.profile:
            for line in profile_top(get, "/"):
                print(line, file=sys.stderr)
        catalog.dispose()
        app.state.source.close()

    print(
        f"catalog: {args.partitions} partitions x 3 placements, {facts['segments']} segment entries, "
        f"{facts['new_segments']} pending per replica, {rounds} rounds ({points} chart points); built in "
        f"{build_s:.1f} s"
    )
    print("| measure | time | target | result |")
    print("|---|---|---|---|")
    print(f"| a. status_rows (segrep status) | {status_s:.3f} s | - | - |")
    print(f"| b. build_overview | {overview_s:.3f} s | - | - |")
    print(f"| c. GET / (page, {size:,} bytes) | {page_s:.3f} s | < {TARGET_S:.0f} s | {verdict(page_s < TARGET_S)} |")
    print(f"| d. GET /metrics ({metrics_size:,} bytes) | {metrics_s:.3f} s | - | - |")


if __name__ == "__main__":
    main()
