"""Key values as JSON for the catalog and segment metadata, back to the column's type, and from users.

Partition bounds and segment key ranges are stored as JSON; dates, decimals and timestamps travel as ISO
strings and are restored by casting to the key column's Arrow type. A key a user gives (a CLI string, a YAML or
JSON value) goes through :func:`from_user`, which is strict where Arrow's casts are lenient: a key that
silently became another value (``True`` as 1, ``2.5`` as 2, NaN, a value out of range) would route rows to
the wrong partition or never compare equal.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import numbers
import re
from typing import Any

import numpy as np
import pyarrow as pa

from segrep.core.errors import SegrepError

_INT_RE = re.compile(r"[+-]?[0-9]{1,40}")
_BOOLS = {"true": True, "false": False}


def encode(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    return value


def decode(value: Any, dtype: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_binary(dtype):
        return bytes.fromhex(value)
    # the common key types need no Arrow round trip (a reader and a publication decode every segment's bounds)
    if type(value) is int and pa.types.is_integer(dtype):
        return value
    if type(value) is str and (pa.types.is_string(dtype) or pa.types.is_large_string(dtype)):
        return value
    return pa.array([value]).cast(dtype).to_pylist()[0]


def from_user(value: Any, dtype: pa.DataType, what: str) -> Any:
    """One key value given by a user, converted to ``dtype`` without loss, as the Python value Arrow returns
    for that type; raise SegrepError naming ``what``, the value and the type otherwise.

    Refused: null; bool for anything but a bool key; a float with a fraction, NaN or infinity for an integer
    key; NaN or infinity for a float key; a value outside the type's range or precision; a string that does not
    parse as the type. Strings parse as the type (CLI arguments are strings); dates and times are ISO-8601, a
    date-time without a zone is UTC; binary keys are bytes or hex.
    """
    try:
        return _as_arrow_returns(_convert(value, dtype), dtype)
    except _Refused as exc:
        reason = str(exc)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    raise SegrepError(f"{what} {_show(value)} is not a valid {_type_name(dtype)} key: {reason}")


def _as_arrow_returns(converted: Any, dtype: pa.DataType) -> Any:
    """The Python value Arrow gives back for ``converted`` stored as ``dtype``. An integer (``_to_int`` checked its
    range) and a string (once it encodes as UTF-8) come back as they are, without Arrow's conversion of a Python
    value: pyarrow imports pandas on its first one (0.2 s), and every process that reads the definitions (Airflow's
    DAG parsing and tasks, the operator page, the Python API) checks their split points."""
    if isinstance(converted, int) and pa.types.is_integer(dtype):
        return converted
    if isinstance(converted, str) and _is_string(dtype):
        converted.encode("utf-8")  # a lone surrogate: the UnicodeEncodeError Arrow would raise
        return converted
    return pa.scalar(converted, type=dtype).as_py()


def _is_string(dtype: pa.DataType) -> bool:
    return bool(pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or pa.types.is_string_view(dtype))


class _Refused(Exception):
    """Why a user's value is not a key of the type (internal to from_user)."""


def _convert(value: Any, dtype: pa.DataType) -> Any:
    if value is None:
        raise _Refused("a key cannot be null")
    if pa.types.is_boolean(dtype):
        return _to_bool(value)
    if isinstance(value, bool | np.bool_):
        raise _Refused("true/false is not a value of this type")
    if pa.types.is_integer(dtype):
        return _to_int(value, dtype)
    if pa.types.is_floating(dtype):
        return _to_float(value, dtype)
    if pa.types.is_decimal(dtype):
        return _to_decimal(value, dtype)
    if _is_string(dtype):
        if not isinstance(value, str):
            raise _Refused(f"expected a string, got {type(value).__name__} (quote it)")
        return value
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype) or pa.types.is_binary_view(dtype):
        return _to_bytes(value)
    if pa.types.is_date(dtype):
        return _to_date(value)
    if pa.types.is_timestamp(dtype):
        return _to_timestamp(value, dtype)
    raise _Refused("keys of this type are not supported")


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _BOOLS:
        return _BOOLS[value.strip().lower()]
    raise _Refused("expected true or false")


def _to_int(value: Any, dtype: pa.DataType) -> int:
    if isinstance(value, numbers.Integral):
        number = int(value)
    elif isinstance(value, str):
        if not _INT_RE.fullmatch(value.strip()):
            raise _Refused("not an integer")
        number = int(value.strip())
    elif isinstance(value, float | np.floating | decimal.Decimal):
        if not _finite(value):
            raise _Refused("not a finite number")
        if value != int(value):
            raise _Refused("has a fractional part")
        number = int(value)
    else:
        raise _Refused(f"expected an integer, got {type(value).__name__}")
    info = np.iinfo(dtype.to_pandas_dtype())
    if not int(info.min) <= number <= int(info.max):
        raise _Refused(f"out of range [{info.min}, {info.max}]")
    return number


def _to_float(value: Any, dtype: pa.DataType) -> float:
    if isinstance(value, str):
        text = value.strip()
        try:
            number = float(text) if text.lower().lstrip("+-") not in ("nan", "inf", "infinity") else math.nan
        except ValueError:
            raise _Refused("not a number") from None
    elif isinstance(value, numbers.Integral):
        number = float(int(value))
        if number != int(value):
            raise _Refused("not exactly representable as a float")
    elif isinstance(value, float | np.floating | decimal.Decimal):
        number = float(value)
    else:
        raise _Refused(f"expected a number, got {type(value).__name__}")
    if not math.isfinite(number):
        raise _Refused("NaN and infinity are not keys (NaN equals nothing, not even itself)")
    if abs(number) > float(np.finfo(dtype.to_pandas_dtype()).max):
        raise _Refused("out of range")
    return number


def _to_decimal(value: Any, dtype: pa.DataType) -> decimal.Decimal:
    if isinstance(value, decimal.Decimal):
        number = value
    elif isinstance(value, numbers.Integral):
        number = decimal.Decimal(int(value))
    elif isinstance(value, float | np.floating):
        number = decimal.Decimal(repr(float(value)))  # the shortest text of the float: 0.1, not 0.1000000000000000055
    elif isinstance(value, str):
        try:
            number = decimal.Decimal(value.strip())
        except decimal.InvalidOperation:
            raise _Refused("not a decimal number") from None
    else:
        raise _Refused(f"expected a decimal number, got {type(value).__name__}")
    if not number.is_finite():
        raise _Refused("not a finite number")
    if number and number.adjusted() >= dtype.precision - dtype.scale:
        raise _Refused(f"more than {dtype.precision - dtype.scale} digit(s) before the point")
    with decimal.localcontext(prec=dtype.precision + 2):
        try:
            scaled = number.quantize(decimal.Decimal(1).scaleb(-dtype.scale))
        except decimal.InvalidOperation:
            raise _Refused(f"more than {dtype.scale} digit(s) after the point") from None
    if scaled != number:
        raise _Refused(f"more than {dtype.scale} digit(s) after the point")
    return scaled


def _to_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            return bytes.fromhex(value)
        except ValueError:
            raise _Refused("binary keys are given as hex digits") from None
    raise _Refused(f"expected bytes or hex digits, got {type(value).__name__}")


def _to_date(value: Any) -> dt.date:
    if isinstance(value, dt.datetime):
        raise _Refused("a date-time is not a date")
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value.strip())
        except ValueError:
            raise _Refused("expected a date YYYY-MM-DD") from None
    raise _Refused(f"expected a date YYYY-MM-DD, got {type(value).__name__}")


def _to_timestamp(value: Any, dtype: pa.DataType) -> dt.datetime:
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise _Refused("expected an ISO-8601 date-time (UTC unless it names a zone)") from None
    elif isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        value = dt.datetime(value.year, value.month, value.day)
    if not isinstance(value, dt.datetime):
        raise _Refused(f"expected a date-time, got {type(value).__name__}")
    aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
    try:
        aware = aware.astimezone(dt.UTC)
    except OverflowError:
        raise _Refused("out of range") from None
    if aware.microsecond % {"s": 1_000_000, "ms": 1000}.get(dtype.unit, 1):
        raise _Refused(f"finer than the column's unit ({dtype.unit})")
    return aware


def _finite(value: Any) -> bool:
    return value.is_finite() if isinstance(value, decimal.Decimal) else math.isfinite(value)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _type_name(dtype: pa.DataType) -> str:
    if pa.types.is_timestamp(dtype):
        return "timestamp"
    if pa.types.is_date(dtype):
        return "date"
    if pa.types.is_decimal(dtype):
        return f"decimal({dtype.precision},{dtype.scale})"
    return {"bool": "bool", "double": "float64", "float": "float32", "halffloat": "float16"}.get(str(dtype), str(dtype))
