"""Tuning knobs read from the environment (deadlines, lease lifetimes), each checked the same way: a value
that is not a number, or lies outside its bounds, is a clear user error naming the variable, never a
traceback or a silent default."""

from __future__ import annotations

import os

from segrep.core.errors import SegrepError

MAX_SCRUB_BYTES_PER_S = 2**40  # the bound of every scrub rate: the CLI option, the DAG Param, the environment


def seconds_from_env(name: str, default: float, maximum: float) -> float:
    """``$name`` as seconds (more than 0, at most ``maximum``), else ``default`` when unset or empty."""
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        raise SegrepError(f"{name}={text!r} is not a number of seconds") from None
    if not 0 < value <= maximum:  # also refuses nan
        raise SegrepError(f"{name}={text!r} must be more than 0 and at most {maximum:g} seconds")
    return value


def bytes_from_env(name: str, default: int, minimum: int, maximum: int) -> int:
    """``$name`` as a whole number of bytes from ``minimum`` to ``maximum``, else ``default`` when unset."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or not minimum <= int(text) <= maximum:
        raise SegrepError(f"{name}={text!r} must be a whole number of bytes from {minimum} to {maximum}")
    return int(text)
