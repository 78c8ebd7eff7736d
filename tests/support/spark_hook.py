"""Airflow's SparkSubmitHook without Spark, for the jobs a task starts through it
(``segrep_airflow.common.hook_submit``): each submit records the command line the hook built and the
environment it would run it in, then does the distributed copy's work in this process (what each executor
runs: ``copy_one`` per item, the outcomes written where the command says) or, for any other application,
raises :class:`SparkNotRun` (its work needs Spark)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from segrep.storage.atomic import write_json_atomic
from segrep.storage.transport import CopyItem, copy_one


@dataclass(frozen=True)
class HookCall:
    command: list[str]
    env: dict[str, str]
    master: str


class SparkNotRun(Exception):
    """In place of a Spark application whose work this process does not do."""


def capture_hook_submits(monkeypatch: pytest.MonkeyPatch) -> list[HookCall]:
    """Replace ``SparkSubmitHook.submit`` for this test; return the list its calls are appended to."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    calls: list[HookCall] = []

    def submit(self: Any, application: str = "", **_: Any) -> None:
        command = self._build_spark_submit_command(application)  # sets self._env, as before its Popen
        calls.append(HookCall(command, dict(self._env or {}), self._connection["master"]))
        if Path(application).name != "distributed_copy.py":
            raise SparkNotRun(application)
        copy_in_process(self._application_args)

    monkeypatch.setattr(SparkSubmitHook, "submit", submit)
    return calls


def copy_in_process(args: list[str]) -> None:
    """spark_jobs/distributed_copy.py's work without Spark: every item of ``--items`` copied by ``copy_one``,
    the outcomes written to ``--result``."""
    items_file, result_file = args[args.index("--items") + 1], args[args.index("--result") + 1]
    items = [CopyItem.from_doc(raw) for raw in json.loads(Path(items_file).read_text())]
    write_json_atomic(result_file, [asdict(copy_one(item)) for item in items])
