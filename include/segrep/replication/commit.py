"""The commit step of a round: record the merge job's results, then checkpoints and safe time, then the report,
then UNLOAD_FINAL for the splits whose children the round carried everywhere (``replication.unload``).

Idempotent: merge outputs have deterministic ids and registering one that is already there is a no-op;
checkpoints and safe time only move forward; the report is rewritten from what the catalog holds. So a step
re-run after a failure (Airflow's "Clear only failed tasks" re-runs a fast-forward and the report, not the
commit) calls :func:`recommit`, which reads the round's state from the catalog as it is now.
"""

from __future__ import annotations

from sqlalchemy import bindparam, select

from segrep.catalog import Catalog
from segrep.catalog import leases as ls
from segrep.catalog import models as m
from segrep.catalog import queries as q
from segrep.config.definitions import Definitions
from segrep.core import faults, hlc
from segrep.core.states import SplitState
from segrep.replication.reports import PlanSummary, RoundReport, RoundStatus, TargetReport, TargetStatus
from segrep.replication.round import round_key, round_row
from segrep.replication.safetime import advance_safe_times
from segrep.replication.unload import finish_unloaded
from segrep.spark.results import CommitSummary, commit_merge_results

NOT_REPORTED = "its fast-forward task did not report (failed or not run)"

# built once (catalog.sql says why)
_TARGETS = select(m.RoundTarget).where(m.RoundTarget.round_id == bindparam("round_id"))
_DOWN = select(m.RoundTarget.site_id).where(
    m.RoundTarget.round_id == bindparam("round_id"), m.RoundTarget.status == str(TargetStatus.DOWN)
)


def commit_round(
    catalog: Catalog, defs: Definitions, table: str, end_us: int, *, merge_ran: bool = True
) -> RoundReport:
    """Record merge results, then checkpoints and safe time, then the round's report; retire the split parents
    that no longer wait. Idempotent."""
    merges = commit_merge_results(catalog, defs, table, end_us) if merge_ran else CommitSummary()
    faults.point("before_checkpoint")
    safe = advance_safe_times(catalog, table, end_us, hold=_down_targets(catalog, table, end_us))
    safe_times = safe.times
    with catalog.write() as s:
        # A finished round has nothing in flight. Leases it still holds were taken by an attempt that crashed
        # and whose retry no longer needed them (the leader changed meanwhile): without this they would
        # linger until they expire. A task of this round run again later simply takes its leases anew.
        ls.drop_leases(s, holder=round_key(table, end_us))
        info = q.table_info(s, table)
        rnd = round_row(s, info.table_id, end_us)
        sites = q.sites_by_id(s)
        rows = s.scalars(_TARGETS, {"round_id": rnd.round_id})
        targets = {sites[t.site_id].name: TargetReport.from_dict({**t.report, "status": t.status}) for t in rows}
        stored = rnd.report or {}
        plan = PlanSummary.from_dict(stored["plan"]) if "plan" in stored else None
        if plan is not None:  # a retried round reports on its last plan's targets only: a site that led
            targets = {t: r for t, r in targets.items() if t in plan.targets}  # meanwhile is not one
            for name in sorted(plan.targets):
                if name not in targets:
                    targets[name] = TargetReport(name, status=TargetStatus.FAILED, error=NOT_REPORTED)
        failed = sorted(t for t, r in targets.items() if r.status in (TargetStatus.FAILED, TargetStatus.DOWN))
        status = RoundStatus.FAILED if failed else RoundStatus.OK
        if not failed and any(r.status != TargetStatus.OK for r in targets.values()):
            status = RoundStatus.PARTIAL
        spark_apps = merges.spark_apps + sum(r.spark_apps for r in targets.values())
        report = RoundReport(rnd.round_id, table, end_us, status, failed, targets, merges, safe_times, spark_apps, plan)
        report.advanced = safe.advanced
        rnd.finished_us = hlc.now_us()
        report.duration_s = round((rnd.finished_us - rnd.started_us) / 1e6, 3)
        rnd.report, rnd.status = report.stored(), status
    # a split parent goes once every replica holds its children (carried there by this round, or an earlier one)
    finished = finish_unloaded(catalog, defs, table)
    report.splits_retired = [done.split_id for done in finished if done.state == SplitState.DONE]
    return report


def recommit(catalog: Catalog, defs: Definitions, table: str, end_us: int, *, merge_ran: bool) -> RoundReport:
    """The round's report as the catalog has it now: ``commit_round`` again (idempotent: merge results are
    registered once, checkpoints and safe time only move forward, the report is rebuilt from the targets' rows),
    so a fast-forward re-run after a failure is counted and its site's safe time advances. A round already
    committed keeps its first commit's merge summary: registering its outputs again finds them present and
    would report "0 committed"."""
    with catalog.read() as s:
        rnd = round_row(s, q.table_info(s, table).table_id, end_us)
        stored = rnd.report or {}
        done = rnd.finished_us is not None and "merges" in stored
        merges = CommitSummary.from_dict(stored["merges"]) if done else None
    report = commit_round(catalog, defs, table, end_us, merge_ran=merge_ran and merges is None)
    if merges is not None and merges.items:
        report.merges = merges
        report.spark_apps = merges.spark_apps + sum(t.spark_apps for t in report.targets.values())
        with catalog.write() as s:
            round_row(s, q.table_info(s, table).table_id, end_us).report = report.stored()
    return report


def _down_targets(catalog: Catalog, table: str, end_us: int) -> frozenset[int]:
    """The sites this round found DOWN/UNIDENTIFIED: their safe time must not move (nothing says the rows
    it would claim are readable there)."""
    with catalog.read() as s:
        rnd = round_row(s, q.table_info(s, table).table_id, end_us)
        return frozenset(s.scalars(_DOWN, {"round_id": rnd.round_id}))
