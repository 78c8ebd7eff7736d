"""The `segrep` command: happy paths, and bad input that gets one clear line, exit code 2, and no change to
the catalog or the site directories."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from sqlalchemy import select

from segrep.catalog.models import Base
from segrep.cli.main import main
from tests.support.cli import cli as run
from tests.support.env import Env
from tests.support.tables import orders


def state(env: Env) -> tuple[dict, dict]:
    """Every catalog row and every file (with its hash) under the data directory."""
    rows = {}
    with env.catalog.read() as s:
        for table in Base.metadata.sorted_tables:
            rows[table.name] = sorted(map(repr, s.execute(select(table)).all()))
    files = {
        str(p.relative_to(env.root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in (env.root / "data").rglob("*")
        if p.is_file()
    }
    return rows, files


def test_read_write_segments_and_listing(loaded: Env, tmp_path: Path) -> None:
    keys = tmp_path / "del.csv"
    keys.write_text("o_orderkey\n2\n")
    code, out, err = run(loaded, "write", "orders", str(keys), "--delete")
    assert code == 0, err
    out_file = tmp_path / "out.parquet"
    code, out, _ = run(loaded, "read", "orders", "-o", str(out_file))
    assert code == 0 and "wrote 3 row(s)" in out
    assert sorted(pq.read_table(out_file).column("o_orderkey").to_pylist()) == [1, 3, 200_000]
    csv_file = tmp_path / "out.csv"
    assert run(loaded, "read", "orders", "-o", str(csv_file))[0] == 0
    assert csv_file.read_text().count("\n") == 4  # header + 3 rows
    code, out, _ = run(loaded, "read", "orders", "--limit", "1")
    assert code == 0 and "3 row(s) in orders at the leaders" in out
    code, out, _ = run(loaded, "segments", "orders", "--site", "primary", "--partition", "1")
    assert code == 0 and "major" in out and "minor" in out and "placement 1 (leader, LIVE)" in out
    for args in (["site", "list"], ["table", "list"], ["table", "describe", "orders"], ["apply", "--dry-run"]):
        code, out, err = run(loaded, *args)
        assert code == 0, (args, err)
    assert "nothing to change" in run(loaded, "apply")[1]
    assert "is up to date" in run(loaded, "init")[1]


BAD_CASES = [
    (["write", "../etc", "{good}"], "invalid table name '../etc'"),
    (["write", "Orders", "{good}"], "invalid table name 'Orders'"),
    (["write", "nope", "{good}"], "unknown table 'nope'"),
    (["read", "orders", "--site", "../../tmp"], "invalid site name '../../tmp'"),
    (["read", "orders", "--site", "mars"], "unknown site 'mars'"),
    (["segments", "orders", "--site", "a/b"], "invalid site name 'a/b'"),
    (["write", "orders", "{missing_col}"], "batch lacks columns: o_comment"),
    (["write", "orders", "{wrong_type}"], "column o_custkey has type string"),
    (["write", "orders", "{extra_col}"], "columns the table does not: surprise"),
    (["write", "orders", "{null_key}"], "key column o_orderkey has 1 null"),
    (["write", "orders", "{good}", "--delete"], "batch has columns the table does not"),
    (["write", "orders", "{garbage}"], "cannot read"),
    (["write", "orders", "{nowhere}"], "no such file"),
    (["write", "orders", "{unknown_suffix}"], "cannot tell the format"),
    (["read", "orders", "-o", "{out_bin}"], "cannot tell the format"),
    (["catalog", "rebuild", "--site", "mars"], "unknown site 'mars'"),
]


@pytest.mark.parametrize(("args", "message"), BAD_CASES, ids=[c[1][:30] for c in BAD_CASES])
def test_bad_input_is_one_clear_line_and_changes_nothing(
    loaded: Env, tmp_path: Path, args: list[str], message: str
) -> None:
    files = {
        "good": orders([7]),
        "missing_col": orders([7]).drop_columns(["o_comment"]),
        "wrong_type": orders([7]).set_column(1, "o_custkey", pa.array(["seven"])),
        "extra_col": orders([7]).append_column("surprise", pa.array([1])),
        "null_key": orders([7]).set_column(0, "o_orderkey", pa.array([None], pa.int64())),
    }
    paths = {}
    for name, table in files.items():
        paths[name] = tmp_path / f"{name}.parquet"
        pq.write_table(table, paths[name])
    paths["garbage"] = tmp_path / "garbage.parquet"
    paths["garbage"].write_bytes(b"PAR1 this is not parquet")
    paths["nowhere"] = tmp_path / "nowhere.parquet"
    paths["unknown_suffix"] = tmp_path / "rows.xlsx"
    paths["unknown_suffix"].write_bytes(b"x")
    paths["out_bin"] = tmp_path / "out.bin"
    before = state(loaded)
    code, out, err = run(loaded, *[a.format(**{k: str(v) for k, v in paths.items()}) for a in args])
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("segrep: error: ") and message in err, err
    assert "Traceback" not in err + out
    assert state(loaded) == before


def test_malformed_config_and_uninitialized_catalog(env: Env, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("sites: {primary: {id: 1, uri: x, colour: red}}\n")
    code, _, err = run(env, "apply", config=bad)
    assert code == 2 and "unknown key(s) colour" in err and str(bad) in err
    bad.write_text("sites: [unclosed\n")
    code, _, err = run(env, "apply", config=bad)
    assert code == 2 and "not valid YAML" in err
    code, _, err = run(env, "apply", config=tmp_path / "absent.yaml")
    assert code == 2 and "cannot read definitions file" in err
    fresh = CliRunner().invoke(
        main, ["--config", str(env.config), "--catalog", f"sqlite:///{tmp_path}/new.db", "table", "list"]
    )
    assert fresh.exit_code == 2 and "does not exist: run `segrep init`" in fresh.stderr
    assert not (tmp_path / "new.db").exists()
    empty = tmp_path / "empty.db"
    empty.touch()  # an empty SQLite file is a database without segrep's tables
    fresh = CliRunner().invoke(main, ["--config", str(env.config), "--catalog", f"sqlite:///{empty}", "table", "list"])
    assert fresh.exit_code == 2 and "not initialized: run `segrep init`" in fresh.stderr
