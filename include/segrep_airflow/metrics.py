"""A round's numbers through Airflow's own metrics, so they go wherever the deployment sends Airflow's:
StatsD (``[metrics] statsd_on``), Datadog's DogStatsD, or OpenTelemetry (``[metrics] otel_on``).

Names follow ``segrep.core.metric_names`` (one scheme for StatsD and the Prometheus endpoint):
``segrep.<metric>.<table>[.<site>][.<reason>]`` on StatsD, with the same values as tags ``table``, ``site``,
``reason`` for the backends that take tags. The report task emits them once per run (a report re-run after
"Clear" emits its counters again). Nothing is sent when Airflow has no metrics backend configured.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from segrep.core import metric_names as mn

if TYPE_CHECKING:
    from segrep.replication.view import RoundView


class StatsBackend(Protocol):
    """The part of Airflow's ``Stats`` the report uses (a fake in tests, or a different backend)."""

    def gauge(self, stat: str, value: float, *, tags: dict[str, Any] | None = None) -> None: ...
    def incr(self, stat: str, count: int | None = None, *, tags: dict[str, Any] | None = None) -> None: ...
    def timing(self, stat: str, dt: timedelta | float, *, tags: dict[str, Any] | None = None) -> None: ...


def airflow_stats() -> StatsBackend:
    """Airflow's metrics facade in a task process (initialised by the task runner from ``[metrics]``)."""
    from airflow.sdk.observability.stats import Stats

    return Stats


def emit_round(view: RoundView, stats: StatsBackend | None = None) -> list[str]:
    """Send the round's metrics; returns the StatsD names sent (for the log and tests)."""
    backend = stats if stats is not None else airflow_stats()
    table = view.report.table
    sent: list[str] = []

    def gauge(metric: mn.Metric, value: float, **labels: str) -> None:
        name = metric.statsd(**labels)
        backend.gauge(name, value, tags=labels)
        sent.append(name)

    def incr(metric: mn.Metric, count: int, **labels: str) -> None:
        name = metric.statsd(**labels)
        backend.incr(name, count, tags=labels)
        sent.append(name)

    for t in view.targets:
        if t.lag_s is not None:
            gauge(mn.LAG_SECONDS, t.lag_s, table=table, site=t.site)
        gauge(mn.PENDING_SEGMENTS, t.pending_segments, table=table, site=t.site)
        gauge(mn.PENDING_BYTES, t.pending_bytes, table=table, site=t.site)
        incr(mn.BYTES_COPIED, t.bytes_copied, table=table, site=t.site)
        for reason, count in sorted(t.declines.items()):
            incr(mn.DECLINES, count, table=table, site=t.site, reason=reason)
        if t.rpo_breached:
            incr(mn.RPO_BREACHES, 1, table=table, site=t.site)
    throttled: dict[str, int] = {}  # per store site, over the targets whose copies met it (a source, a target)
    for t in view.targets:
        for store, n in t.throttled.items():
            throttled[store] = throttled.get(store, 0) + n
    for store, n in sorted(throttled.items()):
        incr(mn.THROTTLED_RETRIES, n, table=table, site=store)
    incr(mn.SPARK_APPLICATIONS, view.report.spark_apps, table=table)
    if view.duration_s is not None:
        name = mn.ROUND_DURATION_SECONDS.statsd(table=table)
        backend.timing(name, timedelta(seconds=view.duration_s), tags={"table": table})
        sent.append(name)
    return sent
