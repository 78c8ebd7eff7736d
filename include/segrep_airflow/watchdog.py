"""The RPO watchdog DAG's task and its alert hook.

The task (:func:`check`) reads every replica's lag from segrep's catalog (``segrep.replication.rpo_check``,
measured from now) and fails, naming each table and site past its objective, with its lag, objective and why,
when any is. It does not depend on the replication DAGs: it runs on its own schedule and reads only the
catalog, so a paused replication DAG, failing runs or a never-replicated replica make it fail.

The alert hook (:func:`alert`, the task's ``on_failure_callback``) calls the callables named by
:data:`ALERT_ENV` in the task's environment, or else the Airflow Variable :data:`ALERT_VARIABLE`: dotted paths
``package.module:name`` (or ``package.module.name``), comma-separated, each an Airflow callback taking the
task's context (a function, or a notifier instance such as ``SlackNotifier(...)`` or ``SmtpNotifier(...)``:
docs/airflow.md shows both). The context's ``exception`` is :class:`~segrep.replication.rpo_check.RpoBreached`:
its message lists the breaches, its ``breaches`` keep them as records. Nothing names a provider here, so
neither Slack's nor SMTP's is required. The paths are resolved when the task runs, before it checks: a path
that does not import fails the run naming it, rather than an alert silently lost.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

ALERT_ENV = "SEGREP_ALERT_CALLBACK"
ALERT_VARIABLE = "segrep_alert_callback"

Callback = Callable[[Any], Any]


class AlertHookError(Exception):
    """The alert hook names something that is not an importable callable."""


def alert_paths(env: dict[str, str] | None = None, variable: str | None = None) -> tuple[str, list[str]]:
    """Where the hook is set (the environment variable, else the Airflow Variable) and its dotted paths."""
    environ = os.environ if env is None else env
    raw = environ.get(ALERT_ENV, "").strip()
    where = ALERT_ENV
    if not raw:
        raw = (variable if variable is not None else _variable()).strip()
        where = f"Airflow Variable {ALERT_VARIABLE}"
    return where, [p.strip() for p in raw.split(",") if p.strip()]


def _variable() -> str:
    from airflow.sdk import Variable

    value = Variable.get(ALERT_VARIABLE, default=None)
    return "" if value is None else str(value)


def resolve(path: str, where: str = ALERT_ENV) -> Callback:
    """The callable a dotted path names: ``package.module:attribute`` or ``package.module.attribute``."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise AlertHookError(f"{where}: {path!r} is not a dotted path like mypkg.alerts:notify")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AlertHookError(f"{where}: {path!r}: module {module_name!r} cannot be imported ({exc})") from exc
    target = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise AlertHookError(f"{where}: {path!r}: {module_name} has no {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise AlertHookError(f"{where}: {path!r} is not callable")
    return target


def alert_callbacks() -> list[Callback]:
    """The hook's callables (none when it is not set); raises :class:`AlertHookError` naming a bad path."""
    where, paths = alert_paths()
    return [resolve(p, where) for p in paths]


def alert(context: Any) -> None:
    """The watchdog task's ``on_failure_callback``: call every callable of the hook with the task's context.
    One that fails is logged and the others still run."""
    import structlog

    log = structlog.get_logger("segrep.watchdog")
    where, paths = alert_paths()
    if not paths:
        log.warning(f"no alert hook: set {ALERT_ENV} or the Airflow Variable {ALERT_VARIABLE} (docs/airflow.md)")
        return
    for path in paths:
        try:
            resolve(path, where)(context)
        except Exception:
            log.exception(f"the alert hook {path} ({where}) failed")


def check() -> dict[str, Any]:
    """The watchdog task: the alert hook must resolve, then every replica is checked against its objective;
    raises :class:`~segrep.replication.rpo_check.RpoBreached` when any is past it."""
    import structlog

    from segrep.replication.rpo_check import check_rpo
    from segrep_airflow.common import segrep_context

    log = structlog.get_logger("segrep.watchdog")
    hooks = alert_callbacks()  # a bad path fails the run now, not silently when an alert is due
    with segrep_context() as (defs, catalog):
        objectives = {name: t.policy.rpo_s for name, t in defs.tables.items()}
        result = check_rpo(catalog, objectives)
    for line in result.lines():
        log.info(line)
    if defs.table_errors:
        log.warning(f"not checked (invalid in the definitions): {', '.join(sorted(defs.table_errors))}")
    if not hooks:
        log.warning(f"no alert hook: set {ALERT_ENV} or the Airflow Variable {ALERT_VARIABLE} (docs/airflow.md)")
    result.raise_on_breach()
    return result.to_dict()
