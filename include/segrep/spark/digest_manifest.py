"""The contract between ``segrep verify`` and its Spark digest job: items in a manifest, digests in a result.

An item is one placement's rows as of a pinned version: its visible segment files (by site, path, size and
sha256, checked by the job before it reads them), its key range, and the pin. The job digests each item's
resolved rows exactly as ``data.digest`` does in process, so the two digests of the same rows are equal, and
writes one outcome per item: the digest, or why the item could not be read. Verify compares the digests.
Each file names its site's store options (``FileRef.options``: no secret), with which the job opens it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from segrep.core.errors import SegrepError
from segrep.core.projection import ReadVersions
from segrep.data.digest import Digest
from segrep.spark.manifest import FileRef, manifest_versions
from segrep.storage.atomic import write_json_atomic

DIGEST_FORMAT = 2  # 2: store options with every file


@dataclass(frozen=True)
class DigestItem:
    """One placement's rows with versions <= ``as_of_us``, restricted to ``[key_begin, key_end)`` on the
    partition key (JSON-form bounds, None unbounded), resolved by last writer wins, tombstones hidden."""

    item_id: str
    partition_id: int
    placement_id: int
    site: str
    as_of_us: int
    key_begin: Any
    key_end: Any
    files: list[FileRef]


@dataclass(frozen=True)
class DigestManifest:
    key: str
    table: str
    columns: list[tuple[str, str]]  # (name, type) in table order: the digest hashes columns in this order
    primary_key: list[str]
    partition_key: str
    items: list[DigestItem]
    first_schema: str = ""  # as ``MergeItem``'s: the versions every file is projected between
    target_schema: str = ""

    @property
    def versions(self) -> ReadVersions:
        return manifest_versions(self.columns, self.first_schema, self.target_schema)

    def write(self, path: str | os.PathLike[str]) -> None:
        write_json_atomic(path, {"format": DIGEST_FORMAT, **asdict(self)})

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> DigestManifest:
        doc = _read(path, "digest manifest")
        items = [DigestItem(**{**raw, "files": [FileRef.from_doc(f) for f in raw["files"]]}) for raw in doc["items"]]
        columns = [(name, kind) for name, kind in doc["columns"]]
        return cls(
            doc["key"],
            doc["table"],
            columns,
            doc["primary_key"],
            doc["partition_key"],
            items,
            doc.get("first_schema", ""),
            doc.get("target_schema", ""),
        )


@dataclass(frozen=True)
class DigestOutcome:
    """An item's digest, or (``digest`` None) why the job could not read it: a file that is not the segment
    the catalog names, or a site that is down."""

    item_id: str
    digest: Digest | None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = self.digest
        return {
            "item_id": self.item_id,
            "rows": None if d is None else d.rows,
            "hash_sum": _hex(d),
            "error": self.error,
        }

    @classmethod
    def of(cls, raw: dict[str, Any]) -> DigestOutcome:
        digest = None if raw["rows"] is None else Digest(int(raw["rows"]), int(raw["hash_sum"], 16))
        return cls(raw["item_id"], digest, raw["error"])


def _hex(d: Digest | None) -> str | None:
    return None if d is None else f"{d.hash_sum:032x}"  # JSON numbers lose precision past 2**53


def write_outcomes(path: str | os.PathLike[str], key: str, outcomes: list[DigestOutcome]) -> None:
    write_json_atomic(path, {"format": DIGEST_FORMAT, "key": key, "items": [o.to_dict() for o in outcomes]})


def load_outcomes(path: str | os.PathLike[str], key: str) -> dict[str, DigestOutcome]:
    """The job's outcomes by item id; SegrepError if the file is not this run's."""
    doc = _read(path, "digest result")
    if doc.get("key") != key:
        raise SegrepError(f"digest result {path} belongs to {doc.get('key')!r}, not to {key!r}")
    return {o.item_id: o for o in map(DigestOutcome.of, doc["items"])}


def _read(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SegrepError(f"cannot read {what} {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != DIGEST_FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else None
        raise SegrepError(f"{what} {path} has format {found!r}, expected {DIGEST_FORMAT}")
    return doc
