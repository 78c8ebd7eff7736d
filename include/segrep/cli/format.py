"""Every formatter for people: aligned tables, round reports, replication status, split progress.

The workflows return typed records; this module alone decides how they read in a terminal (and in the task
logs of the DAGs, which print the same text).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from segrep.catalog.leadership import Leadership
from segrep.core import hlc
from segrep.failover.assess import PartitionLoss
from segrep.failover.promote import FailoverReport
from segrep.maintenance.repair import RepairReport
from segrep.maintenance.verify import RowCheck, Verdict, VerifyReport
from segrep.replication.reports import invalid_advice
from segrep.replication.status import TargetState
from segrep.split.progress import SplitProgress

STATUS_HEADER = [
    "table",
    "target",
    "safe time",
    "lag s",
    "pending segs",
    "pending bytes",
    "last round",
    "declines",
    "last verified",
    "note",
]


def format_rows(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned table (no borders) that reads well in a terminal and in a README."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


class Whole(str):
    """A cell ``format_rows`` never shortens: a note that says what to run must be readable to its end."""


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    text = str(value)
    return text if len(text) <= 48 or isinstance(value, Whole) else text[:45] + "..."


def status_note(state: TargetState) -> str:
    """Why a target is not catching up, and what to run about it ("" when nothing stands in its way)."""
    notes = []
    if state.invalid:
        files = ", ".join(f"segment {bad.segment_id} ({bad.path})" for bad in state.invalid)
        notes.append(f"INVALID copy of {files}: {invalid_advice(state.table, state.target, state.invalid)}")
    elif state.backing_off is not None and state.backing_off.startswith("INVALID"):
        retry = f"segrep round {state.table} --target {state.target} --reoffer"
        notes.append(f"a copy failed verification: run `{retry}` to copy again now")
    if state.backing_off is not None:
        notes.append(f"backing off ({state.backing_off})")
    for hold in state.leases:
        notes.append(hold.describe())
    if state.waited and not state.leases:  # the leases it waited for have lapsed or been let go since
        notes.append(f"last round {state.waited}")
    checked = state.last_verified
    if checked is not None and checked.differences:
        notes.append(
            f"verify at {hlc.iso(checked.finished_us)} found {checked.differences} difference(s): "
            f"run segrep repair {state.table} --site {state.target}"
        )
    for site, n in state.unmerged.items():  # outside this target's safe time until the leader merges them
        notes.append(f"unmerged at {site}: {n} segments")
    if state.needs_major:
        notes.append(f"needs a major segment for partitions {state.needs_major}")
    if state.joining:
        notes.append("joining")
    if state.needs_bootstrap:
        notes.append(f"NEEDS BOOTSTRAP: run segrep bootstrap {state.table} {state.target}")
    return "; ".join(notes)


def last_verified(state: TargetState) -> str | None:
    """When this site was last verified, and what was found (``equal``, or the number of differences)."""
    v = state.last_verified
    if v is None:
        return None
    return f"{hlc.iso(v.finished_us)} {v.differences} diff" if v.differences else f"{hlc.iso(v.finished_us)} equal"


def last_round(state: TargetState) -> str | None:
    if state.last_round_end_us is None:
        return None
    return f"{hlc.iso(state.last_round_end_us)} {state.last_round_status}"


def status_table(rows: Sequence[TargetState]) -> list[list[object]]:
    return [
        [
            r.table,
            r.target,
            "-" if r.safe_time_us is None else hlc.iso(r.safe_time_us),
            "-" if r.lag_s is None else r.lag_s,
            r.pending_segments,
            r.pending_bytes,
            last_round(r) or "-",
            ", ".join(f"{k} {v}" for k, v in sorted(r.declines.items())) or "-",
            last_verified(r) or "-",
            Whole(status_note(r) or "-"),
        ]
        for r in rows
    ]


def format_progress(rows: Sequence[SplitProgress]) -> str:
    lines = []
    for r in rows:
        mode = "async" if r.is_async else "sync"
        lines.append(
            f"split {r.split_id} of {r.table} partition {r.parent_partition_id} at {r.split_keys} "
            f"({mode}): {r.state}, parent {r.parent_state}, pushing from {', '.join(r.sources) or '-'}"
        )
        for c in r.children:
            lo, hi = c.begin_key, c.end_key
            lines.append(
                f"  child {c.partition_id} [{'-inf' if lo is None else lo}, {'+inf' if hi is None else hi}) "
                f"{c.state} at {c.site}: {c.acked} segment(s) acked, {c.lacking} lacking"
            )
        if r.replicas_behind:
            waits = ", ".join(f"{where} lacks {n}" for where, n in sorted(r.replicas_behind.items()))
            lines.append(f"  the parent is retired once rounds carry the children to their replicas ({waits})")
    return "\n".join(lines)


def _keys(label: str, found: Sequence[object], total: int | None = None) -> str:
    shown = ", ".join(str(k) for k in found)
    more = f" (and {total - len(found)} more)" if total is not None and total > len(found) else ""
    return f"{label}: {shown}{more}"


def format_row_check(r: RowCheck) -> list[str]:
    """A replica placement compared with its leader: nothing when equal, else what differs, key by key."""
    pin = "-" if r.as_of_us is None else hlc.iso(r.as_of_us)
    head = f"  partition {r.partition_id} at {r.site} (leader {r.leader_site}, as of {pin}): {r.verdict.upper()}"
    if r.verdict == Verdict.EQUAL:
        return []
    if r.verdict != Verdict.DIFFERENT:
        return [f"{head}: {r.detail}"]
    lines = [f"{head}: {r.differences} key(s) differ"]
    for label, found in (
        (f"only at the leader {r.leader_site}", r.only_at_leader),
        (f"only at {r.site}", r.only_at_replica),
        ("different", r.different),
    ):
        if found:
            lines.append(f"    {_keys(label, found)}")
    return lines


def format_verify(report: VerifyReport) -> str:
    """What ``segrep verify`` found: each difference by partition, site and key, each bad file by path."""
    verdict = f"{report.differences} difference(s)" if report.differences else "all equal"
    lines = [f"verify of {report.table} at {', '.join(report.sites) or 'no replica'}: {verdict}"]
    equal = sum(1 for r in report.rows if r.verdict == Verdict.EQUAL)
    spark = sum(1 for r in report.rows if r.on_spark)
    on_spark = f" ({spark} digested on Spark, one application)" if spark else ""
    lines.append(f"  rows: {equal} of {len(report.rows)} replica partition(s) equal to their leader{on_spark}")
    for r in report.rows:
        lines += format_row_check(r)
    if report.files_checked:
        lines.append(f"  files: {report.scrub.files} checked, {report.scrub.bytes:,} bytes, {len(report.files)} bad")
        for f in report.files:
            whose = "the leader's copy" if f.is_leader else "a replica's copy"
            lines.append(
                f"    {f.state.upper()}: {f.path} at {f.site} (segment {f.segment_id} of partition {f.partition_id}, "
                f"{whose}): {f.detail}"
            )
    if report.differences:
        lines.append(f"  to do: segrep repair {report.table} (or --dry-run first to see what it would do)")
    return "\n".join(lines)


def format_repair(report: RepairReport) -> str:
    """What ``segrep repair`` did (or would do): files fetched again, LOST segments, replicas re-bootstrapped."""
    verb = "would " if report.dry_run else ""
    lines = [f"repair of {report.table}{' (dry run: nothing changed)' if report.dry_run else ''}:"]
    for x in report.leader:
        if not x.relinks:
            lines.append(
                f"  LEADER LACKS {x.describe()}: a fork of the leader's chain; rounds push it to the leader, "
                "which merges it (nothing is discarded)"
            )
        elif x.source is None:
            lines.append(f"  LEADER LACKS {x.describe()}: no intact copy to fetch; nothing is discarded")
        elif not x.fetched:
            lines.append(f"  LEADER LACKS {x.describe()}: not fetched (its leader is not at the --site given)")
        else:
            done = "would fetch it to the leader" if report.dry_run else "fetched to the leader"
            lines.append(f"  LEADER LACKS {x.describe()}: {done} from {x.source}, on its chain again")
    for f in report.files:
        p = f.problem
        fixed = "; its catalog row set back to the leader's" if f.catalog_fixed else ""
        lines.append(
            f"  {verb}fetch {p.path} at {p.site} ({p.state}) again from {f.source}{fixed}"
            if report.dry_run
            else f"  fetched {p.path} at {p.site} ({p.state}) again from {f.source}{fixed}"
        )
    for lost in report.lost:
        lines.append(
            f"  LOST: segment {lost.segment_id} of partition {lost.partition_id} ({lost.row_count} row(s), "
            f"{lost.deleted_rows} tombstone(s), versions {lost.min_version}..{lost.max_version}): no intact copy at "
            f"any site; bad at {', '.join(lost.sites)}; nothing was deleted"
        )
    for r in report.rebootstraps:
        lines.append(
            f"  {verb}re-bootstrap partition {r.partition_id} at {r.site}: {r.differences} key(s) differ from the "
            "leader with every file intact"
        )
        lines += format_row_check(r)[1:]
    for r in report.unmended:
        lines.append(f"  not mended: partition {r.partition_id} at {r.site}: {r.detail}")
    for r in report.held_back:
        lines.append(
            f"  not re-bootstrapped: partition {r.partition_id} at {r.site} holds segments the leader lacks "
            f"({r.differences} key(s) differ); rounds push them to the leader first"
        )
    if not (report.files or report.lost or report.rebootstraps or report.unmended or report.leader or report.held_back):
        lines.append("  nothing to repair")
    if report.after is not None:
        lines.append(format_verify(report.after))
    return "\n".join(lines)


def _versions(lo: int | None, hi: int | None) -> str:
    return "-" if lo is None or hi is None else f"versions {hlc.iso(lo)} .. {hlc.iso(hi)}"


def _loss_line(x: PartitionLoss) -> str:
    rows = f"at most {x.rows:,} rows" if x.rows_at_most else f"{x.rows:,} rows"
    return f"{x.segments} segment(s), {rows}, {x.bytes:,} bytes, {_versions(x.min_version, x.max_version)}"


def format_failover(report: FailoverReport) -> str:
    """What a failover or switchover did (or, dry run, would do): per table the site chosen and why, every
    candidate, and the loss (the RPO) partition by partition, exact from the catalog."""
    lines = []
    for move in report.moves:
        a = move.assessment
        head = f"{report.kind} of {a.table}: {a.from_site} -> {a.to_site}, at {report.cut}"
        if report.dry_run:
            head += " (dry run: nothing changed)"
        else:
            head += f": {move.partitions_moved} partition(s) moved, epochs raised (failover id {move.failover_id})"
        lines.append(head)
        lines.append(f"  why {a.to_site}: {a.reason}")
        for c in a.candidates:
            verdict = "can lead" if c.eligible else f"cannot lead: {c.why_not}"
            lines.append(f"  candidate {c.site}: holds {c.rows_held:,} rows, lacks {c.rows_lacking:,} ({verdict})")
        if not a.loss:
            lines.append(f"  loss: none ({a.to_site} holds every segment of the leaders' chains)")
            continue
        total = PartitionLoss(
            0,
            a.segments_lost,
            a.rows_lost,
            a.bytes_lost,
            min(x.min_version for x in a.loss if x.min_version is not None),
            max(x.max_version for x in a.loss if x.max_version is not None),
            rows_at_most=any(x.rows_at_most for x in a.loss),
        )
        lines.append(f"  loss ({'would be ' if report.dry_run else ''}given up): {_loss_line(total)}")
        lines += [f"    partition {x.partition_id}: {_loss_line(x)}" for x in a.loss]
        if move.on_return == "rollback":
            fate = "set aside in the rollback area of each site holding them, when it returns"
            fate += " (after a cut, whatever the table's policy)" if report.cut_us is not None else ""
        else:
            fate = f"pushed to {a.to_site} and merged (last writer wins) when the sites holding them return"
        lines.append(f"  on return ({move.on_return}): these rows {'would be ' if report.dry_run else 'are '}{fate}")
        if total.rows_at_most:
            lines.append(
                f"  (at most: a lost major or merge output folds segments {a.to_site} holds already; their rows in "
                "it are counted, though not lost)"
            )
    if report.cut_us is not None:
        lines.append(f"cut at {hlc.iso(report.cut_us)} (the smallest safe time of these tables at {report.to_site})")
        for cut in report.cuts:
            if report.dry_run:
                lines.append(
                    f"  {cut.table}: {cut.partitions_cut} partition(s) would be folded as of the cut, "
                    f"{cut.rows_set_aside:,} newer row(s) set aside at {report.to_site}"
                )
            else:
                where = ", ".join(cut.rollback_files) or "-"
                lines.append(
                    f"  {cut.table}: {cut.partitions_cut} partition(s) folded as of the cut, {cut.rows_set_aside:,} "
                    f"newer row(s) set aside ({where})"
                )
            lines += [
                f"    partition {p.partition_id}: {p.rows:,} row(s) from {len(p.segment_ids)} segment(s)"
                for p in cut.partitions
            ]
    return "\n".join(lines)


def format_leadership(rows: Sequence[Leadership]) -> str:
    """One line per table: its leader site(s), epochs, a switchover's pause, and the last leader move."""
    lines = []
    for r in rows:
        leads = ", ".join(f"{site} ({n} partition{'s' if n != 1 else ''})" for site, n in sorted(r.leaders.items()))
        epochs = f"epoch {r.max_epoch}" if r.min_epoch == r.max_epoch else f"epochs {r.min_epoch}-{r.max_epoch}"
        line = f"{r.table}: leader {leads or '-'}, {epochs}"
        if r.paused_since_us is not None:
            line += f"; SWITCHING OVER: writes paused since {hlc.iso(r.paused_since_us)}"
        if r.last_move is not None:
            mv = r.last_move
            line += (
                f"; last {mv.kind} {hlc.iso(mv.done_us)} {mv.from_site} -> {mv.to_site} at {mv.cut}, "
                f"given up {mv.segments_lost} segment(s), {mv.rows_lost:,} rows (on return: {mv.on_return})"
            )
        lines.append(line)
    return "\n".join(lines)
