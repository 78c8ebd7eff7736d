"""Active-active conflicts, counted while a merge runs (DESIGN 12, issue 15 item 3).

A conflict is a key written at two sites where neither write saw the other, so last-writer-wins dropped one:
- two pushed segments of different origins in the same merge hold the key (neither was merged yet, so
  neither writer can have read the other's row);
- the leader's current row for the key has another origin and a version newer than what the pushed row's
  writer had seen (``MergeItem.origin_forks``: its base segment's newest version).
Each is counted once, for the pair (the site whose row lost, the site whose row won), with a few sample keys.
A leader row merged late from a third site with an old version is not counted (its version is older than the
fork point): the count is a lower bound, never an invention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from segrep.core import keys
from segrep.core import schema as sch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

SAMPLE_KEYS = 5


@dataclass(frozen=True)
class Conflict:
    site_id: int  # the origin whose row lost
    by_site_id: int  # the origin whose row won
    rows: int
    sample: list[list[Any]]  # primary keys (JSON form, core.keys.encode) of some of the rows


def merge_conflicts(
    incoming_all: DataFrame, incoming: DataFrame, best: DataFrame | None, primary_key: list[str], forks: dict[str, int]
) -> list[Conflict]:
    """``incoming_all``: every pushed row; ``incoming``: one per key (the pushed winner); ``best``: the
    leader's winning (_version, _origin) per key as the struct column ``__best`` (None: the leader is empty)."""
    from pyspark.sql import functions as F

    v, o = sch.VERSION_COL, sch.ORIGIN_COL
    pairs = []
    # among the pushed rows: every other origin's row for a key lost to the pushed winner
    origins = incoming_all.groupBy(*primary_key).agg(F.collect_set(F.col(o)).alias("__origins"))
    among = (
        origins.where(F.size("__origins") > 1)
        .join(incoming.select(*primary_key, F.col(o).alias("__winner")), on=primary_key)
        .select(*primary_key, F.explode("__origins").alias("__loser"), "__winner")
        .where(F.col("__loser") != F.col("__winner"))
    )
    pairs.append(among)
    if best is not None and forks:
        fork = F.lit(None).cast("long")
        for origin, seen in forks.items():
            fork = F.when(F.col(o) == F.lit(int(origin)), F.lit(seen)).otherwise(fork)
        bv, bo = F.col("__best").getField(v), F.col("__best").getField(o)
        pushed_wins = (F.col(v) > bv) | ((F.col(v) == bv) & (F.col(o) > bo))
        concurrent = (
            incoming.join(best, on=primary_key)
            .where((bo != F.col(o)) & fork.isNotNull() & (bv > fork))
            .select(
                *primary_key,
                F.when(pushed_wins, bo).otherwise(F.col(o)).alias("__loser"),
                F.when(pushed_wins, F.col(o)).otherwise(bo).alias("__winner"),
            )
        )
        pairs.append(concurrent)
    union = pairs[0] if len(pairs) == 1 else pairs[0].unionByName(pairs[1])
    counted = union.groupBy("__loser", "__winner").agg(
        F.count(F.lit(1)).alias("__rows"),
        F.slice(F.collect_list(F.struct(*[F.col(k) for k in primary_key])), 1, SAMPLE_KEYS).alias("__sample"),
    )
    out = []
    for row in counted.collect():
        sample = [[keys.encode(x) for x in key] for key in row["__sample"]]
        out.append(Conflict(int(row["__loser"]), int(row["__winner"]), int(row["__rows"]), sample))
    return sorted(out, key=lambda c: (c.site_id, c.by_site_id))
