"""The contract between a Python plan step and a Spark job: work items over file references, in a manifest.

A manifest is written atomically by the plan step and read by the job; it names files by site, path, size and
sha256 (the job verifies each before reading it) and fixes every output's segment id, so a retried job writes
the same files again instead of new ones.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from segrep.core.errors import SegrepError
from segrep.storage.atomic import write_json_atomic
from segrep.storage.site import segment_relpath

MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class FileRef:
    site: str
    uri: str
    relpath: str
    segment_id: str
    byte_size: int
    sha256: str
    holder_placement_id: int


@dataclass(frozen=True)
class MergeItem:
    item_id: str
    kind: str  # "merge" | "major" | "split"
    table: str
    partition_id: int
    columns: list[tuple[str, str]]  # (name, type) in table order: JSON objects would lose the order
    primary_key: list[str]
    schema_fingerprint: str
    leader_site: str
    leader_uri: str
    leader_placement_id: int
    leader_site_id: int
    epoch: int
    base_segment_id: str | None
    partition_begin: Any
    partition_end: Any
    visible: list[FileRef]
    incoming: list[FileRef] = field(default_factory=list)
    output_segment_id: str = ""
    # major only: tombstones with a row version before this are dropped (None keeps all; DESIGN 7, grace)
    tombstone_cutoff_us: int | None = None
    # merge and split: incoming rows outside [partition_begin, partition_end) on this column are left out
    partition_key: str = ""
    # split only: the source segment's shape, kept by the rewrite
    is_major: bool = False
    included_segment_ids: list[str] = field(default_factory=list)

    @property
    def output_relpath(self) -> str:
        return segment_relpath(self.table, self.partition_id, self.output_segment_id)


@dataclass(frozen=True)
class Manifest:
    round_key: str
    items: list[MergeItem]

    def to_json(self) -> str:
        return json.dumps({"format": MANIFEST_FORMAT, **asdict(self)}, sort_keys=True)

    def write(self, path: str | os.PathLike[str]) -> None:
        write_json_atomic(path, json.loads(self.to_json()))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Manifest:
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SegrepError(f"cannot read merge manifest {path}: {exc}") from None
        if doc.get("format") != MANIFEST_FORMAT:
            raise SegrepError(f"merge manifest {path} has format {doc.get('format')!r}, expected {MANIFEST_FORMAT}")
        items = []
        for raw in doc["items"]:
            raw = dict(raw)
            raw["visible"] = [FileRef(**f) for f in raw["visible"]]
            raw["incoming"] = [FileRef(**f) for f in raw["incoming"]]
            items.append(MergeItem(**raw))
        return cls(doc["round_key"], items)


def output_segment_id(round_key: str, kind: str, partition_id: int, base: str | None, inputs: list[str]) -> str:
    """Deterministic: the same plan names the same output, so a retry overwrites instead of duplicating."""
    text = "|".join([round_key, kind, str(partition_id), base or "-", *sorted(inputs)])
    return hashlib.sha256(text.encode()).hexdigest()[:32]
