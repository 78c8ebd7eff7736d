"""The `segrep` command run in-process against a test environment."""

from __future__ import annotations

import sys
from pathlib import Path

from click.testing import CliRunner

from segrep.cli.main import main
from tests.support.env import Env


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
