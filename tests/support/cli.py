"""The `segrep` command run in-process against a test environment, and environments loaded through it."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow.parquet as pq
from click.testing import CliRunner

from segrep.cli.main import main
from tests.support.env import Env
from tests.support.tables import orders


def cli(env: Env, *args: str, config: Path | None = None) -> tuple[int, str, str]:
    """Run ``segrep --config <env's definitions, or config> --catalog <env's catalog> *args``; return the exit
    code, stdout and stderr. An exception other than a normal exit propagates."""
    result = CliRunner().invoke(main, ["--config", str(config or env.config), "--catalog", env.url, *args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def cli_command(env: Env, *args: str) -> list[str]:
    """The argv of ``segrep`` (this venv's) against the environment, for a test that runs it as a process."""
    segrep = str(Path(sys.executable).with_name("segrep"))
    return [segrep, "--config", str(env.config), "--catalog", env.url, *args]


def load_orders(env: Env, tmp_path: Path) -> Env:
    """``segrep write orders`` of four rows (keys 1, 2, 3 and 200,000: two partitions) from a Parquet file in
    ``tmp_path``, which is deleted afterwards (a test comparing every file under the environment sees none of
    it); return ``env``."""
    src = tmp_path / "in.parquet"
    pq.write_table(orders([1, 2, 3, 200_000]), src)
    code, out, err = cli(env, "write", "orders", str(src))
    assert code == 0, err
    assert "wrote 4 row(s) of orders" in out
    src.unlink()
    return env
