"""A full disk (an injected ENOSPC, ``SEGREP_FAULTS=disk_full:enospc``) fails every atomic write cleanly: the
error is ENOSPC, no final name appears, no temporary file is left behind; `segrep write` says so in one line
(exit 1, not an internal error) and commits nothing."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from segrep.core import faults
from segrep.storage import atomic
from tests.support.badinput import tree_state
from tests.support.checks import segment_rows
from tests.support.env import Env
from tests.support.tables import orders

WRITES = {
    "stream": lambda d: atomic.atomic_local_write_stream(str(d / "f.bin"), lambda out: out.write(b"x" * 1000)),
    "copy": lambda d: atomic.atomic_local_copy(
        str(d / "src.bin"), str(d / "f.bin"), atomic.hash_local(str(d / "src.bin"), fsync=False)
    ),
    "callback": lambda d: atomic.atomic_local_write(str(d / "f.bin"), lambda tmp: Path(tmp).write_bytes(b"x")),
    "json": lambda d: atomic.write_json_atomic(d / "f.bin", {"a": 1}),
}


@pytest.mark.parametrize("kind", sorted(WRITES))
def test_a_full_disk_fails_the_write_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    (tmp_path / "src.bin").write_bytes(b"y" * 5000)
    before = sorted(os.listdir(tmp_path))
    monkeypatch.setenv(faults.FAULTS_ENV, "disk_full:enospc")
    with pytest.raises(OSError) as caught:
        WRITES[kind](tmp_path)
    assert caught.value.errno == errno.ENOSPC
    assert sorted(os.listdir(tmp_path)) == before  # no final name, no temporary file
    monkeypatch.delenv(faults.FAULTS_ENV)
    WRITES[kind](tmp_path)  # the disk has room again: the same write succeeds
    assert (tmp_path / "f.bin").exists()


def test_segrep_write_on_a_full_disk_is_one_line_and_commits_nothing(sqlite_env: Env, tmp_path: Path) -> None:
    src = tmp_path / "in.parquet"
    pq.write_table(orders([1, 2, 3, 200_000]), src)
    sites_before = tree_state(sqlite_env.root / "data" / "sites")
    segrep = str(Path(sys.executable).with_name("segrep"))
    proc = subprocess.run(
        [segrep, "--config", str(sqlite_env.config), "--catalog", sqlite_env.url, "write", "orders", str(src)],
        env={**os.environ, faults.FAULTS_ENV: "disk_full:enospc"},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("segrep: error: OSError: [Errno 28] No space left on device")
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    after = tree_state(sqlite_env.root / "data" / "sites")
    assert {k: v for k, v in after.items() if v != "dir"} == {k: v for k, v in sites_before.items() if v != "dir"}
    assert segment_rows(sqlite_env.catalog, "primary") == []
