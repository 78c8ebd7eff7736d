"""The Spark side: manifests and work items, the job functions, launching spark-submit, recording results;
and ``write_dataframe`` (a DataFrame written into a table: ``spark.dataframe_writer``), loaded on first use so
that importing a job module on an executor does not load the writer."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from segrep.spark.dataframe_writer import write_dataframe

__all__ = ["write_dataframe"]


def __getattr__(name: str) -> Any:
    if name == "write_dataframe":
        return importlib.import_module("segrep.spark.dataframe_writer").write_dataframe
    raise AttributeError(f"module 'segrep.spark' has no attribute {name!r}")
