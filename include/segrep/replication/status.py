"""``segrep status``: how far each replica is behind, per table and target site.

Safe time and lag come from the catalog's safe_times; pending segments and bytes are what the leader would
offer now (its visible chain minus the target's acks); the last round's outcome and its declines by reason
come from the rounds report; back-off and stuck partitions say why a target is not catching up.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import select

from segrep.catalog import Catalog
from segrep.catalog import models as m
from segrep.catalog.snapshot import snapshot
from segrep.core import hlc
from segrep.core.chain import offer_order
from segrep.core.states import Outcome

DECLINES = (Outcome.OVERLOADED, Outcome.INVALID, Outcome.INFLIGHT, Outcome.OUT_OF_ORDER)
HEADER = ["table", "target", "safe time", "lag s", "pending segs", "pending bytes", "last round", "declines", "note"]


def status_rows(catalog: Catalog, table: str | None = None) -> list[dict[str, Any]]:
    now = hlc.now_us()
    out = []
    with catalog.read() as s:
        names = [table] if table else list(s.scalars(select(m.Table.name).order_by(m.Table.name)))
        for name in names:
            snap = snapshot(s, name, active_only=True)
            tid = snap.info.table_id
            safe = {r.site_id: r.safe_time_us for r in s.scalars(select(m.SafeTime).where(m.SafeTime.table_id == tid))}
            backoff = {r.site_id: r for r in s.scalars(select(m.Backoff).where(m.Backoff.table_id == tid))}
            last = s.scalars(
                select(m.Round).where(m.Round.table_id == tid, m.Round.finished_us.is_not(None))
                .order_by(m.Round.interval_end_us.desc()).limit(1)
            ).one_or_none()  # fmt: skip
            pending: Counter[int] = Counter()
            pending_bytes: Counter[int] = Counter()
            joining = snap.joining_site_ids
            for part in snap.partitions:
                chain = part.chain(part.leader)
                for replica in part.replicas:
                    refs = offer_order(chain, part.acked_by(part.leader, replica))
                    pending[replica.site_id] += len(refs)
                    pending_bytes[replica.site_id] += sum(
                        part.segment(part.leader.placement_id, r.segment_id).byte_size for r in refs
                    )
            targets = sorted(snap.replica_site_ids)
            for site_id in targets:
                site = snap.sites[site_id].name
                report = ((last.report or {}).get("targets", {}) if last else {}).get(site, {})
                outcomes = report.get("outcomes") or {}
                declines = {k: v for k, v in outcomes.items() if k in {str(d) for d in DECLINES}}
                notes = []
                if site_id in backoff and backoff[site_id].next_attempt_us > now:
                    notes.append(f"backing off ({backoff[site_id].last_reason})")
                if report.get("needs_major"):
                    notes.append(f"needs a major segment for partitions {report['needs_major']}")
                if site_id in joining:
                    notes.append("joining")
                if site_id in snap.stalled_site_ids:
                    notes.append(f"NEEDS BOOTSTRAP: run segrep bootstrap {name} {site}")
                safe_us = safe.get(site_id)
                out.append(
                    {
                        "table": name,
                        "target": site,
                        "safe_time_us": safe_us,
                        "lag_s": None if safe_us is None else round((now - safe_us) / 1e6, 1),
                        "pending_segments": pending[site_id],
                        "pending_bytes": pending_bytes[site_id],
                        "last_round": None if last is None else f"{hlc.iso(last.interval_end_us)} {last.status}",
                        "last_status": report.get("status"),
                        "declines": declines,
                        "note": "; ".join(notes),
                    }
                )
    return out


def status_table(rows: list[dict[str, Any]]) -> list[list[object]]:
    return [
        [
            r["table"],
            r["target"],
            "-" if r["safe_time_us"] is None else hlc.iso(r["safe_time_us"]),
            "-" if r["lag_s"] is None else r["lag_s"],
            r["pending_segments"],
            r["pending_bytes"],
            r["last_round"] or "-",
            ", ".join(f"{k} {v}" for k, v in sorted(r["declines"].items())) or "-",
            r["note"] or "-",
        ]
        for r in rows
    ]
