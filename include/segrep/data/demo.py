"""Demo and test data: real TPC-H tables from ``tpchgen-cli``, cut into batches with updates and deletes.

``make_batches`` splits a table into ``n`` insert batches; from the second batch on, each batch also updates
about ``update_frac`` of the rows already written (new comment and price) and is followed by a delete batch of
about ``delete_frac`` of them. ``expected_rows`` replays the batches with plain dictionaries: an independent
last-writer-wins computation to check the reader against.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from segrep.core import schema as sch


def generate_tpch(table: str, scale: float, out_dir: Path) -> Path:
    """Generate one TPC-H table as Parquet (cached: an existing file is reused)."""
    out = out_dir / f"{table}.parquet"
    if out.exists():
        return out
    exe = shutil.which("tpchgen-cli") or str(Path(sys.executable).parent / "tpchgen-cli")
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [exe, "parquet", "-s", str(scale), f"--tables={table}", f"--output-dir={out_dir}"],
        check=True,
        capture_output=True,
    )
    return out


def lineitem_yaml(
    source: Path, split_points: list[int], replicas: list[str], policy: dict[str, object] | None = None
) -> str:
    """Definitions of TPC-H ``lineitem`` (key l_orderkey, l_linenumber; schema from ``source``) led by
    ``primary``, for the benchmarks and the TPC-H tests. Lists are written inline: ``replicas: [dr]``."""
    import yaml

    table: dict[str, object] = {
        "schema_from": str(source),
        "primary_key": ["l_orderkey", "l_linenumber"],
        "partition_key": "l_orderkey",
        "split_points": list(split_points),
        "leader": "primary",
        "replicas": list(replicas),
    }
    if policy:
        table["policy"] = policy
    sites = {name: {"id": n, "uri": f"sites/{name}"} for n, name in enumerate(("primary", "dr", "edge"), start=1)}
    doc = {"data_dir": "data", "sites": sites, "tables": {"lineitem": table}}
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)


def normalized(table: pa.Table) -> pa.Table:
    """Cast TPC-H's Parquet types (string_view...) onto segrep's vocabulary."""
    return table.cast(sch.schema_from_arrow(table.schema))


@dataclass(frozen=True)
class Batch:
    rows: pa.Table
    delete: bool

    @property
    def kind(self) -> str:
        return "delete" if self.delete else "upsert"


def make_batches(
    source: pa.Table,
    key: str,
    n: int = 10,
    update_frac: float = 0.05,
    delete_frac: float = 0.01,
    seed: int = 7,
) -> list[Batch]:
    rng = np.random.default_rng(seed)
    source = normalized(source)
    chunks = np.array_split(np.arange(source.num_rows), n)
    total = source.num_rows
    written: list[int] = []
    batches: list[Batch] = []
    for i, idx in enumerate(chunks):
        inserts = source.take(pa.array(idx))
        if written:
            n_upd = max(1, int(total * update_frac / (n - 1)))
            upd_idx = rng.choice(np.array(written), size=min(n_upd, len(written)), replace=False)
            updates = _modify(source.take(pa.array(np.sort(upd_idx))), i)
            batches.append(Batch(pa.concat_tables([inserts, updates]), delete=False))
        else:
            batches.append(Batch(inserts, delete=False))
        written.extend(idx.tolist())
        if i:
            n_del = max(1, int(total * delete_frac / (n - 1)))
            del_idx = rng.choice(np.array(written), size=min(n_del, len(written)), replace=False)
            batches.append(Batch(source.take(pa.array(np.sort(del_idx))).select([key]), delete=True))
    return batches


def _modify(rows: pa.Table, batch_no: int) -> pa.Table:
    """An update: every non-key string column gets a suffix, numbers stay (keeps types intact)."""
    out = rows
    for f in rows.schema:
        if pa.types.is_string(f.type) and f.name.endswith("comment"):
            col = pc.binary_join_element_wise(rows.column(f.name), pa.scalar(f" (upd {batch_no})"), "")
            out = out.set_column(out.schema.get_field_index(f.name), f.name, col)
    return out


def expected_rows(batches: list[Batch], key: str) -> dict[object, dict[str, object]]:
    """Replay the batches in order with a dict: the reference answer for a read."""
    state: dict[object, dict[str, object]] = {}
    for batch in batches:
        for row in batch.rows.to_pylist():
            if batch.delete:
                state.pop(row[key], None)
            else:
                state[row[key]] = row
    return state


def write_batch_files(batches: list[Batch], out_dir: Path) -> list[tuple[Path, bool]]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for i, batch in enumerate(batches, 1):
        path = out_dir / f"{i:02d}_{batch.kind}.parquet"
        pq.write_table(batch.rows, path)
        files.append((path, batch.delete))
    return files


def read_batch_files(batch_dir: Path) -> list[Batch]:
    return [Batch(pq.read_table(p), p.stem.endswith("_delete")) for p in sorted(batch_dir.glob("*.parquet"))]


def compare(read: pa.Table, expected: dict[object, dict[str, object]], key: str) -> list[str]:
    """Differences between rows read and the reference answer (empty when equal)."""
    got = {row[key]: row for row in read.to_pylist()}
    problems = []
    if len(got) != read.num_rows:
        problems.append(f"{read.num_rows - len(got)} duplicate key(s) in what was read")
    missing = expected.keys() - got.keys()
    extra = got.keys() - expected.keys()
    changed = [k for k in expected.keys() & got.keys() if expected[k] != got[k]]
    for label, ks in (("missing", missing), ("unexpected", extra), ("different", changed)):
        if ks:
            problems.append(f"{len(ks)} {label} row(s), e.g. key {sorted(ks)[0]!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="TPC-H batches for the demo, and the check of what was read")
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("batches", help="generate TPC-H and cut it into upsert and delete batches")
    mk.add_argument("--table", default="orders")
    mk.add_argument("--key", default="o_orderkey")
    mk.add_argument("--scale", type=float, default=0.1)
    mk.add_argument("--tpch-dir", type=Path, required=True)
    mk.add_argument("--out", type=Path, required=True, help="directory for the batch files")
    mk.add_argument("--batches", type=int, default=10)
    ck = sub.add_parser("check", help="compare a read-back Parquet file with a replay of the batches")
    ck.add_argument("--key", default="o_orderkey")
    ck.add_argument("--batch-dir", type=Path, required=True)
    ck.add_argument("--read", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "batches":
        source = pq.read_table(generate_tpch(args.table, args.scale, args.tpch_dir))
        for path, delete in write_batch_files(make_batches(source, args.key, args.batches), args.out):
            print(f"{path}\t{'delete' if delete else 'upsert'}")
        return 0
    expected = expected_rows(read_batch_files(args.batch_dir), args.key)
    problems = compare(pq.read_table(args.read), expected, args.key)
    if problems:
        print("MISMATCH: " + "; ".join(problems))
        return 1
    print(f"OK: {len(expected)} rows read back equal an independent last-writer-wins replay of the batches")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
