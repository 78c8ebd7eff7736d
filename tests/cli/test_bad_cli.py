"""Bad input to `segrep read` and to the catalog options, and the command-line forms of every user error.

Each case: exit code 2, one line naming the problem, no traceback, and nothing written (the catalog's rows and
every file under the environment's root identical before and after). The cases are generated: every place an
export must never land, every out-of-range number, garbage catalog URLs.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from segrep.catalog.revisions import head_revision
from segrep.spark import launch
from tests.support.badinput import assert_user_error, tree_state, unchanged
from tests.support.cli import cli, cli_command
from tests.support.env import Env
from tests.support.rounds import no_spark
from tests.support.tables import orders

FUNCTION_SCOPED = settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _segment_file(env: Env, site: str = "primary") -> Path:
    return next((env.site_dir(site) / "orders").rglob("*.parquet"))


# Every place `read -o` must never write, as a function of the environment.
PROTECTED: dict[str, Callable[[Env], Path]] = {
    "the catalog database": lambda env: env.root / "catalog.db",
    "the catalog's WAL": lambda env: env.root / "catalog.db-wal",
    "a live segment file": _segment_file,
    "a new file under a site root": lambda env: env.site_dir("dr") / "orders" / "new.parquet",
    "a replica site's root": lambda env: env.site_dir("dr"),
    "the work directory": lambda env: env.root / "data" / "work" / "out.parquet",
    "the definitions file": lambda env: env.config,
}


@pytest.mark.parametrize("what", sorted(PROTECTED))
def test_read_output_never_lands_on_segrep_state(loaded_sqlite: Env, what: str) -> None:
    target = PROTECTED[what](loaded_sqlite)
    fmt = [] if target.suffix in (".parquet", ".csv") else ["--format", "csv"]
    with unchanged(loaded_sqlite):
        for extra in ([], ["--overwrite"]):
            code, out, err = cli(loaded_sqlite, "read", "orders", "-o", str(target), *fmt, *extra)
            assert_user_error(code, out, err, "will not write")
    assert cli(loaded_sqlite, "status")[0] == 0  # the catalog still opens


def test_read_output_through_a_symlink_to_the_catalog_is_refused(loaded_sqlite: Env, tmp_path: Path) -> None:
    link = tmp_path / "export.parquet"
    link.symlink_to(loaded_sqlite.root / "catalog.db")
    with unchanged(loaded_sqlite):
        assert_user_error(*cli(loaded_sqlite, "read", "orders", "-o", str(link), "--overwrite"), "catalog database")


def test_read_output_replaces_an_existing_file_only_with_overwrite(loaded_sqlite: Env, tmp_path: Path) -> None:
    out_file = tmp_path.parent / f"{tmp_path.name}-export.csv"  # outside the environment's root
    out_file.write_text("precious\n")
    with unchanged(loaded_sqlite):
        assert_user_error(*cli(loaded_sqlite, "read", "orders", "-o", str(out_file)), "already exists", "--overwrite")
    assert out_file.read_text() == "precious\n"
    code, _out, err = cli(loaded_sqlite, "read", "orders", "-o", str(out_file), "--overwrite")
    assert code == 0, err
    assert out_file.read_text().count("\n") == 5  # header + 4 rows
    assert not [p for p in out_file.parent.iterdir() if p.name.startswith(f".{out_file.name}")]  # no temp left


def test_read_output_into_a_missing_directory_or_a_directory(loaded_sqlite: Env, tmp_path: Path) -> None:
    with unchanged(loaded_sqlite):
        assert_user_error(*cli(loaded_sqlite, "read", "orders", "-o", str(tmp_path / "no" / "x.csv")), "does not exist")
        assert_user_error(
            *cli(loaded_sqlite, "read", "orders", "-o", str(loaded_sqlite.root / "data"), "--format", "csv")
        )


@FUNCTION_SCOPED
@given(
    option=st.sampled_from(["--as-of", "--limit"]),
    value=st.one_of(
        st.integers(min_value=2**63, max_value=10**40),
        st.integers(max_value=-1),
        st.sampled_from(["1e3", "nan", "", "ten", "0x10", "1.5"]),
    ),
)
def test_read_numbers_out_of_range_are_refused_by_the_option(loaded_sqlite: Env, option: str, value: object) -> None:
    with unchanged(loaded_sqlite):
        assert_user_error(*cli(loaded_sqlite, "read", "orders", option, str(value)), option)


@pytest.mark.parametrize(
    "args",
    [
        ("segments", "orders", "--partition", str(2**70)),
        ("compact", "orders", "--partition", "-1"),
        ("compact", "orders", "--partition", str(2**31)),  # partition ids are 32-bit in the catalog
        ("segments", "orders", "--partition", "0"),
        ("split", "orders", str(2**64), "--at", "5"),
        ("read", "orders", "--format", "xml"),
        ("read",),
        ("no-such-command",),
        ("bootstrap", "orders", "dr", "--mode", "merge"),
    ],
)
def test_usage_errors_are_one_line(loaded_sqlite: Env, args: tuple[str, ...]) -> None:
    with unchanged(loaded_sqlite):
        line = assert_user_error(*cli(loaded_sqlite, *args))
    assert "--help" in line


@pytest.mark.parametrize("until", [str(2**63), "99999999999999999999999", "yesterday", "-5", "2026-13-01"])
def test_round_until_out_of_range_or_not_a_time(loaded_sqlite: Env, until: str) -> None:
    with unchanged(loaded_sqlite):
        assert_user_error(*cli(loaded_sqlite, "round", "orders", "--until", until), "--until")


def test_a_round_that_finds_a_damaged_file_names_it_and_exits_1(loaded_sqlite: Env) -> None:
    victim = _segment_file(loaded_sqlite)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    code, out, err = cli(loaded_sqlite, "round", "orders")
    assert code == 1, (out, err)
    assert err.count("\n") == 1 and "failed verification" in err and "Traceback" not in err
    segment_id = victim.stem
    assert f"INVALID: segment {segment_id}" in out and str(victim) in out and "at primary" in out, out


def test_compact_names_a_partition_the_table_does_not_have(loaded_sqlite: Env) -> None:
    with unchanged(loaded_sqlite):
        assert_user_error(*cli(loaded_sqlite, "compact", "orders", "--partition", "999"), "no partition 999", "orders")


def test_compaction_of_a_truncated_segment_fails_naming_the_file(
    loaded_sqlite: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for keys in ([4, 5], [6, 7]):
        pq.write_table(orders(keys), tmp_path / "more.parquet")
        assert cli(loaded_sqlite, "write", "orders", str(tmp_path / "more.parquet"))[0] == 0
    victim = max(
        (loaded_sqlite.site_dir("primary") / "orders" / "1").glob("*.parquet"), key=lambda p: p.stat().st_mtime
    )
    victim.write_bytes(victim.read_bytes()[:200])
    monkeypatch.setattr(launch, "submit", no_spark)  # a small fold runs in process
    sites_before = tree_state(loaded_sqlite.root / "data" / "sites")
    code, _out, err = cli(loaded_sqlite, "compact", "orders", "--force")
    assert code == 1, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert victim.name in err and "does not match the catalog" in err
    assert tree_state(loaded_sqlite.root / "data" / "sites") == sites_before  # no major segment was written


# -- catalog URLs ----------------------------------------------------------------------------------------------


def test_a_read_only_command_creates_no_sqlite_catalog(sqlite_env: Env, tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir" / "cat.db"
    for command in (["status"], ["table", "list"], ["read", "orders"], ["site", "list"]):
        code, out, err = cli(sqlite_env, "--catalog", f"sqlite:///{missing}", *command)
        assert_user_error(code, out, err, "does not exist", "segrep init")
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("mysql://user@127.0.0.1/db", "unsupported catalog URL"),
        ("oracle://x", "unsupported catalog URL"),
        ("postgresql://127.0.0.1:port/db", "port is not a number"),
        ("not a url", "invalid catalog URL"),
        ("://", "invalid catalog URL"),
    ],
)
def test_unusable_catalog_urls(sqlite_env: Env, url: str, needle: str) -> None:
    with unchanged(sqlite_env):
        for command in (["status"], ["init"], ["apply", "--dry-run"]):
            assert_user_error(*cli(sqlite_env, "--catalog", url, *command), needle)


def test_a_password_in_a_bad_catalog_url_is_not_printed(sqlite_env: Env) -> None:
    _code, _out, err = cli(sqlite_env, "--catalog", "postgresql://u:s3cret@127.0.0.1:port/db", "status")
    assert "s3cret" not in err


@FUNCTION_SCOPED
@given(
    scheme=st.sampled_from(["sqlite", "sqlite+pysqlite", "mysql", "mssql", "", "file", "s3"]),
    tail=st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30),
)
def test_generated_catalog_urls_never_crash(sqlite_env: Env, tmp_path: Path, scheme: str, tail: str) -> None:
    before = tree_state(tmp_path)
    code, out, err = cli(sqlite_env, "--catalog", f"{scheme}://{tail}", "status")
    assert code in (1, 2), (code, out, err)
    assert "Traceback" not in err and "internal error" not in err and err.count("\n") == 1, err
    assert tree_state(tmp_path) == before


def test_a_file_that_is_not_a_database(sqlite_env: Env, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    for command in (["status"], ["init"]):
        code, out, err = cli(sqlite_env, "--catalog", f"sqlite:///{garbage}", *command)
        assert_user_error(code, out, err, "not a usable database", "not a segrep catalog")
    assert garbage.read_bytes() == b"this is not a database" * 100


def test_a_catalog_at_an_unknown_revision(sqlite_env: Env) -> None:
    db = sqlite_env.root / "catalog.db"
    sqlite_env.catalog.dispose()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'zzzz'")
    with unchanged(sqlite_env, catalog=False):
        for command in (["status"], ["init"], ["apply"]):
            assert_user_error(*cli(sqlite_env, *command), "'zzzz'", "does not know")
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [("zzzz",)]
        conn.execute("UPDATE alembic_version SET version_num = ?", (head_revision(),))
    assert cli(sqlite_env, "status")[0] == 0


# -- rollback drop -----------------------------------------------------------------------------------------------


def test_rollback_drop_refuses_an_unknown_site_table_or_failover(env: Env) -> None:
    """A typo must not read as "nothing to drop" (exit 0): each unknown name or failover id is refused."""
    code, _out, err = cli(env, "failover", "orders", "--to", "dr")  # failover 1, of orders
    assert code == 0, err
    with unchanged(env):
        drop = ("rollback", "drop")
        assert_user_error(*cli(env, *drop, "orders", "--site", "nosuch"), "unknown site 'nosuch'")
        assert_user_error(*cli(env, *drop, "nosuch", "--site", "dr"), "unknown table 'nosuch'")
        assert_user_error(
            *cli(env, *drop, "orders", "--site", "dr", "--failover", "99"),
            "no failover 99 of table orders",
            "its failovers: 1",
        )
        assert_user_error(
            *cli(env, *drop, "events", "--site", "dr", "--failover", "1"), "no failover 1 of table events"
        )
        assert_user_error(*cli(env, *drop, "orders", "--site", "dr", "--failover", "0"), "--failover")
        assert_user_error(*cli(env, *drop, "orders", "--site", "dr", "--failover", str(2**63)), "--failover")
        code, out, err = cli(env, *drop, "orders", "--site", "primary", "--failover", "1")
        assert code == 0 and out.strip() == "no rollback file matched", out + err


@pytest.mark.parametrize(
    "command",
    [["read", "orders"], ["status"], ["table", "list"], ["site", "list"], ["segments", "orders"], ["apply"]],
)
def test_an_empty_catalog_file_is_refused_and_left_empty(sqlite_env: Env, command: list[str]) -> None:
    """Opening an empty file made it a SQLite database (the connection's WAL pragma writes a header): a
    command other than `init` must leave it as it is, empty, and say how to make it a catalog."""
    empty = sqlite_env.root / "empty.db"
    empty.touch()
    url = f"sqlite:///{empty}"
    with unchanged(sqlite_env):
        assert_user_error(*cli(sqlite_env, "--catalog", url, *command), "is not initialized", "segrep init")
    assert empty.stat().st_size == 0
    code, out, err = cli(sqlite_env, "--catalog", url, "init")
    assert code == 0 and "upgraded from empty" in out, out + err
    assert cli(sqlite_env, "--catalog", url, "status")[0] == 0


def test_an_unresolvable_postgresql_host_fails_at_once_with_its_url_redacted(sqlite_env: Env) -> None:
    url = "postgresql://segrep:s3cret@catalog.invalid/segrep"
    started = time.monotonic()
    run = subprocess.run(
        cli_command(sqlite_env, "--catalog", url, "status"), capture_output=True, text=True, timeout=60
    )
    assert time.monotonic() - started < 15, run.stderr
    assert run.returncode == 1 and run.stderr.count("\n") == 1, run.stderr
    assert "postgresql://segrep:***@catalog.invalid/segrep unreachable" in run.stderr and "s3cret" not in run.stderr


def test_a_postgresql_server_that_never_answers_fails_within_the_connect_timeout(sqlite_env: Env) -> None:
    """A listening socket nobody serves: the connection is accepted by the kernel and then nothing is said.
    Before, the driver waited 130 s (its default) or longer; now $SEGREP_CATALOG_CONNECT_TIMEOUT_S (10 s)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"postgresql://segrep@127.0.0.1:{silent.getsockname()[1]}/segrep"
        environ = {**os.environ, "SEGREP_CATALOG_CONNECT_TIMEOUT_S": "2"}
        started = time.monotonic()
        try:
            run = subprocess.run(
                cli_command(sqlite_env, "--catalog", url, "status"),
                capture_output=True,
                text=True,
                env=environ,
                timeout=30,
            )
        except subprocess.TimeoutExpired:
            pytest.fail("segrep still waited for the silent server after 30 s")
        elapsed = time.monotonic() - started
    assert run.returncode == 1 and "unreachable or failing" in run.stderr and "timeout" in run.stderr, run.stderr
    assert elapsed < 15, elapsed


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan", "99999"])
def test_a_bad_connect_timeout_is_refused_by_name(sqlite_env: Env, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("SEGREP_CATALOG_CONNECT_TIMEOUT_S", value)
    with unchanged(sqlite_env):
        assert_user_error(*cli(sqlite_env, "--catalog", "postgresql://u@127.0.0.1:1/db", "status"), value)
