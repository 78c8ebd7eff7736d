"""The trigger form of a running DAG: the values a task works with, after refusing keys the form does not have.

Airflow validates each Param of a trigger's conf against its own schema, but a key that is not a Param is not
refused: the trigger API (``SerializedParamsDict.deep_merge``) adds it as a Param without a schema. A
misspelled ``gc_dryrun: true`` would then be ignored and a real GC would run. So the first task of every DAG
(and any task that does work whatever its upstream did) calls :func:`form`, which fails the task, before it
does anything, naming the unknown keys and the form's own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from segrep.core.errors import SegrepError


class FormError(SegrepError):
    """A DAG run's conf that the DAG's form does not accept."""


def check_conf(conf: Mapping[str, Any] | None, known: Iterable[str]) -> None:
    """Raise FormError if ``conf`` (a run's conf) has a key that is not one of the form's ``known`` keys."""
    form_keys = sorted(known)
    unknown = sorted(set(conf or {}) - set(form_keys), key=str)
    if unknown:
        raise FormError(
            f"unknown form key(s) {', '.join(map(repr, unknown))} in the run's conf; the form's keys are: "
            f"{', '.join(form_keys) or 'none'} (nothing was done)"
        )


def form() -> dict[str, Any]:
    """The running task's form values (its DAG's Params, as the trigger set them); FormError if the run's conf
    has a key that is not a Param of the DAG."""
    from airflow.sdk import get_current_context

    context = get_current_context()
    known = list(context["dag"].params)
    check_conf(context["dag_run"].conf, known)
    params = context["params"]
    return {key: params[key] for key in known}


def key_schema(dtype: pa.DataType) -> dict[str, Any]:
    """The JSON schema of one key of type ``dtype`` in a form (a split key): the form refuses a value of the
    wrong JSON type or out of the type's range; the task then converts it strictly (``keys.from_user``)."""
    if pa.types.is_boolean(dtype):
        return {"type": "boolean"}
    if pa.types.is_integer(dtype):
        info = np.iinfo(dtype.to_pandas_dtype())
        return {"type": "integer", "minimum": int(info.min), "maximum": int(info.max)}
    if pa.types.is_floating(dtype):
        return {"type": "number"}
    if pa.types.is_decimal(dtype):
        return {"type": ["number", "string"], "pattern": r"^[+-]?(\d+(\.\d*)?|\.\d+)$"}
    if pa.types.is_date(dtype):
        return {"type": "string", "format": "date"}
    if pa.types.is_binary(dtype):
        return {"type": "string", "pattern": "^([0-9a-fA-F]{2})*$"}
    return {"type": "string"}  # strings, and timestamps as ISO-8601 text (checked by the task)


def flag(default: bool, description: str) -> Any:
    """A yes/no Param that the form shows as a plain switch, not as a required field.

    Airflow's trigger form marks every Param whose schema ``type`` lacks ``"null"`` as required, and a
    switch cannot be empty anyway, so the schema is ``{"enum": [true, false]}`` without a ``type``: the form
    still draws a switch (from the default's type), and the server still refuses anything but true or false
    (``1``, ``"yes"``, ``null``), since JSON-schema's ``enum`` tells booleans from numbers."""
    from airflow.sdk import Param

    return Param(default, enum=[True, False], description=description)


def every_or_one(choices: list[str], *, every: str, description: str) -> Any:
    """An optional choice among ``choices`` where null means "all of them", shown with the label ``every``
    instead of a literal "null" (``values_display``, which the form reads for the null entry too)."""
    from airflow.sdk import Param

    return Param(
        None,
        type=["null", "string"],
        enum=[None, *choices],
        values_display={"null": every, **{c: c for c in choices}},
        description=description,
    )


DURATION_PATTERN = r"^\s*\d{1,12}\s*[smhdw]?\s*$"  # what segrep.config.policy.parse_duration_s reads


def duration(default: str, description: str) -> Any:
    """A duration Param (``30s``, ``15m``, ``12h``, ``7d``, ``2w`` or plain seconds): the form refuses other
    text before a run exists; the task still parses it strictly (range included)."""
    from airflow.sdk import Param

    return Param(default, type="string", pattern=DURATION_PATTERN, description=description)
