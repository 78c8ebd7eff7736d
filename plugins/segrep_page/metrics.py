"""The Prometheus text endpoint: the page's numbers per table and site, named by the one scheme of
``segrep.core.metric_names`` (``segrep_<metric>`` with labels ``table`` and ``site``).

The scheme's state gauges: lag, pending segments and bytes, the objective, whether it is breached, the safe
time and the last round's duration. The counters and timers of the scheme (bytes copied, declines, RPO
breaches, throttled retries, round durations) are emitted by the tasks
through Airflow's metrics (StatsD / OpenTelemetry), not here: a scrape sees state, the tasks count events.
Written with ``prometheus_client``'s exposition (escaping, types, HELP lines), one registry per scrape.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.core import Metric as PromMetric
from prometheus_client.registry import Collector

from segrep.core.metric_names import (
    LAG_SECONDS,
    LAST_ROUND_SECONDS,
    PENDING_BYTES,
    PENDING_SEGMENTS,
    RPO_BREACHED,
    RPO_SECONDS,
    SAFE_TIME,
    Metric,
)
from segrep.replication.status import TargetState

PAGE_GAUGES = (LAG_SECONDS, PENDING_SEGMENTS, PENDING_BYTES, RPO_SECONDS, RPO_BREACHED, SAFE_TIME, LAST_ROUND_SECONDS)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _value(metric: Metric, t: TargetState) -> float | None:
    """The sample of ``metric`` for one site; None leaves it out (unknown, not zero)."""
    if metric is LAG_SECONDS:
        return t.lag_s
    if metric is PENDING_SEGMENTS:
        return float(t.pending_segments)
    if metric is PENDING_BYTES:
        return float(t.pending_bytes)
    if metric is RPO_SECONDS:
        return None if t.rpo_s is None else float(t.rpo_s)
    if metric is RPO_BREACHED:
        return None if t.rpo_s is None else float(t.rpo_breached)
    if metric is SAFE_TIME:
        return None if t.safe_time_us is None else t.safe_time_us / 1e6
    if metric is LAST_ROUND_SECONDS:
        return t.last_round_seconds
    raise ValueError(f"no page value for metric {metric.name}")


class _Targets(Collector):
    def __init__(self, targets: list[TargetState]) -> None:
        self._targets = targets

    def collect(self) -> Iterator[PromMetric]:
        for metric in PAGE_GAUGES:
            family = GaugeMetricFamily(metric.prometheus, metric.help, labels=list(metric.labels))
            for t in self._targets:
                value = _value(metric, t)
                if value is not None:
                    family.add_metric([t.table, t.target], value)
            yield family


def exposition(targets: list[TargetState]) -> bytes:
    """The Prometheus text format (0.0.4) of the targets' gauges."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Targets(targets))
    return generate_latest(registry)
