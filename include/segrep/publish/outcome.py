"""What a publication did at each site: the typed results rounds, reports and ``segrep status`` carry.

Apart from ``publish.publisher`` so that reading a report or a status does not import pyiceberg (with what the
publisher imported then, 0.6-0.8 s of every ``segrep`` process, whatever its command).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from segrep.core import hlc

UNKNOWN_SAFE_TIME = 0  # the summary's safe time of a site the catalog has none for: no write is promised


class SnapshotKind(StrEnum):
    INCREMENTAL = "incremental"  # the previous manifests carried, the new files' added
    CONSOLIDATED = "consolidated"  # the largest data manifest kept; the others and the delete files merged
    CLEAN = "clean"  # every file listed and every hidden row found afresh (a major, a cut, a split...)


class PublishStatus(StrEnum):
    PUBLISHED = "published"  # a new snapshot is current
    UNCHANGED = "unchanged"  # the current snapshot already shows this state
    WAITING = "waiting"  # the site has no copy of some partition yet (joining): nothing published
    FAILED = "failed"  # something could not be read or written: the previous snapshot stays current
    RETIRED = "retired"  # the site holds the table no more (a replica removed): its Iceberg table unregistered


@dataclass(frozen=True)
class SitePublication:
    site: str
    status: PublishStatus
    snapshot_id: int | None = None
    safe_time_us: int | None = None
    kind: SnapshotKind | None = None
    files_added: int = 0
    rows_hidden: int = 0
    files_collected: int = 0  # files of expired snapshots deleted
    seconds: float = 0.0  # its publication, with its share of the catalog reads made for every site at once
    detail: str = ""

    def line(self) -> str:
        """One line for a report: what the site's Iceberg table shows now, or why it was not published."""
        head = f"iceberg at {self.site}: {self.status}"
        if self.status in (PublishStatus.PUBLISHED, PublishStatus.UNCHANGED) and self.safe_time_us is not None:
            kind = (
                f" ({self.kind} snapshot)" if self.kind is not None and self.status is PublishStatus.PUBLISHED else ""
            )
            return f"{head}, snapshot {self.snapshot_id} at safe time {safe_time_text(self.safe_time_us)}{kind}"
        return f"{head}: {self.detail}" if self.detail else head

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> SitePublication:
        kind = doc.get("kind")
        return cls(
            **{**doc, "status": PublishStatus(doc["status"]), "kind": None if kind is None else SnapshotKind(kind)}
        )

    @property
    def clean(self) -> bool:
        return self.kind is SnapshotKind.CLEAN


@dataclass(frozen=True)
class Publication:
    table: str
    sites: tuple[SitePublication, ...] = field(default_factory=tuple)

    @property
    def failed(self) -> list[SitePublication]:
        return [x for x in self.sites if x.status is PublishStatus.FAILED]


def safe_time_text(us: int) -> str:
    """A published safe time as reports and ``segrep status`` show it ("unknown": no write is promised)."""
    return "unknown" if us == UNKNOWN_SAFE_TIME else hlc.iso(us)
