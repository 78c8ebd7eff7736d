"""Position delete files as a publication writes them (``iceberg_files.position_deletes``): a data file with many
hidden rows gets a delete file of its own, which readers match to that file alone; the others share one. Each
file is sorted by path and position, as the Iceberg spec asks, and together they hide exactly the rows given."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.manifest import DataFileContent
from pyiceberg.table.delete_file_index import _referenced_data_file_path

from segrep.publish import iceberg_files as files
from segrep.publish.hidden_rows import FILE_COL, POS_COL
from segrep.publish.site_io import SiteFileIO, local_io_properties


def _hidden(counts: dict[str, int]) -> pa.Table:
    """``counts[rel]`` positions of each file, the files interleaved and the positions descending (unsorted)."""
    rows = [(rel, pos) for pos in range(max(counts.values()) - 1, -1, -1) for rel, n in counts.items() if pos < n]
    return pa.table({FILE_COL: [r for r, _ in rows], POS_COL: pa.array([p for _, p in rows], pa.int64())})


def _read(path: str) -> list[tuple[str, int]]:
    rows = pq.read_table(path.removeprefix("file://"))
    return list(zip(rows.column("file_path").to_pylist(), rows.column("pos").to_pylist(), strict=True))


def test_a_file_with_many_hidden_rows_gets_its_own_delete_file_and_the_others_share_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "OWN_DELETE_FILE_ROWS", 5)
    io = SiteFileIO(local_io_properties(str(tmp_path)))
    location = f"file://{tmp_path}/t/_iceberg"
    counts = {"t/p1/c.parquet": 7, "t/p0/a.parquet": 2, "t/p0/b.parquet": 5, "t/p2/d.parquet": 1}
    uris = {rel: f"file://{tmp_path}/{rel}" for rel in counts}

    made = files.position_deletes(io, location, 42, _hidden(counts), uris)

    assert all(f.content == DataFileContent.POSITION_DELETES for f in made)
    by_target = {_referenced_data_file_path(f): f for f in made}
    # b and c (5 and 7 rows) each alone, named as both bounds; a and d together
    assert set(by_target) == {uris["t/p0/b.parquet"], uris["t/p1/c.parquet"], None}
    written = {target: _read(f.file_path) for target, f in by_target.items()}
    for target, rows in written.items():
        assert rows == sorted(rows), target  # by path, then position
        assert by_target[target].record_count == len(rows)
    assert written[uris["t/p1/c.parquet"]] == [(uris["t/p1/c.parquet"], p) for p in range(7)]
    shared = by_target[None]
    assert {path for path, _ in written[None]} == {uris["t/p0/a.parquet"], uris["t/p2/d.parquet"]}
    assert shared.lower_bounds[files.FILE_PATH_ID] == uris["t/p0/a.parquet"].encode()
    assert shared.upper_bounds[files.FILE_PATH_ID] == uris["t/p2/d.parquet"].encode()
    every = sorted(row for rows in written.values() for row in rows)
    assert every == sorted((uris[rel], p) for rel, n in counts.items() for p in range(n))


def test_few_hidden_rows_make_one_shared_file_and_none_make_nothing(tmp_path: Path) -> None:
    io = SiteFileIO(local_io_properties(str(tmp_path)))
    location = f"file://{tmp_path}/t/_iceberg"
    counts = {"t/p0/a.parquet": 3, "t/p0/b.parquet": 2}
    uris = {rel: f"file://{tmp_path}/{rel}" for rel in counts}

    (only,) = files.position_deletes(io, location, 7, _hidden(counts), uris)
    assert _read(only.file_path) == sorted((uris[rel], p) for rel, n in counts.items() for p in range(n))
    assert _referenced_data_file_path(only) is None
    assert files.position_deletes(io, location, 8, _hidden(counts).slice(0, 0), uris) == []
