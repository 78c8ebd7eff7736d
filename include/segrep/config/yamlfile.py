"""Reading the definitions file as YAML, strictly.

PyYAML's safe loader silently keeps the last of two equal keys (a policy given twice takes whichever came
last), and a deeply nested document exhausts Python's recursion limit inside the loader. This loader refuses
both, naming the key and its line, and the file must be UTF-8 text: every problem is one ConfigError naming
the file instead of a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node

from segrep.core.errors import ConfigError

MAX_DEPTH = 64  # nesting levels; the definitions file needs about six


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys and nesting deeper than MAX_DEPTH."""

    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.get_mark()
                raise yaml.YAMLError(f"nested more than {MAX_DEPTH} levels deep (line {mark.line + 1})")
            node: Node | None = super().compose_node(parent, index)
            return node
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` merges defaults; later explicit keys override them, as YAML intends
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:
                continue  # an unhashable key: the base class reports it
            if first is not None:
                raise yaml.YAMLError(f"duplicate key {key!r} on line {line} (first given on line {first})")
            seen[key] = line
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def read_yaml(path: Path) -> Any:
    """The document in ``path``; ConfigError naming the file if it cannot be read, is not UTF-8 or not YAML."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read definitions file {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}: {raw[exc.start : exc.start + 1]!r})") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_one_line(exc)}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid YAML: nested too deeply") from None


def _one_line(exc: yaml.YAMLError) -> str:
    """PyYAML's multi-line message as one line: the problem and where it is."""
    if isinstance(exc, yaml.MarkedYAMLError):
        where = f" (line {exc.problem_mark.line + 1})" if exc.problem_mark else ""
        return f"{exc.problem or exc.context or 'malformed'}{where}"
    return " ".join(str(exc).split()) or type(exc).__name__
