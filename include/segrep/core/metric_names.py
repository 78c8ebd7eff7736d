"""The one naming scheme of segrep's metrics, shared by the tasks (StatsD / OpenTelemetry through Airflow's
metrics) and the operator page's Prometheus endpoint, so a dashboard built on either finds the same names.

StatsD has no labels: its name is ``segrep.<metric>.<table>[.<site>][.<reason>]``. Prometheus and
OpenTelemetry carry the same values as ``segrep_<metric>`` with labels ``table``, ``site``, ``reason``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    TIMER = "timer"


@dataclass(frozen=True)
class Metric:
    name: str  # segrep_<name> in Prometheus, segrep.<name>.<labels...> in StatsD
    kind: Kind
    labels: tuple[str, ...]
    help: str

    @property
    def prometheus(self) -> str:
        return f"segrep_{self.name}"

    def statsd(self, **labels: str) -> str:
        """The StatsD name: the metric, then the label values in the metric's order (dots in values -> _)."""
        missing = [x for x in self.labels if x not in labels]
        if missing:
            raise ValueError(f"metric {self.name} needs label(s) {', '.join(missing)}")
        parts = [labels[x].replace(".", "_") for x in self.labels]
        return ".".join(["segrep", self.name, *parts])


LAG_SECONDS = Metric("lag_seconds", Kind.GAUGE, ("table", "site"), "seconds between now and the site's safe time")
PENDING_SEGMENTS = Metric("pending_segments", Kind.GAUGE, ("table", "site"), "segments the site still lacks")
PENDING_BYTES = Metric("pending_bytes", Kind.GAUGE, ("table", "site"), "bytes of the segments the site lacks")
ROUND_DURATION_SECONDS = Metric("round_duration_seconds", Kind.TIMER, ("table",), "a round from plan to commit")
BYTES_COPIED = Metric("bytes_copied", Kind.COUNTER, ("table", "site"), "segment bytes copied to the site")
DECLINES = Metric("declines", Kind.COUNTER, ("table", "site", "reason"), "offers the site declined, by reason")
SPARK_APPLICATIONS = Metric("spark_applications", Kind.COUNTER, ("table",), "Spark applications a round started")
RPO_BREACHES = Metric("rpo_breaches", Kind.COUNTER, ("table", "site"), "runs that ended behind the objective")
CONFLICTS = Metric(
    "conflicts", Kind.COUNTER, ("table", "site", "by"), "rows written at site overwritten by a concurrent write at by"
)
THROTTLED_RETRIES = Metric(
    "throttled_retries",
    Kind.COUNTER,
    ("table", "site"),
    "requests to the site's object store retried after it throttled them (503 SlowDown, 429)",
)

# state gauges the operator page's Prometheus endpoint adds (a scrape sees state; the tasks count events)
RPO_SECONDS = Metric("rpo_seconds", Kind.GAUGE, ("table", "site"), "the table's recovery-point objective (policy.rpo)")
RPO_BREACHED = Metric("rpo_breached", Kind.GAUGE, ("table", "site"), "1 while the site's lag is past the objective")
SAFE_TIME = Metric("safe_time_timestamp_seconds", Kind.GAUGE, ("table", "site"), "the site's safe time (Unix seconds)")
LAST_ROUND_SECONDS = Metric(
    "last_round_duration_seconds", Kind.GAUGE, ("table", "site"), "the table's last round, from plan to commit"
)

ALL = (
    LAG_SECONDS,
    PENDING_SEGMENTS,
    PENDING_BYTES,
    ROUND_DURATION_SECONDS,
    BYTES_COPIED,
    DECLINES,
    SPARK_APPLICATIONS,
    RPO_BREACHES,
    CONFLICTS,
    THROTTLED_RETRIES,
    RPO_SECONDS,
    RPO_BREACHED,
    SAFE_TIME,
    LAST_ROUND_SECONDS,
)
