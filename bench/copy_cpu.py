"""Benchmark: CPU seconds per GB of one verified copy (``storage.transfer.copy_verified``) on each path, without
the catalog (issue 33 item 5: a copy hashes each byte once, by the cheapest checksum the catalog allows).

Run by hand (`python bench/copy_cpu.py`); prints a markdown table. ``--files`` random files of ``--size-mb``
each are written to a local site, then copied with the catalog's size, sha256 and CRC-64/NVME, ``--repeats``
times per path into a fresh target: local → local by the kernel (``copy_file_range``), local → local streamed
(the kernel copy refused, as across file systems), local → S3 and S3 → local (a moto server on loopback,
``tests.support.s3``). The figures are this process's CPU time (every thread, from ``os.times``) split into
user (hashing, Python) and system (the kernel's copies, sockets, fsync), medians: CPU time is less sensitive
than wall time to other work on a shared machine, though heavy load still inflates the system part. The moto
server's own CPU is not counted. To compare two trees, run the script of one with ``PYTHONPATH`` set to the
other's ``include``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support (the moto servers)

from benchkit import background_load, log

from segrep.config.stores import CredentialsRef, StoreOptions
from segrep.storage.crc64nvme import Crc64Nvme
from segrep.storage.site import Site
from segrep.storage.transfer import copy_verified
from tests.support.s3 import start_s3_endpoints

File = tuple[str, int, str, str]  # relpath, size, sha256, crc64nvme


def write_files(site: Site, count: int, size: int) -> list[File]:
    files = []
    for i in range(count):
        rel = f"bench/1/{i:032x}.parquet"
        path = Path(site.path(rel))
        path.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size)
        path.write_bytes(data)
        files.append((rel, size, hashlib.sha256(data).hexdigest(), Crc64Nvme(data).hexdigest()))
    return files


def measure(source: Site, fresh_target: Callable[[], Site], files: list[File], repeats: int) -> dict[str, float]:
    """Median user and system CPU seconds per GB, and MB/s, of copying every file into a fresh target."""
    user, system, wall = [], [], []
    gb = sum(f[1] for f in files) / 1e9
    for _ in range(repeats):
        target = fresh_target()
        os.sync()
        before, started = os.times(), time.perf_counter()
        for rel, size, sha, crc in files:
            copy_verified(source, target, rel, size, sha, crc)
        after, secs = os.times(), time.perf_counter() - started
        user.append((after.user - before.user) / gb)
        system.append((after.system - before.system) / gb)
        wall.append(gb * 1000 / secs)
    return {"user": statistics.median(user), "system": statistics.median(system), "MBps": statistics.median(wall)}


@contextlib.contextmanager
def kernel_copy_refused() -> Iterator[None]:
    """copy_file_range refused as across file systems: the copy streams through the hashing writer."""
    real = os.copy_file_range

    def refuse(*_args: Any) -> int:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    os.copy_file_range = refuse
    try:
        yield
    finally:
        os.copy_file_range = real


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=40)
    ap.add_argument("--size-mb", type=float, default=6.2, help="each file (6.2: a lineitem sf1 segment)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--background-load", type=int, default=0, metavar="N", help="N CPU-bound processes meanwhile")
    ap.add_argument("--work-dir", type=Path, default=None, help="parent of the scratch directory (default: /tmp)")
    args = ap.parse_args()

    load_start = os.getloadavg()
    rows: list[tuple[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="segrep-bench-copy-", dir=args.work_dir) as tmp:
        work = Path(tmp)
        (work / "moto").mkdir()
        source = Site("source", str(work / "source"))
        files = write_files(source, args.files, int(args.size_mb * 1e6))
        log(f"{args.files} files of {args.size_mb} MB written")

        def local() -> Site:
            root = work / uuid.uuid4().hex[:8]
            root.mkdir()
            return Site("target", str(root))

        with (
            contextlib.contextmanager(start_s3_endpoints)(work / "moto") as (a, _),
            background_load(args.background_load),
        ):
            os.environ.update(a.env("BENCH_COPY_S3"))
            creds = CredentialsRef(env_prefix="BENCH_COPY_S3")
            opts = StoreOptions(endpoint=a.url, region=a.region, retries=1, credentials=creds)
            uploaded: list[Site] = []

            def s3() -> Site:
                uploaded.append(Site("target", f"s3://segrep-a/{uuid.uuid4().hex[:8]}/target", opts))
                return uploaded[-1]

            rows.append(("local → local, kernel copy", measure(source, local, files, args.repeats)))
            with kernel_copy_refused():
                rows.append(("local → local, streamed", measure(source, local, files, args.repeats)))
            rows.append(("local → S3 (moto)", measure(source, s3, files, args.repeats)))
            rows.append(("S3 (moto) → local", measure(uploaded[-1], local, files, args.repeats)))
    load_end = os.getloadavg()
    print(f"\n{args.files} files of {args.size_mb} MB; medians of {args.repeats}\n")
    print("| path | CPU user, s/GB | CPU system, s/GB | MB/s |")
    print("|---|---|---|---|")
    for label, fig in rows:
        print(f"| {label} | {fig['user']:.2f} | {fig['system']:.2f} | {fig['MBps']:,.0f} |")
    print(
        f"\nbackground load {args.background_load}; load average {load_start[0]:.2f} at the start, "
        f"{load_end[0]:.2f} at the end"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
