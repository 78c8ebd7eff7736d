"""What a running task tells OpenLineage: the copies of a table it read and wrote, and what it did to them.

The tasks that move data call one function here with the report they already have (:func:`rounds`,
:func:`failover`, :func:`bootstrap`, :func:`split_pass`); ``lineage_facets`` turns it into datasets
``segrep://<site>/<table>`` and segrep's facets.

How it reaches a lineage backend: apache-airflow-providers-openlineage's listener sends a START and a COMPLETE
(or FAIL) event for every task. For the datasets and facets of an operator it asks the operator's
``get_openlineage_facets_on_complete`` (its DefaultExtractor; on a failure too, when the operator has no
``..._on_failure``), after ``execute`` returned or raised. A TaskFlow task's operator has no such method, and
what a round copied is known only when it has run: so the task gives its own operator (the context's
``task``, the object the listener reads) one that returns what the task recorded. The datasets and facets
then arrive on the task's own COMPLETE or FAIL event. (The provider's public ``emit_dataset_lineage`` would
send them on a separate RUNNING event instead.)

Nothing is done when OpenLineage is not configured (the provider is then disabled and has no listener). A
problem here is logged as a warning and never fails the task: lineage must not undo the work it describes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from segrep.catalog import Catalog
    from segrep.failover.promote import FailoverReport
    from segrep.maintenance.bootstrap import BootstrapReport
    from segrep.replication.reports import RoundReport
    from segrep.spark.results import CommitSummary

ON_COMPLETE = "get_openlineage_facets_on_complete"  # the provider's DefaultExtractor asks for it
RECORDED = "_segrep_lineage"  # what this task recorded so far (a task may record several steps)


def active() -> bool:
    """Whether the OpenLineage provider sends events ([openlineage] transport, config_path or
    config_conn_id set, and not ``disabled``)."""
    from airflow.providers.openlineage.conf import is_disabled

    return not is_disabled()


def rounds(catalog: Catalog, reports: Sequence[RoundReport]) -> None:
    """Rounds this task ran (a replication round, a bootstrap's catch-up, a failover's verifying round): the
    leaders' copies read, each target's copy written with what was copied and its safe time; each copy with
    the table's current schema."""
    if reports and active():
        with _recording("rounds"):
            from segrep.catalog.leadership import leadership
            from segrep_airflow.assets import table_schema
            from segrep_airflow.lineage_facets import rounds_lineage

            tables = sorted({r.table for r in reports})
            leaders = {t: list(leadership(catalog, t)[0].leaders) for t in tables}
            _record(rounds_lineage(reports, leaders, {t: table_schema(catalog, t) for t in tables}))


def failover(catalog: Catalog, report: FailoverReport) -> None:
    """A failover or switchover (or its dry-run assessment) and its loss; each copy with its table's current
    schema."""
    if active():
        with _recording("failover"):
            from segrep_airflow.assets import table_schema
            from segrep_airflow.lineage_facets import failover_lineage

            tables = sorted({move.assessment.table for move in report.moves})
            _record(failover_lineage(report, {t: table_schema(catalog, t) for t in tables}))


def bootstrap(catalog: Catalog, report: BootstrapReport) -> None:
    """A bootstrap's decision tree: the site's copy of the table, from the leaders' copies (each with the
    table's current schema)."""
    if active():
        with _recording("bootstrap"):
            from segrep.catalog.leadership import leadership
            from segrep_airflow.assets import table_schema
            from segrep_airflow.lineage_facets import bootstrap_lineage

            leaders = list(leadership(catalog, report.table)[0].leaders)
            _record(bootstrap_lineage(report, leaders, table_schema(catalog, report.table)))


def split_pass(catalog: Catalog, plan: Mapping[str, Any], summary: CommitSummary) -> None:
    """A split pass committed from ``plan`` (``segrep.split.workflow.PassPlan`` as a dict), each copy with the
    table's current schema (the children's files are written at it); nothing when the pass had nothing to
    run."""
    if plan.get("manifest") and active():
        with _recording("split"):
            from segrep.spark.manifest import Manifest
            from segrep_airflow.assets import table_schema
            from segrep_airflow.lineage_facets import split_lineage

            schema = table_schema(catalog, str(plan["table"]))
            _record(split_lineage(plan, Manifest.load(plan["manifest"]), summary, schema))


@contextmanager
def _recording(what: str) -> Iterator[None]:
    try:
        yield
    except Exception as exc:  # lineage never fails the task whose work it describes
        import structlog

        structlog.get_logger("segrep.lineage").warning(f"OpenLineage: the {what} of this task not recorded: {exc}")


def _record(found: Any) -> None:
    """Give the running task's operator the method the provider's listener asks for, returning ``found`` (merged
    with what the task recorded before)."""
    from airflow.sdk import get_current_context

    from segrep_airflow.lineage_facets import merged

    task = get_current_context()["task"]
    earlier = getattr(task, RECORDED, None)
    lineage = found if earlier is None else merged(earlier, found)
    setattr(task, RECORDED, lineage)
    setattr(task, ON_COMPLETE, _returning(lineage))


def _returning(lineage: Any) -> Callable[..., Any]:
    def get_openlineage_facets_on_complete(task_instance: Any = None) -> Any:
        return lineage

    return get_openlineage_facets_on_complete
