"""segrep: segment-based replication of partitioned analytical tables between sites.

The public API is what ``__all__`` lists; everything else is reachable through the layer sub-packages
(``segrep.core``, ``segrep.catalog``, ``segrep.replication``, ...; see docs/architecture.md). Names load on
first use, so ``import segrep`` stays cheap for Spark executors and the CLI, which need only a few of them.

Never imports Airflow: DAGs, plugins and Spark jobs depend on this package, not the reverse.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "Catalog": "segrep.catalog.engine",
    "Definitions": "segrep.config.definitions",
    "load_definitions": "segrep.config.definitions",
    "apply_definitions": "segrep.catalog.apply",
    "upgrade": "segrep.catalog.migrate",
    "write_batch": "segrep.replication.publication",  # the write, then the Iceberg publication (if the policy asks)
    "read_table": "segrep.data.reader",
    "run_round": "segrep.replication.orchestrator",
    "RoundReport": "segrep.replication.reports",
    "status_rows": "segrep.replication.status",
    "TargetState": "segrep.replication.status",
    "run_split": "segrep.split.run",
    "bootstrap": "segrep.maintenance.bootstrap",
    "compact": "segrep.maintenance.compaction",
    "collect": "segrep.maintenance.gc",
    "SegrepError": "segrep.core.errors",
}

__all__ = [
    "Catalog",
    "Definitions",
    "RoundReport",
    "SegrepError",
    "TargetState",
    "__version__",
    "apply_definitions",
    "bootstrap",
    "collect",
    "compact",
    "load_definitions",
    "read_table",
    "run_round",
    "run_split",
    "status_rows",
    "upgrade",
    "write_batch",
]

if TYPE_CHECKING:
    from segrep.catalog.apply import apply_definitions
    from segrep.catalog.engine import Catalog
    from segrep.catalog.migrate import upgrade
    from segrep.config.definitions import Definitions, load_definitions
    from segrep.core.errors import SegrepError
    from segrep.data.reader import read_table
    from segrep.maintenance.bootstrap import bootstrap
    from segrep.maintenance.compaction import compact
    from segrep.maintenance.gc import collect
    from segrep.replication.orchestrator import run_round
    from segrep.replication.publication import write_batch
    from segrep.replication.reports import RoundReport
    from segrep.replication.status import TargetState, status_rows
    from segrep.split.run import run_split


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'segrep' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
