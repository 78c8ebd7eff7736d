"""The short, seeded version of ``bench/drills.py`` (issue 32): every drill that needs no Spark, one kill per
command, each ending with every site compared row for row with the replay of the acknowledged writes. A drill
that loses or corrupts a row, or does not converge within 2 rounds after healing, exits 1 with the reason.

Two halves, so that each stays well under 2 minutes on 2 cores; the full run (5 kills per command, the Spark
drills too) is ``make bench-drills``, its figures in the README.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[1] / "bench" / "drills.py"
HALVES = {
    "disasters": "site_vanishes,catalog_lost,leader_file_lost,return_rollback,pg_restart",
    "kills": "kill_repair,kill_gc,kill_failover,kill_switchover,kill_bootstrap",
}


@pytest.mark.parametrize("half", sorted(HALVES))
def test_the_short_drills_lose_nothing_serve_nothing_wrong_and_converge(half: str, tmp_path: Path) -> None:
    out = tmp_path / "drills.json"
    args = ["--short", "--seed", "3", "--drills", HALVES[half], "--json", str(out)]
    done = subprocess.run(
        [sys.executable, str(BENCH), *args], cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False
    )
    report = f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, report
    assert "Traceback" not in done.stderr, report
    outcomes = {o["drill"]: o for o in json.loads(out.read_text())}
    assert sorted(outcomes) == sorted(HALVES[half].split(",")), report
    for name, o in outcomes.items():
        if o["skipped"]:
            assert name == "pg_restart" and "PostgreSQL binaries" in o["skipped"], report
            continue
        assert o["ok"] and (o["lost"], o["wrong"]) == (0, 0), (name, report)
        assert o["rounds_to_converge"] and all(1 <= r <= 2 for r in o["rounds_to_converge"]), (name, report)
        assert o["rows"] > 0, (name, report)
    if half == "disasters":
        assert outcomes["return_rollback"]["set_aside"] > 0, report  # the rows primary alone held
