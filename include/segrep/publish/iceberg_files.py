"""Writing an Iceberg snapshot's files: position deletes, the winners index, manifests and the manifest list.

pyiceberg writes data manifests; a manifest of delete files differs only in its ``content`` (the manifest
list entry and the Avro file's metadata say "deletes"), which ``_DeleteManifestWriter`` sets. Every file is
written under a new name: nothing a committed snapshot references is ever overwritten, so a publication
killed halfway leaves the previous snapshot readable and at most unreferenced files behind.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.avro.codecs import AvroCompressionCodec
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record, TableVersion

from segrep.publish.hidden_rows import FILE_COL, POS_COL

FORMAT_VERSION: TableVersion = 2
_AVRO_CODEC: AvroCompressionCodec = "deflate"
# the reserved field ids of a position delete file's columns (Iceberg spec, "Position Delete Files")
FILE_PATH_ID = 2147483546
POS_ID = 2147483545
_DELETE_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(FILE_PATH_ID)}),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_ID)}),
    ]
)


class _DeleteManifestWriter(ManifestWriterV2):
    """A v2 manifest of delete files."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


# a data file with at least this many rows hidden by one publication gets a delete file of its own; the others share
# one. A reader matches a delete file naming one data file to that file alone, while one naming many is read for
# each of them (pyiceberg filters it once per data file it names; engines reading deletes per data file scan it
# whole): after consolidations its cost grows with files times rows. Many small delete files would cost each
# publication a write per data file touched (a round of scattered updates touches thousands).
OWN_DELETE_FILE_ROWS = 1024

# files under the table's Iceberg directory no retained snapshot lists are deleted once older than this
# (metadata_gc): a file that young may belong to a publication still under way in another process
ORPHAN_GRACE_S = 600


def new_name(location: str, directory: str, stem: str, ext: str) -> str:
    return f"{location}/{directory}/{stem}-{uuid.uuid4().hex}.{ext}"


def write_parquet(io: FileIO, path: str, table: pa.Table) -> int:
    """Write ``table`` to a new file ``path``; its size in bytes."""
    out = io.new_output(path)
    with out.create(overwrite=False) as stream:
        pq.write_table(table, stream)
    return len(io.new_input(path))


def write_bytes(io: FileIO, path: str, data: bytes) -> None:
    """Write ``data`` to a new file ``path``."""
    with io.new_output(path).create(overwrite=False) as stream:
        stream.write(data)


def position_deletes(
    io: FileIO, location: str, snapshot_id: int, hidden: pa.Table, uris: Mapping[str, str]
) -> list[DataFile]:
    """The position delete files for the rows ``hidden`` (``_file`` relative paths, ``_pos``), each sorted by file
    path and position as the spec asks: one of its own for each data file with at least
    ``OWN_DELETE_FILE_ROWS`` of them, one shared by the others; none when nothing is hidden."""
    if hidden.num_rows == 0:
        return []
    # the paths through their dictionary (a few files, many rows), sorted by each path's rank, not as strings
    rels = hidden.column(FILE_COL).combine_chunks().dictionary_encode()
    names = pa.array([uris[rel] for rel in rels.dictionary.to_pylist()], pa.string())
    rank = pa.array(np.argsort(np.argsort(names.to_numpy(zero_copy_only=False))), pa.int32())
    pos = hidden.column(POS_COL).combine_chunks().cast(pa.int64())
    ranks = pc.take(rank, rels.indices)
    order = pc.sort_indices(pa.table({"r": ranks, "p": pos}), sort_keys=[("r", "ascending"), ("p", "ascending")])
    paths = pa.DictionaryArray.from_arrays(rels.indices, names).cast(pa.string())
    rows = pa.table([paths, pos], schema=_DELETE_SCHEMA).take(order)
    # each data file's rows are one run of the sorted rows
    sorted_ranks = pc.take(ranks, order).to_numpy()
    starts = np.flatnonzero(np.concatenate([[True], sorted_ranks[1:] != sorted_ranks[:-1]]))
    ends = np.append(starts[1:], len(sorted_ranks))
    out: list[DataFile] = []
    shared: list[pa.Table] = []
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        run = rows.slice(start, end - start)
        if run.num_rows >= OWN_DELETE_FILE_ROWS:
            out.append(_delete_file(io, location, snapshot_id, run))
        else:
            shared.append(run)
    if shared:
        out.append(_delete_file(io, location, snapshot_id, pa.concat_tables(shared)))
    return out


def _delete_file(io: FileIO, location: str, snapshot_id: int, rows: pa.Table) -> DataFile:
    """``rows`` (sorted by path and position) written as a new position delete file; its first and last path
    are its bounds, the same path when it names one data file (readers then match it to that file alone)."""
    path = new_name(location, "deletes", str(snapshot_id), "parquet")
    size = write_parquet(io, path, rows)
    first, last = rows.column("file_path")[0].as_py(), rows.column("file_path")[-1].as_py()
    return DataFile.from_args(
        _table_format_version=FORMAT_VERSION,
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=rows.num_rows,
        file_size_in_bytes=size,
        lower_bounds={FILE_PATH_ID: first.encode()},
        upper_bounds={FILE_PATH_ID: last.encode()},
    )


def data_file(uri: str, row_count: int, byte_size: int) -> DataFile:
    """A segment file as an Iceberg data file (the catalog's size and row count: the file is the segment)."""
    return DataFile.from_args(
        _table_format_version=FORMAT_VERSION,
        content=DataFileContent.DATA,
        file_path=uri,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=row_count,
        file_size_in_bytes=byte_size,
    )


def manifest(
    io: FileIO, location: str, schema: Schema, snapshot_id: int, files: Sequence[DataFile], *, deletes: bool
) -> ManifestFile | None:
    """A manifest adding ``files`` in snapshot ``snapshot_id``; None for no file."""
    if not files:
        return None
    output = io.new_output(new_name(location, "metadata", f"{snapshot_id}-m", "avro"))
    spec = UNPARTITIONED_PARTITION_SPEC
    writer = (
        _DeleteManifestWriter(spec, schema, output, snapshot_id, _AVRO_CODEC)
        if deletes
        else write_manifest(FORMAT_VERSION, spec, schema, output, snapshot_id, _AVRO_CODEC)
    )
    with writer:
        for f in files:
            writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id, data_file=f))
    return writer.to_manifest_file()


def manifest_list(
    io: FileIO,
    location: str,
    snapshot_id: int,
    parent_id: int | None,
    sequence_number: int,
    manifests: Sequence[ManifestFile],
) -> str:
    path = new_name(location, "metadata", f"snap-{snapshot_id}", "avro")
    with write_manifest_list(
        format_version=FORMAT_VERSION,
        output_file=io.new_output(path),
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent_id,
        sequence_number=sequence_number,
        avro_compression=_AVRO_CODEC,
    ) as writer:
        writer.add_manifests(list(manifests))
    return path
