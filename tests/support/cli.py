"""The `segrep` command run in-process against a test environment."""

from __future__ import annotations

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
