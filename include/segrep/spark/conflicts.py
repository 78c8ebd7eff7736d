"""Active-active conflicts, counted while a merge runs (DESIGN 12, issue 15 item 3).

A conflict is a key written at two sites where neither write saw the other, so last-writer-wins dropped one:
- two pushed segments of different origins in the same merge hold the key (neither was merged yet, so
  neither writer can have read the other's row);
- the leader's current row for the key has another origin and a version newer than what the pushed row's
  writer had seen (``MergeItem.origin_forks``: its base segment's newest version).
Each is counted once, for the pair (the site whose row lost, the site whose row won), with the smallest few of
its primary keys as a sample (so both engines name the same ones). A leader row merged late from a third site
with an old version is not counted (its version is older than the fork point): the count is a lower bound,
never an invention. :func:`merge_conflicts` counts on Spark, :func:`arrow_conflicts` with pyarrow in process
(``spark.in_process``): the same rule, the same result.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from segrep.core import keys
from segrep.core import schema as sch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

SAMPLE_KEYS = 5
_LOSER, _WINNER = "__loser", "__winner"


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
        F.slice(F.array_sort(F.collect_list(F.struct(*[F.col(k) for k in primary_key]))), 1, SAMPLE_KEYS).alias(
            "__sample"
        ),
    )
    out = [
        _conflict(
            row["__loser"], row["__winner"], row["__rows"], [[key[k] for k in primary_key] for key in row["__sample"]]
        )
        for row in counted.toArrow().to_pylist()  # through Arrow, as in process: the same Python values
    ]
    return sorted(out, key=lambda c: (c.site_id, c.by_site_id))


@dataclass(frozen=True)
class Pushed:
    """Every pushed row (key, ``_version``, ``_origin``) ranked newest first per key (``data.reader.newest_first``):
    ``first`` marks each key's winner."""

    ranked: pa.Table
    first: np.ndarray


@dataclass(frozen=True)
class LeaderBest:
    """The leader's winning ``_version`` and ``_origin`` for the pushed winners' keys it holds: ``at`` are
    positions among the pushed winners (in key order), ``version`` and ``origin`` aligned with them."""

    at: np.ndarray
    version: np.ndarray
    origin: np.ndarray


def arrow_conflicts(
    pushed: Pushed, leader: LeaderBest | None, primary_key: list[str], forks: dict[str, int]
) -> list[Conflict]:
    """:func:`merge_conflicts` with pyarrow and numpy, on rows already ranked (no join, no hash aggregate);
    ``leader`` None: the leader is empty."""
    v, o = sch.VERSION_COL, sch.ORIGIN_COL
    keys = pushed.ranked.select(primary_key)
    origin = pushed.ranked[o].to_numpy()
    group = np.cumsum(pushed.first) - 1
    winner = origin[pushed.first][group]
    # among the pushed rows: every other origin's row for a key lost to the pushed winner (once per origin)
    lost = np.flatnonzero(origin != winner)
    code = group[lost].astype(np.int64) * 2**32 + (origin[lost].astype(np.int64) & 0xFFFFFFFF)
    among = lost[np.unique(code, return_index=True)[1]]
    pairs = [_pairs(keys.take(among), origin[among], winner[among])]
    if leader is not None and forks:
        won = np.flatnonzero(pushed.first)
        at = won[leader.at]  # the winners' positions among the ranked rows
        ver, mine, bv, bo = pushed.ranked[v].to_numpy()[at], origin[at], leader.version, leader.origin
        fork = np.full(len(at), -1, np.int64)
        forked = np.zeros(len(at), bool)
        for site, seen in forks.items():
            is_site = mine == int(site)
            fork[is_site], forked[is_site] = seen, True
        concurrent = (bo != mine) & forked & (bv > fork)
        pushed_wins = (ver > bv) | ((ver == bv) & (mine > bo))
        loser, winner_ = np.where(pushed_wins, bo, mine), np.where(pushed_wins, mine, bo)
        pairs.append(_pairs(keys.take(at[concurrent]), loser[concurrent], winner_[concurrent]))
    union = pa.concat_tables(pairs).sort_by([(c, "ascending") for c in (_LOSER, _WINNER, *primary_key)])
    losers, winners = union[_LOSER].to_numpy(), union[_WINNER].to_numpy()
    begins = np.ones(union.num_rows, bool)
    begins[1:] = (losers[1:] != losers[:-1]) | (winners[1:] != winners[:-1])
    bounds = [*np.flatnonzero(begins).tolist(), union.num_rows]
    out = []
    for start, end in itertools.pairwise(bounds):
        sample = union.select(primary_key).slice(start, min(end - start, SAMPLE_KEYS)).to_pylist()
        out.append(_conflict(losers[start], winners[start], end - start, [[k[c] for c in primary_key] for k in sample]))
    return out


def _pairs(keys: pa.Table, loser: np.ndarray, winner: np.ndarray) -> pa.Table:
    """(key, loser, winner) rows: one overwrite each."""
    return keys.append_column(_LOSER, pa.array(loser, pa.int32())).append_column(_WINNER, pa.array(winner, pa.int32()))


def _conflict(loser: Any, winner: Any, rows: Any, sample: list[list[Any]]) -> Conflict:
    return Conflict(int(loser), int(winner), int(rows), [[keys.encode(x) for x in key] for key in sample])
