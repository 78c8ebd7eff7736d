"""The definitions examples in the documentation are valid definitions files, as written. A YAML block is a
definitions example when it has a top-level `sites:` or `tables:` (other YAML, such as a Prometheus scrape
configuration, is not checked here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from segrep.config.definitions import load_definitions

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)
DEFINITIONS = re.compile(r"^(sites|tables):", re.M)
EXAMPLES = [
    (doc.name, i, body)
    for doc in DOCS
    for i, body in enumerate(b for b in BLOCK.findall(doc.read_text()) if DEFINITIONS.search(b))
]


@pytest.mark.parametrize(("doc", "index", "body"), EXAMPLES, ids=[f"{d}#{i}" for d, i, _ in EXAMPLES])
def test_yaml_examples_load(tmp_path: Path, doc: str, index: int, body: str) -> None:
    path = tmp_path / "segrep.yaml"
    path.write_text(body)
    defs = load_definitions(path)
    assert defs.tables, f"{doc} example {index} defines no table"


def test_there_is_an_example() -> None:
    assert EXAMPLES
