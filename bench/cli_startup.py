"""bench/cli_startup.py: what a ``segrep`` command costs as a process (the drills, the DAG tasks, a user's shell).

A small table (TPC-H-like orders, ``--rows`` rows, ``primary`` leading, ``dr`` a replica, local directories,
SQLite catalog; ``--publish`` makes it an open table) and, per command, the median wall time of ``--repeats``
runs of the installed ``segrep`` script: ``--help``, ``status``, ``write`` of a few rows, ``round``, ``read
--site dr``. With ``--baseline-include DIR`` (the ``include/`` of another commit: ``git archive REV include |
tar -x -C DIR``) each command also runs with DIR first on ``PYTHONPATH``, alternating with the current code:
the baseline of the same run. Both trees are compiled to bytecode first (the machine may set
PYTHONDONTWRITEBYTECODE; an uncompiled tree would pay its compilation on every run).

``--background-load N`` runs N CPU-bound processes meanwhile.
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from benchkit import args_doc, background_load, load_footer, log, make_env, print_table

SEGREP = Path(sys.executable).with_name("segrep")


def orders(n: int, start: int) -> pa.Table:
    keys = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"o_orderkey": keys, "o_comment": pa.array([f"order {k}" for k in keys.tolist()])})


def base_args(work: Path) -> list[str]:
    return ["--config", str(work / "segrep.yaml"), "--catalog", f"sqlite:///{work}/catalog.db"]


def commands(work: Path) -> dict[str, list[str]]:
    base = base_args(work)
    return {
        "--help": ["--help"],
        "status": [*base, "status"],
        "write (100 rows)": [*base, "write", "orders", str(work / "batch.parquet")],
        "round": [*base, "round", "orders"],
        "read --site dr": [*base, "read", "orders", "--site", "dr", "-o", str(work / "out.parquet"), "--overwrite"],
    }


def run(argv: list[str], pythonpath: str | None, cwd: Path) -> float:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    started = time.perf_counter()
    done = subprocess.run([str(SEGREP), *argv], cwd=cwd, env=env, capture_output=True, text=True)
    secs = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"segrep {' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return secs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--publish", action="store_true", help="the table publishes (policy publish: iceberg)")
    ap.add_argument("--baseline-include", type=Path, default=None, help="another commit's include/ (same run)")
    ap.add_argument("--background-load", type=int, default=0, metavar="N", help="N CPU-bound processes meanwhile")
    ap.add_argument("--work-dir", type=Path, default=None)
    args = ap.parse_args()
    if not SEGREP.exists():
        raise SystemExit(f"no segrep script beside {sys.executable}: run `make venv` first")
    trees = {"current": None}
    if args.baseline_include is not None:
        base = args.baseline_include.resolve()
        if not (base / "segrep" / "cli" / "main.py").exists():
            raise SystemExit(f"--baseline-include {base} holds no segrep package (segrep/cli/main.py)")
        trees["baseline"] = str(base)
    for tree in (Path(__file__).resolve().parents[1] / "include", *(Path(t) for t in trees.values() if t)):
        compileall.compile_dir(str(tree), quiet=1)
    load_start = os.getloadavg()
    started = time.perf_counter()
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="segrep-bench-cli-", dir=args.work_dir) as tmp:
        work = Path(tmp)
        body = {
            "columns": {"o_orderkey": "int64", "o_comment": "string"},
            "primary_key": ["o_orderkey"],
            "split_points": [args.rows // 2],
            "policy": {"publish": "iceberg"} if args.publish else {},
        }
        catalog, _ = make_env(work, f"sqlite:///{work}/catalog.db", ["primary", "dr"], "orders", body)
        catalog.dispose()
        pq.write_table(orders(args.rows, 0), work / "first.parquet")
        cmds = commands(work)
        with background_load(args.background_load):
            run([*base_args(work), "write", "orders", str(work / "first.parquet")], None, work)
            run(cmds["round"], None, work)
            for i in range(args.repeats):
                for name, argv in cmds.items():
                    if name.startswith("write"):  # new keys each time: a round then has segments to move
                        pq.write_table(orders(100, args.rows + i * 100), work / "batch.parquet")
                    order = list(trees.items()) if i % 2 == 0 else list(reversed(trees.items()))
                    for tree, path in order:
                        times.setdefault((name, tree), []).append(run(argv, path, work))
                log(f"repeat {i + 1} of {args.repeats} (load {os.getloadavg()[0]:.2f})")
    rows = []
    for name in cmds:
        now = statistics.median(times[(name, "current")])
        what = f"`segrep {name}`: wall s, median of {args.repeats}"
        if "baseline" in trees:
            before = statistics.median(times[(name, "baseline")])
            rows.append((f"{what}; ratio = baseline / current", f"{now:.2f}", f"{before:.2f}", f"{before / now:.2f}"))
        else:
            rows.append((what, f"{now:.2f}", "-", "-"))
    rows = [(*row, "-", "-") for row in rows]  # no target: a figure to compare
    print_table(rows)
    print(load_footer(time.perf_counter() - started, args.background_load, load_start, os.getloadavg()))
    log(f"args: {args_doc(args)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
