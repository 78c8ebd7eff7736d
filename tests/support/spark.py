"""Spark in tests: a ``submit`` that runs the merge or verify job in the session's SparkSession (the ``spark``
fixture of tests/conftest.py) instead of launching spark-submit, and the merge engine pinned for a while
(small merges otherwise run in process: ``spark.merge_runner``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

from segrep.core import faults
from segrep.core.errors import SegrepError
from segrep.spark.digest_job import run_digests
from segrep.spark.digest_manifest import DigestManifest, write_outcomes
from segrep.spark.jobs import run_manifest
from segrep.spark.manifest import Manifest
from segrep.spark.merge_runner import ENGINE_ENV
from segrep.storage.atomic import write_json_atomic


def spark_submit_in(spark: Any) -> Any:
    """``submit`` running the merge or verify job in this SparkSession; a failing job is a SegrepError, as with
    spark-submit, except the injected crash, which propagates as itself."""

    def submit(app: str, args: Sequence[str], *, name: str, master: str | None = None) -> None:
        assert app in ("merge", "verify"), app
        manifest, result = args[args.index("--manifest") + 1], args[args.index("--result") + 1]
        try:
            if app == "verify":
                digests = DigestManifest.load(manifest)
                write_outcomes(result, digests.key, run_digests(spark, digests))
                return
            doc = run_manifest(spark, Manifest.load(manifest))
        except faults.InjectedFault:
            raise
        except Exception as exc:
            raise SegrepError(f"Spark job {app} failed: {type(exc).__name__}: {str(exc)[:200]}") from None
        write_json_atomic(result, doc)

    return submit


@contextlib.contextmanager
def merge_engine(engine: str) -> Iterator[None]:
    """Every merge manifest inside runs on ``engine`` (``spark``, ``in_process`` or ``auto``)."""
    before = os.environ.get(ENGINE_ENV)
    os.environ[ENGINE_ENV] = engine
    try:
        yield
    finally:
        if before is None:
            del os.environ[ENGINE_ENV]
        else:
            os.environ[ENGINE_ENV] = before
