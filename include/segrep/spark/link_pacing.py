"""A merge's reads across capped links (DESIGN section 17): a merge reads the segments pushed from other sites
where they are (``FileRef.site``) and writes at the leader, so each input of another site crosses the link
from it to the leader. The submitting process holds a slot per such link while the job runs (``LinkPacing``,
the round's class) and gives each input its share over that link's inputs (``FileRef.bytes_per_s``), which the
reader pays before it reads the file (``storage.pacing.pay_ahead``), on an executor as in process.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from segrep.catalog.link_lease import LinkPacing
from segrep.spark.manifest import FileRef, Manifest, MergeItem


def crossing(manifest: Manifest) -> Counter[tuple[str, str]]:
    """How many of the manifest's inputs cross each (source site, leader site) link."""
    return Counter(
        (ref.site, item.leader_site) for item in manifest.items for ref in _inputs(item) if _remote(ref, item)
    )


@contextmanager
def paced_merge(manifest_path: str | os.PathLike[str], pacing: LinkPacing) -> Iterator[Manifest]:
    """The manifest at ``manifest_path`` rewritten with each remote input's share of its link and the rate file
    that follows it, the slots held until the block ends (the job runs inside it). A manifest crossing no
    defined link is left as it is."""
    manifest = Manifest.load(manifest_path)
    path = rates_path(manifest_path)
    with pacing.shares(crossing(manifest), path) as rates:
        if rates:

            def paced(ref: FileRef, item: MergeItem) -> FileRef:
                link = (ref.site, item.leader_site)
                if not _remote(ref, item) or link not in rates:
                    return replace(ref, bytes_per_s=None, rate_file=None, reader_site=None)
                return replace(ref, bytes_per_s=rates[link], rate_file=str(path), reader_site=item.leader_site)

            items = [
                replace(
                    item,
                    visible=[paced(r, item) for r in item.visible],
                    incoming=[paced(r, item) for r in item.incoming],
                )
                for item in manifest.items
            ]
            manifest = replace(manifest, items=items)
            manifest.write(manifest_path)
        yield manifest


def rates_path(manifest_path: str | os.PathLike[str]) -> Path:
    """The rate file of a manifest's merge: beside it, in the work directory the job's files are in."""
    manifest = Path(manifest_path)
    return manifest.with_name(f"{manifest.stem}-link-rates.json")


def _inputs(item: MergeItem) -> list[FileRef]:
    return [*item.visible, *item.incoming]


def _remote(ref: FileRef, item: MergeItem) -> bool:
    return ref.site != item.leader_site
