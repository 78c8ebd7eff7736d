"""The ``segrep`` console script runs as if pandas were not installed.

pyarrow imports pandas the first time it infers a type or converts to or from numpy (``pa.array`` of a list,
``pa.scalar``, even ``Array.to_numpy()`` of an int64 array), only to recognise pandas objects and pandas' missing
values among the input, and retries on every conversion while the import fails. No command hands pyarrow a
pandas object, and the import costs 0.2-0.3 s of every write, read and publication, a quarter of such a process.
pyarrow works without pandas (it is an optional dependency), and no command uses pandas itself, so the console
script hides it for the whole process. The Python API and Airflow's task processes, which may hold pandas
objects, are unaffected: only :func:`segrep.cli.main.run` calls :func:`hide_pandas`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType


class _HidePandas:
    """A meta path finder that refuses pandas. (Not ``sys.modules["pandas"] = None``: pyarrow's Cython import
    reads ``sys.modules`` first and would take the None for the module.)"""

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("pandas is not used by segrep's commands", name=name)
        return None


def hide_pandas() -> None:
    """From now on ``import pandas`` fails in this process; a no-op if pandas is imported already."""
    if "pandas" not in sys.modules and not any(isinstance(f, _HidePandas) for f in sys.meta_path):
        sys.meta_path.insert(0, _HidePandas())
