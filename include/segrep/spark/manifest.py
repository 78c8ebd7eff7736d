"""The contract between a Python plan step and a Spark job: work items over file references, in a manifest.

A manifest is written atomically by the plan step and read by the job; it names files by site, path, size and
sha256 (the job verifies each before reading it) and fixes every output's segment id, so a retried job writes
the same files again instead of new ones. Each site comes with its store options (endpoint, timeouts, the
credentials *reference*; ``config.stores.StoreOptions``), which the job cannot look up itself: it never loads
the definitions. No secret is ever in a manifest; the job's processes read the variables the reference names.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from segrep.config.stores import StoreOptions
from segrep.core.errors import SegrepError
from segrep.core.projection import ReadVersions
from segrep.core.schema_versions import SchemaVersion, first_version
from segrep.data.spark_files import SegmentFile
from segrep.storage.atomic import write_json_atomic
from segrep.storage.site import Site, segment_relpath

MANIFEST_FORMAT = 2  # 2: store options with every site


@dataclass(frozen=True)
class FileRef:
    site: str
    uri: str
    relpath: str
    segment_id: str
    byte_size: int
    sha256: str
    holder_placement_id: int
    options: StoreOptions  # how the site's store is reached (no secret): the job opens it with these
    # a read across a defined link: its share of the link (``spark.link_pacing``), paid per chunk as it is read,
    # and where the share in force now on the link to ``reader_site`` is read again (``storage.live_rates``)
    bytes_per_s: int | None = None
    rate_file: str | None = None
    reader_site: str | None = None

    def open_site(self) -> Site:
        return Site(self.site, self.uri, self.options)

    @classmethod
    def from_doc(cls, raw: dict[str, Any]) -> FileRef:
        where = f"file reference {raw.get('relpath')!r} at site {raw.get('site')!r}: options"
        return cls(**{**raw, "options": StoreOptions.from_doc(raw.get("options"), where)})


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
    leader_options: StoreOptions  # the leader site's store, where the job writes the output
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
    # major only: the rows as of this version (newer ones left out): a failover's cut at a safe time
    as_of_us: int | None = None
    # merge and split: incoming rows outside [partition_begin, partition_end) on this column are left out
    partition_key: str = ""
    # split only: the source segment's shape, kept by the rewrite
    is_major: bool = False
    included_segment_ids: list[str] = field(default_factory=list)
    # merge only: per origin site id (as a string: JSON keys) the newest row version its pushed segments'
    # writers had seen (their base's); a leader row of another origin newer than that is a concurrent write
    # (an active-active conflict, counted by the job)
    origin_forks: dict[str, int] = field(default_factory=dict)
    # the schema versions every input file is projected between (``SchemaVersion.to_json``; "" for version 1
    # of ``columns``): the table's version 1, and the version read and written (``TableInfo.versions``, read
    # with the table's row)
    first_schema: str = ""
    target_schema: str = ""

    @property
    def versions(self) -> ReadVersions:
        return manifest_versions(self.columns, self.first_schema, self.target_schema)

    @property
    def output_relpath(self) -> str:
        return segment_relpath(self.table, self.partition_id, self.output_segment_id)

    def leader(self) -> Site:
        """The leader's site, where the output is written."""
        return Site(self.leader_site, self.leader_uri, self.leader_options)


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
            raw["visible"] = [FileRef.from_doc(f) for f in raw["visible"]]
            raw["incoming"] = [FileRef.from_doc(f) for f in raw["incoming"]]
            where = f"item {raw.get('item_id')!r}: leader_options"
            raw["leader_options"] = StoreOptions.from_doc(raw.get("leader_options"), where)
            items.append(MergeItem(**raw))
        return cls(doc["round_key"], items)


def segment_files(refs: list[FileRef], versions: ReadVersions) -> list[SegmentFile]:
    """The files a job reads for ``refs``, projected to ``versions.target``, each paced at its share if any."""
    return [
        SegmentFile(
            r.site,
            r.uri,
            r.options,
            r.relpath,
            versions=versions,
            byte_size=r.byte_size,
            bytes_per_s=r.bytes_per_s,
            rate_file=r.rate_file,
            reader_site=r.reader_site,
        )
        for r in refs
    ]


def manifest_versions(columns: list[tuple[str, str]], first: str, target: str) -> ReadVersions:
    """The versions a manifest names (as JSON; "" is version 1 of its columns, as before versions existed)."""
    plain = first_version(list(columns))
    return ReadVersions(
        SchemaVersion.from_json(first) if first else plain, SchemaVersion.from_json(target) if target else plain
    )


def output_segment_id(round_key: str, kind: str, partition_id: int, base: str | None, inputs: list[str]) -> str:
    """Deterministic: the same plan names the same output, so a retry overwrites instead of duplicating."""
    text = "|".join([round_key, kind, str(partition_id), base or "-", *sorted(inputs)])
    return hashlib.sha256(text.encode()).hexdigest()[:32]
