"""The page's records made readable: times as ISO with their age, sizes and durations for people, links to the
Airflow runs that produced each number (and to a failed run's task log), the state of each table's
replication DAG, and the chart data. Pure functions of the records (no I/O), so the HTML and the JSON of one
request show the same numbers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from segrep.core import hlc
from segrep.replication.overview import SiteRow, TableOverview
from segrep.replication.status import TargetState
from segrep.split.progress import SplitProgress
from segrep_page.access import replication_dag_id
from segrep_page.airflow_state import FAILED, DagState, Health, Run
from segrep_page.history import Series

_UNITS = ("B", "KB", "MB", "GB", "TB", "PB")


def human_bytes(n: int) -> str:
    """1,234,567 -> '1.2 MB' (powers of 1000, as the round report's sizes)."""
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1000 or unit == _UNITS[-1]:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def human_seconds(seconds: float | None) -> str:
    """42.0 -> '42 s', 3720 -> '1 h 2 min', 90061 -> '1 d 1 h'; None -> '-'."""
    if seconds is None:
        return "-"
    s = round(seconds)
    if s < 120:
        return f"{seconds:.1f} s" if seconds < 10 else f"{s} s"
    if s < 7200:
        return f"{s // 60} min {s % 60} s" if s < 600 else f"{s // 60} min"
    if s < 2 * 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def iso(us: int | None) -> str:
    return "-" if us is None else hlc.iso(us)


@dataclass(frozen=True)
class Links:
    """URLs of the Airflow UI (under its base path) for the DAGs and runs behind the numbers."""

    ui_base: str = ""

    def dag(self, dag_id: str) -> str:
        return f"{self.ui_base}/dags/{quote(dag_id, safe='')}"

    def runs(self, dag_id: str, **filters: str) -> str:
        query = f"?{urlencode(filters)}" if filters else ""
        return f"{self.dag(dag_id)}/runs{query}"

    def round_run(self, table: str, end_us: int) -> str:
        """The replication run whose data interval ended at ``end_us`` (its run_after; a scheduled run's is
        exactly its interval end): a one-second window, so the UI's run list shows that run."""
        return self.runs(
            replication_dag_id(table),
            run_after_gte=hlc.iso(end_us - 1_000_000),
            run_after_lte=hlc.iso(end_us + 1_000_000),
        )

    def runs_around(self, dag_id: str, at_us: int) -> str:
        """The runs of ``dag_id`` under way at ``at_us`` (a failover recorded, a split started)."""
        return self.runs(dag_id, start_date_lte=hlc.iso(at_us), end_date_gte=hlc.iso(at_us))

    def run(self, dag_id: str, run_id: str) -> str:
        return f"{self.dag(dag_id)}/runs/{quote(run_id, safe='')}"

    def task(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
        """A task instance's page, which opens on its log (a mapped task's: that map index)."""
        mapped = f"/mapped/{map_index}" if map_index >= 0 else ""
        return f"{self.run(dag_id, run_id)}/tasks/{quote(task_id, safe='')}{mapped}"


def row_view(row: SiteRow, now_us: int, links: Links, dag: dict[str, Any] | None = None) -> dict[str, Any]:
    """One site of a table; ``dag`` is the table's :func:`dag_view`: when its DAG is paused or failing the
    row says so (``attention``) rather than the last recorded round's "ok"."""
    t = row.target
    out: dict[str, Any] = {
        "table": row.table,
        "site": row.site,
        "role": str(row.role),
        "led_partitions": row.led_partitions,
        "state": str(row.state),
        "schema_version": row.schema_version,  # the newest segment's at this site (None: it holds none)
        "table_schema_version": row.table_schema_version,
        "schema": row.schema_text,  # "v3", or "v2 (table v3)": old segments stay valid, not an error
        "replica": t is not None,
        "dag_health": None if dag is None else dag["health"],
        "attention": dag["summary"] if dag is not None and dag["problem"] else None,
    }
    if t is None:
        return out
    return out | target_view(t, now_us, links)


def target_view(t: TargetState, now_us: int, links: Links) -> dict[str, Any]:
    """One replica's numbers as the page prints them, with the raw values beside them (``data-value``)."""
    seconds = t.last_round_seconds
    return {
        "safe_time_us": t.safe_time_us,
        "safe_time": iso(t.safe_time_us),
        "lag_s": t.lag_s,
        "lag": human_seconds(t.lag_s),
        "pending_segments": t.pending_segments,
        "pending_bytes": t.pending_bytes,
        "pending_bytes_human": human_bytes(t.pending_bytes),
        "last_round_end_us": t.last_round_end_us,
        "last_round_end": iso(t.last_round_end_us),
        "last_round_status": t.last_round_status,
        "last_status": t.last_status,
        "last_round_seconds": seconds,
        "last_round_duration": human_seconds(seconds),
        "last_round_url": None if t.last_round_end_us is None else links.round_run(t.table, t.last_round_end_us),
        "declines": dict(sorted(t.declines.items())),
        "backing_off": t.backing_off,
        "backoff_until_us": t.backoff_until_us,
        "backoff_until": iso(t.backoff_until_us),
        "backoff_in": None if t.backoff_until_us is None else human_seconds((t.backoff_until_us - now_us) / 1e6),
        "rpo_s": t.rpo_s,
        "rpo": human_seconds(t.rpo_s) if t.rpo_s is not None else "-",
        "rpo_breached": t.rpo_breached,
        "rpo_met": None if t.rpo_s is None or t.lag_s is None else not t.rpo_breached,
        "needs_major": t.needs_major,
        "unmerged": dict(t.unmerged),  # site -> segments a failover gave up, not merged yet: outside safe time
        "invalid": len(t.invalid),
        "last_verified_us": None if t.last_verified is None else t.last_verified.finished_us,
        "last_verified": t.last_verified_text() or "-",
        "verify_differences": None if t.last_verified is None else t.last_verified.differences,
    }


def dag_view(table: str, state: DagState | None, runs_visible: bool, links: Links) -> dict[str, Any]:
    """A table's replication DAG as Airflow has it (``state`` None: Airflow's metadata could not be read):
    its health, a one-line summary, and links to its newest run, its newest finished run and, when that
    failed, to the log of each task that failed."""
    dag_id = replication_dag_id(table)
    health = Health.UNKNOWN if state is None else state.health
    latest = None if state is None else state.latest
    finished = None if state is None else state.last_finished
    failed = finished if finished is not None and finished.state == FAILED else None  # paused or not
    # A user who may read the DAG but not its runs learns its health, not the runs, tasks and their links.
    shown_latest = latest if runs_visible else None
    shown_finished = finished if runs_visible else None
    tasks = (
        [_task_view(dag_id, failed, t.task_id, t.map_index, links) for t in failed.failed_tasks]
        if failed is not None and runs_visible
        else []
    )
    return {
        "table": table,
        "dag_id": dag_id,
        "health": str(health),
        "problem": health.problem,
        "summary": _summary(dag_id, health, latest, failed is not None, tasks),
        "short": _SHORT.get(health),  # what a row says instead of its last recorded round's status
        "in_airflow": None if state is None else state.in_airflow,
        "paused": None if state is None else state.paused,
        "runs_visible": runs_visible,
        "latest_run": _run_view(dag_id, shown_latest, links),
        "last_finished_run": _run_view(dag_id, shown_finished, links),
        "failed_tasks": tasks,
        "dag_url": links.dag(dag_id),
    }


_SHORT = {
    Health.NOT_IN_AIRFLOW: "DAG NOT IN AIRFLOW",
    Health.PAUSED: "DAG PAUSED",
    Health.FAILED: "DAG run FAILED",
}


def _summary(dag_id: str, health: Health, latest: Run | None, failed: bool, tasks: list[dict[str, Any]]) -> str:
    if health is Health.UNKNOWN:
        return "DAG state unknown: Airflow's metadata could not be read"
    if health is Health.NOT_IN_AIRFLOW:
        return f"{dag_id} is not in Airflow (not parsed, or its file no longer defines it): no round runs"
    parts = []
    if health is Health.PAUSED:
        parts.append(f"{dag_id} is PAUSED: no round runs")
    if failed:
        which = f" (task {', '.join(t['task'] for t in tasks)})" if tasks else ""
        parts.append(f"its newest finished run FAILED{which}")
    if latest is not None and latest.state not in ("success", "failed"):
        parts.append(f"a run is {latest.state}")
    if health is Health.NO_RUNS:
        parts.append("no run yet")
    return "; ".join(parts) or "newest finished run succeeded"


def _run_view(dag_id: str, run: Run | None, links: Links) -> dict[str, Any] | None:
    if run is None:
        return None
    return {
        "run_id": run.run_id,
        "state": run.state,
        "run_after_us": run.run_after_us,
        "run_after": iso(run.run_after_us),
        "url": links.run(dag_id, run.run_id),
    }


def _task_view(dag_id: str, run: Run, task_id: str, map_index: int, links: Links) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "map_index": map_index,
        "task": task_id if map_index < 0 else f"{task_id}[{map_index}]",
        "log_url": links.task(dag_id, run.run_id, task_id, map_index),
    }


def table_view(table: TableOverview, now_us: int, links: Links, dag: dict[str, Any] | None = None) -> dict[str, Any]:
    lead = table.leadership
    epochs = str(lead.min_epoch) if lead.min_epoch == lead.max_epoch else f"{lead.min_epoch}..{lead.max_epoch}"
    return {
        "name": table.name,
        "dag_id": replication_dag_id(table.name),
        "dag_url": links.dag(replication_dag_id(table.name)),
        "runs_url": links.runs(replication_dag_id(table.name)),
        "epochs": epochs,
        "leaders": dict(sorted(lead.leaders.items())),
        "paused_since": None if lead.paused_since_us is None else iso(lead.paused_since_us),
        "rpo_s": table.rpo_s,
        "rpo": "-" if table.rpo_s is None else human_seconds(table.rpo_s),
        "breached": table.breached,
        "dag": dag,
        "rows": [row_view(r, now_us, links, dag) for r in table.rows],
    }


def chart_data(tables: list[TableOverview], series: dict[str, list[Series]], now_us: int) -> list[dict[str, Any]]:
    """One entry per table, site and window: points as [ms since the epoch, lag s, round end µs, status] from
    the round reports, and ``live`` [now in ms, lag s]: now against the safe time, the line's last point (a
    replica that stopped moving climbs there, however long ago its last round was)."""
    lag = {(r.table, r.site): r.target.lag_s for t in tables for r in t.rows if r.target is not None}
    return [
        {
            "table": table.name,
            "site": s.site,
            "window": s.window,
            "window_s": s.window_s,
            "slot_s": s.slot_s,
            "rpo_s": table.rpo_s,
            "now_ms": now_us // 1000,
            "points": [[p.at_us // 1000, p.lag_s, p.round_end_us, p.status] for p in s.points],
            "live": None if lag.get((table.name, s.site)) is None else [now_us // 1000, lag[(table.name, s.site)]],
        }
        for table in tables
        for s in series.get(table.name, [])
    ]


def split_view(split: SplitProgress, links: Links) -> dict[str, Any]:
    dag_id = f"segrep_split_{split.table}"
    return {
        "split_id": split.split_id,
        "table": split.table,
        "parent": split.parent_partition_id,
        "parent_state": split.parent_state,
        "keys": split.split_keys,
        "mode": "async" if split.is_async else "sync",
        "state": str(split.state),
        "started": iso(split.started_us),
        "sources": split.sources,
        "runs_url": links.runs(dag_id),
        "children": [
            {
                "partition_id": c.partition_id,
                "range": f"[{'-inf' if c.begin_key is None else c.begin_key}, "
                f"{'+inf' if c.end_key is None else c.end_key})",
                "state": c.state,
                "site": c.site,
                "acked": c.acked,
                "lacking": c.lacking,
                "percent": 100 if c.acked + c.lacking == 0 else round(100 * c.acked / (c.acked + c.lacking)),
            }
            for c in split.children
        ],
        "replicas_behind": dict(sorted(split.replicas_behind.items())),
    }
