"""Driving replication rounds in tests: a ``submit`` that forbids Spark, rounds until idle, leader changes made
directly in the catalog, a site taken down and brought back, and a copier that corrupts bytes in transit."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.replication.orchestrator import run_round
from segrep.replication.reports import RoundReport, RoundStatus, TargetStatus
from segrep.spark.jobs import run_manifest
from segrep.spark.manifest import Manifest
from segrep.storage.atomic import write_json_atomic
from segrep.storage.site import Site
from segrep.storage.transfer import copy_verified
from segrep.storage.transport import CopyItem, CopyOutcome
from tests.support.env import Env
from tests.support.tables import TABLE


def no_spark(*args: Any, **kwargs: Any) -> None:
    pytest.fail(f"Spark was launched although nothing needed it: {args}")


def ok_or_waiting_for_a_merge(report: RoundReport) -> bool:
    """A round that went well: ok, or partial only because a site that wrote locally waits (UNMERGED) for the
    leader to merge its fork, which this round's merge does (its next round takes the merge output)."""
    waiting = [t for t in report.targets.values() if t.status != TargetStatus.OK]
    return report.status == RoundStatus.OK or (
        report.status == RoundStatus.PARTIAL
        and all(
            t.status == TargetStatus.WAITING
            and set(t.outcomes) <= {"UNMERGED", "FAST_FORWARD", "SEGMENT_EXISTS"}
            and t.outcomes.get("UNMERGED")
            for t in waiting
        )
    )


def round_until_idle(env: Env, max_rounds: int = 6, **kwargs: Any) -> list[dict[str, Any]]:
    """Rounds (until now) until one copies nothing and merges nothing; return their reports."""
    reports = []
    for _ in range(max_rounds):
        rep = run_round(env.catalog, env.defs, TABLE, submit=kwargs.pop("submit", no_spark), **kwargs)
        reports.append(rep)
        busy = any(t.segments_copied or t.outcomes for t in rep.targets.values())
        if not busy and not rep.merges.items and rep.status == "ok":
            return reports
    pytest.fail(f"no idle round after {max_rounds}: {[str(r) for r in reports]}")


def set_leader(catalog: Catalog, site: str, table: str = TABLE, partition_ids: Iterable[int] | None = None) -> None:
    """A leader change done directly in the catalog: the placement at ``site`` leads, epoch + 1."""
    wanted = None if partition_ids is None else set(partition_ids)
    with catalog.write() as s:
        site_id = s.scalars(select(m.Site.site_id).where(m.Site.name == site)).one()
        parts = s.scalars(
            select(m.Partition).join(m.Table, m.Table.table_id == m.Partition.table_id).where(m.Table.name == table)
        ).all()
        for part in parts:
            if wanted is not None and part.partition_id not in wanted:
                continue
            pl = s.scalars(
                select(m.Placement).where(
                    m.Placement.partition_id == part.partition_id,
                    m.Placement.site_id == site_id,
                    m.Placement.removed_us.is_(None),
                )
            ).one()
            if part.leader_placement_id != pl.placement_id:
                part.leader_placement_id = pl.placement_id
                part.epoch += 1


def take_down(env: Env, site: str) -> Path:
    """Replace the site's directory by a regular file: every write there fails with an OSError."""
    d = env.site_dir(site)
    d.mkdir(parents=True, exist_ok=True)  # a site nothing was copied to yet has no directory
    aside = d.with_name(f"{site}.away")
    d.rename(aside)
    d.write_text("down for maintenance\n")
    return aside


def bring_up(env: Env, site: str, aside: Path) -> None:
    env.site_dir(site).unlink()
    aside.rename(env.site_dir(site))


class FlippingInput:
    """A readable stream that flips one byte of what it passes on (a bit error on the wire)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.offset = 0

    def __enter__(self) -> FlippingInput:
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.close()

    def read(self, n: int = -1) -> bytes:
        chunk = self.inner.read(n)
        if chunk and self.offset <= 100 < self.offset + len(chunk):
            data = bytearray(chunk)
            data[100 - self.offset] ^= 0x01
            chunk = bytes(data)
        self.offset += len(chunk)
        return chunk


class FlippingFS:
    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def open_input_stream(self, path: str) -> FlippingInput:
        return FlippingInput(self.fs.open_input_stream(path))


def corrupting_copier(items: list[CopyItem]) -> list[CopyOutcome]:
    """The real verified copy, reading the source through a link that flips a byte."""
    out = []
    for item in items:
        source = Site(item.source, item.source_uri)
        source.fs = FlippingFS(source.fs)  # type: ignore[assignment]
        try:
            copy_verified(source, Site(item.target, item.target_uri), item.relpath, item.byte_size, item.sha256)
        except Exception as exc:  # the verification failure is the point
            out.append(CopyOutcome(item.relpath, False, invalid=str(exc)))
        else:
            out.append(CopyOutcome(item.relpath, True))
    return out


def inprocess_submit(spark: Any, calls: list[str]) -> Any:
    """A ``submit`` that runs the merge job in this process's SparkSession (no spark-submit start-up)."""

    def submit(app: str, args: Sequence[str], *, name: str, master: str | None = None) -> None:
        assert app == "merge", app
        calls.append(name)
        manifest, result = args[args.index("--manifest") + 1], args[args.index("--result") + 1]
        write_json_atomic(result, run_manifest(spark, Manifest.load(manifest)))

    return submit
