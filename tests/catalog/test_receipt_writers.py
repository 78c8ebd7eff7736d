"""Leases and acks are written only by catalog/leases.py and catalog/sql.py.

Every other module that changes either table calls a named function there (``leases.record_ack``,
``record_acks``, ``drop_acks``, ``release_many``, ``drop_leases`` ...), so what may write a receipt, and how,
is in one place. The check reads the source (``ast``): a write is an INSERT, UPDATE or DELETE construct, a
session's ``add``/``delete``/``merge`` or a row object made or changed, whose table is ``Ack`` or ``Lease``
(named directly, through ``__table__``, or through a variable that holds one), or SQL text that writes
``acks`` or ``leases``. The checker is itself tested on each of those forms, so the test can fail.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from segrep.catalog import leases as ls
from segrep.catalog import models as m
from tests.support.env import Env

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {"include/segrep/catalog/leases.py", "include/segrep/catalog/sql.py"}
SCANNED = ("include", "dags", "spark_jobs", "plugins")
MODELS = {"Ack", "Lease"}
# calls whose first arguments name what they write: SQLAlchemy's constructs, the catalog's helpers, a session's
WRITES = {"delete", "insert", "update", "ignoring_insert", "insert_ignore", "add", "add_all", "merge"}
WRITES |= {"bulk_insert_mappings", "bulk_update_mappings", "bulk_save_objects"}
SQL_WRITE = re.compile(r"\b(insert\s+into|update|delete\s+from)\s+[\"`]?(acks|leases)\b", re.IGNORECASE)


def _is_model(node: ast.AST) -> bool:
    """``m.Ack``, ``models.Lease``, ``Ack`` (imported), or ``m.Ack.__table__``."""
    if isinstance(node, ast.Attribute) and node.attr == "__table__":
        return _is_model(node.value)
    return (isinstance(node, ast.Attribute) and node.attr in MODELS) or (
        isinstance(node, ast.Name) and node.id in MODELS
    )


class _Checker(ast.NodeVisitor):
    """The writes of Ack or Lease rows in one module: (line, what) each."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.tainted: set[str] = set()  # names that may hold a model (or its rows)
        self.found: list[tuple[int, str]] = []
        self._parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}

    def run(self) -> list[tuple[int, str]]:
        while True:  # names bound from names bound from a model ...: until nothing new is tainted
            before = len(self.tainted)
            for node in ast.walk(self.tree):
                self._bind(node)
            if len(self.tainted) == before:
                break
        self.visit(self.tree)
        return self.found

    def _bears(self, node: ast.AST) -> bool:
        """Whether an expression holds a model itself (not one of its columns: ``m.Ack.segment_id`` is read)."""
        for sub in ast.walk(node):
            held = _is_model(sub) or (isinstance(sub, ast.Name) and sub.id in self.tainted)
            if held and not (
                isinstance(parent := self._parents.get(sub), ast.Attribute) and parent.attr != "__table__"
            ):
                return True
        return False

    def _taint(self, target: ast.AST, value: ast.AST) -> None:
        pairs = isinstance(target, ast.Tuple | ast.List) and isinstance(value, ast.Tuple | ast.List)
        if pairs and len(target.elts) == len(value.elts):  # type: ignore[attr-defined]  # a, b = x, y: by element
            for t, v in zip(target.elts, value.elts, strict=True):  # type: ignore[attr-defined]
                self._taint(t, v)
            return
        if self._bears(value):
            self.tainted |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}

    def _bind(self, node: ast.AST) -> None:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self._taint(target, node.value)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr) and node.value is not None:
            self._taint(node.target, node.value)
        elif isinstance(node, ast.For | ast.comprehension):
            items = node.iter.elts if isinstance(node.iter, ast.Tuple | ast.List) else [node.iter]
            for item in items:  # for model, cond in ((m.Ack, ...), ...): each item against the target
                self._taint(node.target, item)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            self._taint(node.optional_vars, node.context_expr)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if _is_model(func):
            self.found.append((node.lineno, f"a row made: {ast.unparse(func)}(...)"))
        elif name in WRITES and any(self._bears(arg) for arg in node.args[:2]):
            self.found.append((node.lineno, ast.unparse(node)[:80]))
        elif name in {"delete", "insert", "update"} and isinstance(func, ast.Attribute) and _is_model(func.value):
            self.found.append((node.lineno, ast.unparse(node)[:80]))  # m.Ack.__table__.delete()
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:  # row.acked_us = ...: an ORM update of a loaded row
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id in self.tainted
            ):
                self.found.append((node.lineno, f"a row changed: {ast.unparse(target)}"))
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and SQL_WRITE.search(node.value):
            self.found.append((node.lineno, f"SQL text: {node.value[:60]!r}"))


def receipt_writes(source: str) -> list[tuple[int, str]]:
    return _Checker(ast.parse(source)).run()


def test_only_the_receipt_modules_write_leases_and_acks() -> None:
    offenders = {}
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel not in ALLOWED and (found := receipt_writes(path.read_text())):
                offenders[rel] = found
    assert offenders == {}


def test_the_receipt_modules_are_where_the_rule_says() -> None:
    assert all((ROOT / rel).is_file() for rel in ALLOWED)
    assert receipt_writes((ROOT / "include/segrep/catalog/leases.py").read_text())  # the writes are there


@pytest.mark.parametrize(
    "source",
    [
        "s.execute(delete(m.Ack).where(m.Ack.segment_id == x))",
        "s.execute(update(m.Lease).values(expires_us=1))",
        "s.execute(sqlite.insert(m.Ack).on_conflict_do_nothing(), rows)",
        "s.execute(ignoring_insert(s, m.Lease), rows)",
        "insert_ignore(s, Ack, {'segment_id': 'a'})",
        "s.add(m.Ack(holder_placement_id=1))",
        "s.execute(m.Lease.__table__.delete())",
        "stmt = delete(m.Ack)\ns.execute(stmt)",
        "for model, cond in ((m.Checkpoint, a), (m.Lease, b)):\n    s.execute(delete(model).where(cond))",
        "for ack in s.scalars(select(m.Ack)):\n    s.delete(ack)",
        "row = s.get(m.Lease, key)\nrow.expires_us = 5",
        "s.execute(text('DELETE FROM acks WHERE segment_id = :s'))",
        "s.execute(text('update leases set holder = :h'))",
    ],
)
def test_the_check_finds_each_kind_of_write(source: str) -> None:
    assert receipt_writes(source), source


@pytest.mark.parametrize(
    "source",
    [
        "rows = s.execute(select(m.Ack.holder_placement_id).where(m.Ack.segment_id.in_(ids)))",
        "leader_ack = aliased(m.Ack)\nq = select(leader_ack.segment_id)",
        "lease = s.get(m.Lease, key)\nn = lease.expires_us",
        "ack = m.Ack\nfor h, seg, t in s.execute(select(ack.holder_placement_id)):\n    found.add(t)",
        "s.execute(delete(m.Checkpoint).where(m.Checkpoint.target_placement_id == 1))",
        "pl, ack = m.Placement, m.Ack\npl.root_segment_id = 'x'",
        "ls.drop_acks(s, holders=1, segments=['a'])",
    ],
)
def test_the_check_lets_reads_and_other_tables_be(source: str) -> None:
    assert receipt_writes(source) == []


def test_receipts_are_dropped_by_the_filters_given_and_never_all_at_once(env: Env) -> None:
    """Each filter narrows the drop (one id: ``=``, several or a subquery: ``IN``); none at all is refused
    (it would empty the table), before anything is deleted."""
    with env.catalog.write() as s:
        a, b, c = s.scalars(select(m.Placement.placement_id).order_by(m.Placement.placement_id).limit(3))
        ls.record_acks(s, [(a, "s1", b), (a, "s2", b), (a, "s1", c), (b, "s1", a)], 10)
        ls.acquire_many(s, b, ["s1", "s2"], "round-1", 100)
        ls.acquire_many(s, c, ["s1"], "round-2", 100)
        with pytest.raises(ValueError, match="acks"):
            ls.drop_acks(s)
        with pytest.raises(ValueError, match="leases"):
            ls.drop_leases(s)
        ls.drop_acks(s, holders=a, segments="s1", targets=[b, c])
        assert _acks(s) == {(a, "s2", b), (b, "s1", a)}
        ls.drop_acks(s, targets=select(m.Placement.placement_id).where(m.Placement.placement_id == b))
        assert _acks(s) == {(b, "s1", a)}
        ls.drop_leases(s, targets=b, holder="round-2")  # nothing of round-2 at b
        ls.release_many(s, b, ["s2"], "round-1")
        assert _leases(s) == {(b, "s1", "round-1"), (c, "s1", "round-2")}
        ls.drop_leases(s, holder="round-1")
        assert _leases(s) == {(c, "s1", "round-2")}


def _acks(s: Session) -> set[tuple[int, str, int]]:
    rows = s.execute(select(m.Ack.holder_placement_id, m.Ack.segment_id, m.Ack.target_placement_id))
    return {(h, seg, t) for h, seg, t in rows}


def _leases(s: Session) -> set[tuple[int, str, str]]:
    return {
        (t, seg, h) for t, seg, h in s.execute(select(m.Lease.target_placement_id, m.Lease.segment_id, m.Lease.holder))
    }
