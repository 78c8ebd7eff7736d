"""`segrep table rewrite SOURCE --into TARGET`: the way out of a schema change apply refuses. The source's
visible rows (updates and deletes resolved, two partitions) are copied into a table of the new shape, each
column converted by the writer's strict conform: a narrowing that fits is copied, one that does not and a type
family change are refused naming the column with nothing written, --map renames, --dry-run writes nothing.
A target holding rows is refused unless --into-nonempty; the copy is one commit, so a crash half-way leaves
the target as it was and a re-run copies exactly the source's rows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from segrep.core import faults
from segrep.data.reader import read_table
from segrep.data.writer import write_batch
from tests.support.badinput import assert_user_error, catalog_rows, unchanged
from tests.support.cli import cli
from tests.support.env import Env, make_env

COLUMNS = "{k: int64, n: int64, s: string, label: string}"
YAML = f"""
data_dir: data
sites:
  primary: {{id: 1, uri: sites/primary}}
tables:
  src:
    columns: {COLUMNS}
    primary_key: [k]
    split_points: [100]
    leader: primary
  narrow:
    columns: {{k: int64, n: int32, s: string, label: string}}
    primary_key: [k]
    leader: primary
  typed:
    columns: {{k: int64, n: int64, s: int64, label: string}}
    primary_key: [k]
    leader: primary
  renamed:
    columns: {{k: int64, n: int64, s: string, name: string}}
    primary_key: [k]
    split_points: [50]
    leader: primary
"""
KEYS = [1, 2, 3, 150, 151]  # both partitions of src


@pytest.fixture
def rewrite_env(tmp_path: Path) -> Iterator[Env]:
    e = make_env(tmp_path, f"sqlite:///{tmp_path}/catalog.db", YAML)
    write_batch(e.catalog, "src", batch(KEYS))
    write_batch(e.catalog, "src", batch([2], label="updated"))
    write_batch(e.catalog, "src", pa.table({"k": pa.array([3], pa.int64())}), delete=True)
    yield e
    e.catalog.dispose()


def batch(keys: list[int], *, label: str = "l", big: int | None = None) -> pa.Table:
    return pa.table(
        {
            "k": pa.array(keys, pa.int64()),
            "n": pa.array([big if big is not None else k * 10 for k in keys], pa.int64()),
            "s": [str(k) for k in keys],  # numeric strings: still no integers
            "label": [f"{label}{k}" for k in keys],
        }
    )


def rows(rewrite_env: Env, table: str) -> list[dict[str, Any]]:
    return sorted(read_table(rewrite_env.catalog, table).to_pylist(), key=lambda r: r["k"])


def source_rows(label: str = "label") -> list[dict[str, Any]]:
    out = []
    for k in (1, 2, 150, 151):
        out.append({"k": k, "n": k * 10, "s": str(k), label: f"{'updated' if k == 2 else 'l'}{k}"})
    return out


def test_a_narrowing_that_fits_is_copied_in_one_commit(rewrite_env: Env) -> None:
    code, out, err = cli(rewrite_env, "table", "rewrite", "src", "--into", "narrow")
    assert code == 0, err
    assert out.splitlines() == [
        "wrote 4 row(s) of src into narrow in one commit (4 read from 2 source partition(s), 2 segment(s))",
        "  k -> k (int64)",
        "  n -> n (int64 -> int32)",
        "  s -> s (string)",
        "  label -> label (string)",
    ]
    got = read_table(rewrite_env.catalog, "narrow")
    assert got.schema.field("n").type == pa.int32()
    assert sorted(got.to_pylist(), key=lambda r: r["k"]) == source_rows()


def test_a_narrowing_that_does_not_fit_is_refused_and_nothing_is_written(rewrite_env: Env) -> None:
    write_batch(rewrite_env.catalog, "src", batch([151], big=2**40))  # in the second partition: the first one fits
    with unchanged(rewrite_env):
        code, out, err = cli(rewrite_env, "table", "rewrite", "src", "--into", "narrow")
    assert_user_error(code, out, err, "column n has type int64, table wants int32", "nothing was written to narrow")
    assert rows(rewrite_env, "narrow") == []


def test_a_type_family_change_is_refused_even_for_numeric_strings(rewrite_env: Env) -> None:
    with unchanged(rewrite_env):
        code, out, err = cli(rewrite_env, "table", "rewrite", "src", "--into", "typed")
    assert_user_error(code, out, err, "column s", "string column is never converted to integer")


def test_map_renames_a_column(rewrite_env: Env) -> None:
    with unchanged(rewrite_env):
        code, out, err = cli(rewrite_env, "table", "rewrite", "src", "--into", "renamed")
    assert_user_error(code, out, err, "src column(s) label have no column in renamed", "get no column", "--map")
    code, out, err = cli(rewrite_env, "table", "rewrite", "src", "--into", "renamed", "--map", "label=name")
    assert code == 0, err
    assert "  label -> name (string)" in out.splitlines()
    assert rows(rewrite_env, "renamed") == source_rows("name")


def test_dry_run_checks_and_writes_nothing(rewrite_env: Env) -> None:
    with unchanged(rewrite_env):
        code, out, err = cli(
            rewrite_env, "table", "rewrite", "src", "--into", "renamed", "--map", "label=name", "--dry-run"
        )
    assert code == 0, err
    assert out.splitlines()[0] == (
        "would write 4 row(s) of src into renamed in one commit (read from 2 source partition(s), one at a time)"
    )
    assert "  label -> name (string)" in out.splitlines()
    with unchanged(rewrite_env):  # a dry run checks every value as the copy would
        code, out, err = cli(rewrite_env, "table", "rewrite", "src", "--into", "typed", "--dry-run")
    assert_user_error(code, out, err, "column s")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--into", "src"], ["the source table src itself"]),
        (["--into", "nope"], ["nope"]),
        (["--into", "renamed", "--map", "label"], ["--map 'label'", "OLD=NEW"]),
        (["--into", "renamed", "--map", "nope=name"], ["--map names column(s) nope"]),
        (["--into", "renamed", "--map", "label=name", "--map", "s=name"], ["both be copied into name"]),
    ],
)
def test_bad_arguments_are_refused(rewrite_env: Env, args: list[str], needles: list[str]) -> None:
    with unchanged(rewrite_env):
        code, out, err = cli(rewrite_env, "table", "rewrite", "src", *args)
    assert_user_error(code, out, err, *needles)


def test_apply_refusals_name_the_rewrite_of_the_table(rewrite_env: Env) -> None:
    """The way out a refused narrowing names is this command, for this table."""
    rewrite_env.config.write_text(
        YAML.replace(f"columns: {COLUMNS}", "columns: {k: int64, n: int32, s: string, label: string}")
    )
    with unchanged(rewrite_env):
        code, out, err = cli(rewrite_env, "apply")
    assert_user_error(code, out, err, "column n", "int64 -> int32", "`segrep table rewrite src --into NEW_TABLE`")


def test_a_source_written_at_two_schema_versions_is_copied_at_its_current_one(rewrite_env: Env) -> None:
    """Rows of src written before and after a rename of label to name (segments of versions 1 and 2) are
    copied as the current version reads them: no --map needed for the renamed column."""
    rewrite_env.config.write_text(
        YAML.replace(
            f"columns: {COLUMNS}", "columns: {k: int64, n: int64, s: string, name: {type: string, renamed_from: label}}"
        )
    )
    code, _out, err = cli(rewrite_env, "apply")
    assert code == 0, err
    write_batch(rewrite_env.catalog, "src", pa.table({"k": [160], "n": [1600], "s": ["160"], "name": ["new160"]}))
    code, out, err = cli(rewrite_env, "table", "rewrite", "src", "--into", "renamed")
    assert code == 0, err
    assert "  name -> name (string)" in out.splitlines()
    want = [*source_rows("name"), {"k": 160, "n": 1600, "s": "160", "name": "new160"}]
    assert rows(rewrite_env, "renamed") == sorted(want, key=lambda r: r["k"])


def test_a_target_holding_rows_is_refused_unless_into_nonempty(rewrite_env: Env) -> None:
    """A copy into a table with rows would upsert over them (a mix of both tables): refused naming the table
    and what it holds, nothing written; --into-nonempty copies over them (source rows win by key)."""
    write_batch(
        rewrite_env.catalog, "narrow", pa.table({"k": [2, 500], "n": [0, 5], "s": ["x", "y"], "label": ["z", "z"]})
    )
    with unchanged(rewrite_env):
        code, out, err = cli(rewrite_env, "table", "rewrite", "src", "--into", "narrow")
    assert_user_error(
        code, out, err, "table narrow already holds 2 row(s) (1 segment(s) at its leaders)", "nothing was written"
    )
    with unchanged(rewrite_env):  # the dry run says so too
        code, out, err = cli(rewrite_env, "table", "rewrite", "src", "--into", "narrow", "--dry-run")
    assert_user_error(code, out, err, "--into-nonempty")
    code, out, err = cli(rewrite_env, "table", "rewrite", "src", "--into", "narrow", "--into-nonempty")
    assert code == 0, err
    assert rows(rewrite_env, "narrow") == [*source_rows(), {"k": 500, "n": 5, "s": "y", "label": "z"}]  # k=2: src's
    write_batch(rewrite_env.catalog, "renamed", pa.table({"k": [7], "n": [1], "s": ["s"], "name": ["n"]}))
    write_batch(rewrite_env.catalog, "renamed", pa.table({"k": [7]}), delete=True)  # no row left: empty again
    code, out, err = cli(rewrite_env, "table", "rewrite", "src", "--into", "renamed", "--map", "label=name")
    assert code == 0, err
    assert rows(rewrite_env, "renamed") == source_rows("name")


def test_a_crash_half_way_leaves_the_target_as_it_was_and_a_rerun_copies_exactly_the_source(
    rewrite_env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first source partition's files are written, then the process dies: nothing is registered (the
    files are removed), so the target holds no row of a half copy; the re-run needs no flag and converges."""
    before = catalog_rows(rewrite_env)
    monkeypatch.setenv(faults.FAULTS_ENV, "write_between_batches")
    with pytest.raises(faults.InjectedFault):
        cli(rewrite_env, "table", "rewrite", "src", "--into", "narrow")
    monkeypatch.delenv(faults.FAULTS_ENV)
    assert catalog_rows(rewrite_env) == before
    assert rows(rewrite_env, "narrow") == []
    assert list((rewrite_env.site_dir("primary") / "narrow").rglob("*.parquet")) == []
    code, _out, err = cli(rewrite_env, "table", "rewrite", "src", "--into", "narrow")
    assert code == 0, err
    assert rows(rewrite_env, "narrow") == source_rows()
