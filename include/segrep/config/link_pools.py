"""Airflow pools per link (DESIGN section 17): one pool per link direction that has ``max_concurrent_copies``,
so that Airflow's scheduler holds back copy tasks beyond that number instead of starting them to wait for a
link slot in the catalog.

Airflow is not imported here: :func:`pools_json` is the file ``airflow pools import`` reads (``segrep
airflow-pools --json``), and :func:`copy_pool` is the pool a DAG file gives a target's copy task at parse time.
A link without ``max_concurrent_copies`` gets no pool: its copies are limited by nothing in the catalog either,
and its tasks stay in Airflow's ``default_pool``.

A task's pool is fixed when its DAG is parsed, from the definitions, not from the catalog (a DAG file does no
database work). Copies into a replica come from its feeder, else from the partitions' leaders; copies into the
definitions' leader (only after a failover moved the lead away) or into a site of an active-active table may
come from any other site of the table. A task whose copies may cross several pooled links takes the tightest
of them (fewest slots, then by name): the pool can only hold it back too much, never too little, and the
catalog's link slots still hold each link exactly. After a failover, until the definitions name the new
leader, a replica's task keeps the pool of the link from the leader they name (the catalog's slots follow
the copies' real source).
"""

from __future__ import annotations

from dataclasses import dataclass

from segrep.config.definitions import WRITES_ANY_SITE, Definitions, TableDef
from segrep.config.links import LinkDef, pool_name

__all__ = ["LinkPool", "copy_pool", "link_pools", "pools_json", "sources_into"]


@dataclass(frozen=True)
class LinkPool:
    """The Airflow pool of one link direction: its name, its slots (the link's ``max_concurrent_copies``)."""

    name: str
    source: str
    target: str
    slots: int
    link: LinkDef

    @property
    def description(self) -> str:
        return (
            f"segrep: copy tasks from {self.source} to {self.target} (link {self.link.pair}, "
            f"max_concurrent_copies {self.slots})"
        )

    def to_import(self) -> dict[str, object]:
        """The entry ``airflow pools import`` reads (deferred tasks do not copy: they hold no slot)."""
        return {"slots": self.slots, "description": self.description, "include_deferred": False}


def link_pools(defs: Definitions) -> tuple[LinkPool, ...]:
    """One pool per direction of every link with ``max_concurrent_copies``, by name."""
    pools = [
        LinkPool(pool_name(source, target), source, target, link.max_concurrent_copies, link)
        for link in defs.links
        if link.max_concurrent_copies is not None
        for source, target in link.directions
    ]
    return tuple(sorted(pools, key=lambda p: p.name))


def pools_json(defs: Definitions) -> dict[str, dict[str, object]]:
    """The pools as ``airflow pools import`` reads them: ``{name: {slots, description, include_deferred}}``."""
    return {p.name: p.to_import() for p in link_pools(defs)}


def sources_into(table: TableDef, target: str) -> tuple[str, ...]:
    """The sites the definitions say copies of ``table`` into ``target`` come from, by name."""
    others = set(table.sites) - {target}
    if table.writes == WRITES_ANY_SITE or target == table.leader:
        return tuple(sorted(others))  # active-active, or the leader after a failover: any other site
    if target in table.feeders:
        return (table.feeders[target],)
    return tuple(sorted({table.leader, *table.leaders.values()} - {target}))


def copy_pool(defs: Definitions, table: TableDef, target: str) -> LinkPool | None:
    """The pool of ``table``'s copy task into ``target``: the tightest pooled link its copies may cross; None
    when none of them is pooled (the task keeps Airflow's default pool)."""
    pools = {(p.source, p.target): p for p in link_pools(defs)}
    crossed = [pools[(source, target)] for source in sources_into(table, target) if (source, target) in pools]
    return min(crossed, key=lambda p: (p.slots, p.name), default=None)
