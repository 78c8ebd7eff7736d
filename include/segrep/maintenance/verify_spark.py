"""Which partitions ``segrep verify`` digests on Spark, and the one application that does it (DESIGN 8, 13).

A pair (a replica placement and its leader, at the replica site's pin) whose visible segment files reach the
policy's ``verify_spark_threshold_bytes`` on both sides together is large: every large pair of a verify run
goes into one manifest (each side one item, a leader side shared by the sites pinned alike), one Spark
application digests them all, and verify compares the digests. Only pairs whose digests differ, or a side
the job could not read, are read in process again, to name the keys (or the bad file).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from segrep.catalog import queries as q
from segrep.config.definitions import Definitions
from segrep.core import hlc
from segrep.data.digest import Digest
from segrep.data.reader import PlacementFiles
from segrep.spark.digest_manifest import DigestItem, DigestManifest, load_outcomes
from segrep.spark.items import digest_item
from segrep.spark.launch import Submit
from segrep.storage.workdir import verify_paths

APP = "verify"  # spark_jobs/verify.py


@dataclass(frozen=True)
class Pair:
    """A replica placement to compare with its leader's, as of ``pin``."""

    site: str
    pin: int
    leader: PlacementFiles
    replica: PlacementFiles

    @property
    def key(self) -> tuple[int, str]:
        return self.replica.partition_id, self.site

    @property
    def byte_size(self) -> int:
        return sum(seg.byte_size for pf in (self.leader, self.replica) for seg in pf.segments)


@dataclass(frozen=True)
class PairDigests:
    """Both sides' digests from Spark; a side is None when the job could not read one of its files."""

    leader: Digest | None
    replica: Digest | None

    @property
    def equal(self) -> bool:
        return self.leader is not None and self.leader == self.replica


@dataclass(frozen=True)
class SparkDigests:
    """Where and how a verify run digests its large pairs: the threshold, the run's manifest and result
    files, and ``submit`` (:func:`segrep.spark.launch.submit`; the DAG's connection; a stand-in in tests)."""

    threshold_bytes: int
    key: str
    manifest: Path
    result: Path
    submit: Submit

    @classmethod
    def for_table(cls, defs: Definitions, table: str, submit: Submit) -> SparkDigests:
        """The table's threshold; files named by a key of this run's own (nothing is written until needed)."""
        key = f"{table}-verify-{hlc.now_us()}"
        manifest, result = verify_paths(defs, table, key)
        return cls(defs.policy(table).verify_spark_threshold_bytes, key, manifest, result, submit)

    def large(self, pairs: list[Pair]) -> list[Pair]:
        return [p for p in pairs if p.byte_size >= self.threshold_bytes]

    def digest(self, info: q.TableInfo, pairs: list[Pair]) -> dict[tuple[int, str], PairDigests]:
        """The Spark digests of the large pairs among ``pairs`` (none: no application), by (partition, site)."""
        large = self.large(pairs)
        if not large:
            return {}
        items: dict[str, DigestItem] = {}
        sides = {}
        for p in large:
            leader, replica = digest_item(p.leader, p.pin), digest_item(p.replica, p.pin)
            items.setdefault(leader.item_id, leader)
            items.setdefault(replica.item_id, replica)
            sides[p.key] = (leader.item_id, replica.item_id)
        versions = info.versions
        DigestManifest(
            self.key,
            info.name,
            [(c.name, c.type) for c in versions.target.columns],
            list(info.primary_key),
            info.partition_key,
            list(items.values()),
            versions.first.to_json(),
            versions.target.to_json(),
        ).write(self.manifest)
        args = ["--manifest", str(self.manifest), "--result", str(self.result)]
        self.submit(APP, args, name=f"segrep-verify-{info.name}")
        outcomes = load_outcomes(self.result, self.key)
        return {key: PairDigests(outcomes[lid].digest, outcomes[rid].digest) for key, (lid, rid) in sides.items()}
