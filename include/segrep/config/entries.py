"""Checks every entry of the definitions file makes (sites, tables, policies, stores, links): a mapping where
one is expected, and no key the entry does not know, so a typo is refused by name instead of ignored."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from segrep.core.errors import SegrepError


def expect_mapping(value: Any, where: str) -> Mapping[str, Any]:
    """``value`` if it is a mapping; SegrepError naming ``where`` otherwise."""
    if not isinstance(value, dict):
        raise SegrepError(f"{where}: expected a mapping")
    return value


def no_unknown_keys(body: Mapping[str, Any], known: set[str], where: str) -> None:
    """Refuse the keys of ``body`` outside ``known``, naming them and the keys that are known."""
    unknown = sorted(set(body) - known, key=str)
    if unknown:
        raise SegrepError(f"{where}: unknown key(s) {', '.join(map(str, unknown))}; known: {', '.join(sorted(known))}")
