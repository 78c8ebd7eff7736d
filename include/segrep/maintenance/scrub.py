"""File scrub: every segment file of a table, at every site (or one), against its catalog row (DESIGN 13).

Each copy is hashed at a bounded rate (``storage.pacing``) so a scrub does not starve rounds. Besides a
missing, truncated or changed file (size or sha256 not the catalog's), a copy whose catalog row itself
disagrees with the leader's row for the same segment id is flagged: a segment's bytes are the same
everywhere, so two different facts for one segment id mean one copy is not the segment (the leader's is the
reference, as it is for rows).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.catalog.verifications import FileCheckResult
from segrep.core import hlc
from segrep.storage.atomic import FileFacts
from segrep.storage.pacing import Pacer, paced_facts
from segrep.storage.site import Site


class FileState(StrEnum):
    MISSING = "missing"
    DAMAGED = "damaged"  # size or sha256 differs from the catalog row, or the file cannot be read
    DIVERGENT = "divergent"  # matches its own catalog row, but that row is not the leader's for the segment


@dataclass(frozen=True)
class SegmentCopy:
    """One placement's copy of one segment, as the catalog lists it."""

    site: str
    site_uri: str
    placement_id: int
    partition_id: int
    is_leader: bool
    segment: m.Segment

    @property
    def facts(self) -> FileFacts:
        return FileFacts(self.segment.byte_size, self.segment.sha256)

    def storage(self) -> Site:
        return Site(self.site, self.site_uri)


@dataclass(frozen=True)
class FileProblem:
    site: str
    placement_id: int
    partition_id: int
    segment_id: str
    path: str
    is_leader: bool
    state: FileState
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ScrubResult:
    problems: list[FileProblem] = field(default_factory=list)
    checks: list[FileCheckResult] = field(default_factory=list)
    files: int = 0
    bytes: int = 0


def segment_copies(catalog: Catalog, info: q.TableInfo) -> list[SegmentCopy]:
    """Every copy of every segment in the lists of the table's active placements (one read)."""
    with catalog.read() as s:
        parts = q.partitions_of(s, info)
        leaders = {p.leader_placement_id for p in parts}
        placements = q.active_placements(s, [p.partition_id for p in parts])
        sites = q.sites_by_id(s)
        lists = q.segments_of(s, [pl.placement_id for pl in placements])
    out = []
    for pl in placements:
        site = sites[pl.site_id]
        for seg in lists.get(pl.placement_id, []):
            out.append(
                SegmentCopy(site.name, site.uri, pl.placement_id, pl.partition_id, pl.placement_id in leaders, seg)
            )
    return out


def leader_facts(copies: list[SegmentCopy]) -> dict[tuple[int, str], FileFacts]:
    """(partition, segment id) -> the leader's catalog facts for that segment, where the leader lists it."""
    return {(c.partition_id, c.segment.segment_id): c.facts for c in copies if c.is_leader}


def no_link(site: str) -> Pacer | None:
    return None


def check_copy(
    copy: SegmentCopy, pacer: Pacer, reference: FileFacts | None, link: Pacer | None = None
) -> tuple[FileProblem | None, int]:
    """Hash one copy (at ``link``'s pace too, when it is read over a capped link); the problem with it (None:
    good) and the bytes read."""
    storage = copy.storage()
    path = storage.path(copy.segment.relpath)

    def problem(state: FileState, detail: str) -> FileProblem:
        seg = copy.segment
        return FileProblem(
            copy.site, copy.placement_id, copy.partition_id, seg.segment_id, path, copy.is_leader, state, detail
        )

    try:
        facts = paced_facts(storage, copy.segment.relpath, pacer, link)
    except FileNotFoundError:
        return problem(FileState.MISSING, "the file is missing"), 0
    except OSError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return problem(FileState.DAMAGED, f"the file cannot be read: {first}"), 0
    want = copy.facts
    if facts != want:
        return problem(
            FileState.DAMAGED,
            f"size {facts.byte_size} (the catalog says {want.byte_size}), sha256 {facts.sha256[:12]}... "
            f"(the catalog says {want.sha256[:12]}...)",
        ), facts.byte_size
    if reference is not None and reference != want:
        return problem(
            FileState.DIVERGENT,
            f"its catalog row says {want.byte_size} bytes, sha256 {want.sha256[:12]}...; the leader's copy of this "
            f"segment is {reference.byte_size} bytes, sha256 {reference.sha256[:12]}...",
        ), facts.byte_size
    return None, facts.byte_size


def scrub(
    catalog: Catalog,
    info: q.TableInfo,
    sites: set[str] | None,
    pacer: Pacer,
    link_from: Callable[[str], Pacer | None] = no_link,
) -> ScrubResult:
    """Check every copy at ``sites`` (None: all), in site, partition and list order. ``link_from(site)`` is the
    pacer of the link a site's files cross to be read here (None: they cross none, or it has no cap)."""
    copies = segment_copies(catalog, info)
    reference = leader_facts(copies)
    result = ScrubResult()
    by_site: dict[str, list[SegmentCopy]] = defaultdict(list)
    for c in copies:
        if sites is None or c.site in sites:
            by_site[c.site].append(c)
    for site in sorted(by_site):
        link = link_from(site)
        for c in by_site[site]:
            found, nbytes = check_copy(c, pacer, reference.get((c.partition_id, c.segment.segment_id)), link)
            result.files += 1
            result.bytes += nbytes
            result.checks.append(
                FileCheckResult(c.placement_id, c.segment.segment_id, hlc.now_us(), found.detail if found else None)
            )
            if found is not None:
                result.problems.append(found)
    return result
