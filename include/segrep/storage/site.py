"""Site file systems and segment files (DESIGN section 4).

A segment file lives at ``<site root>/<table>/<partition_id>/<segment_id>.parquet`` and carries its catalog
entry in the Parquet key-value metadata (key ``segrep.segment``), so a site describes itself and its catalog
can be rebuilt from storage. Files are written to a temporary name in the same directory, hashed, fsynced and
renamed (then the directory is fsynced): a file visible under its final name is complete, and its sha256 is
known before the catalog references it.
Atomic writes themselves are in :mod:`segrep.storage.atomic`.

A Site opened with what the catalog expects of it (``expect``) checks the identity marker at its root before
its first read or write (:mod:`segrep.storage.identity`); writes never create the root itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from segrep.config.stores import StoreOptions
from segrep.core.errors import CorruptSegmentError, SegrepError, SiteUnidentifiedError
from segrep.core.names import NAME_RE, SEGMENT_ID_RE, check_name, check_segment_id
from segrep.core.projection import ReadVersions, read_projected
from segrep.core.schema_versions import SCHEMA_META_KEY
from segrep.storage import identity
from segrep.storage.atomic import (
    CHUNK,
    FileFacts,
    atomic_local_write_stream,
    hash_local,
    hash_stream,
    remove_quietly,
    tmp_name,
)
from segrep.storage.content import ChunkPace, ExpectedContent, load_local, load_paced, load_stream
from segrep.storage.s3 import S3Target, put_verified
from segrep.storage.segment_meta import (
    ExpectedSegment,
    footer_differences,
    rows_differences,
)
from segrep.storage.store_errors import file_in_the_way, first_line
from segrep.storage.stores import open_store

META_KEY = b"segrep.segment"
# What pyarrow raises for a damaged file: Arrow errors (OSError for I/O, checksum and thrift failures,
# ArrowInvalid for bad values) and UnicodeDecodeError for a damaged name in the footer.
DECODE_ERRORS = (pa.ArrowException, OSError, ValueError)
_SEGMENT_PATH_RE = re.compile(rf"{NAME_RE.pattern}/(0|[1-9][0-9]*)/{SEGMENT_ID_RE.pattern}\.parquet")


@dataclass(frozen=True)
class Expected:
    """What the catalog expects a site's marker to say: ``identity`` None for a site it has not claimed yet."""

    identity: identity.SiteIdentity | None


def segment_relpath(table: str, partition_id: int, segment_id: str) -> str:
    check_name("table", table)
    if not isinstance(partition_id, int) or isinstance(partition_id, bool) or partition_id < 0:
        raise SegrepError(f"invalid partition id {partition_id!r}")
    check_segment_id(segment_id)
    return f"{table}/{partition_id}/{segment_id}.parquet"


class Site:
    """One site's storage root. Local paths use the OS directly (for fsync and atomic rename); any other
    URI goes through ``pyarrow.fs`` (hdfs://, s3://, ...), where the final move is the store's own."""

    def __init__(
        self, name: str, uri: str, options: StoreOptions | None = None, *, expect: Expected | None = None
    ) -> None:
        """``options``: the store's endpoint and credentials reference; by default those the loaded
        definitions give this site (``storage.stores.open_store``). ``expect``: the identity the catalog
        expects at the root, checked before the first read or write (``catalog.site_identity.open_site``
        passes it); None only where a caller already checked it (a Spark executor, whose driver did)."""
        self.name = check_name("site", name)
        self.uri = uri
        store = open_store(self.name, uri, options)
        self.fs: pafs.FileSystem = store.fs
        self.root: str = store.root
        self.local: bool = store.local
        self.s3: S3Target | None = store.s3
        self.expect = expect

    def path(self, relpath: str) -> str:
        return f"{self.root.rstrip('/')}/{relpath}"

    # -- identity ------------------------------------------------------------------------------------------
    def identity_check(self) -> identity.IdentityCheck:
        """Look at the root's marker now (no cache); what the catalog expects, if it said."""
        expected = self.expect.identity if self.expect is not None else None
        return identity.check(self.fs, self.root, self.local, expected, self.name)

    def ensure_identified(self, *, fresh: bool = False) -> None:
        """SiteUnidentifiedError unless the root holds the marker the catalog expects (a passed check is
        remembered for a few seconds per process, unless ``fresh``). A Site opened without ``expect`` is not
        checked."""
        if self.expect is None:
            return
        expected = self.expect.identity
        if not fresh and expected is not None and identity.recently_passed(self.root, expected):
            return
        result = self.identity_check()
        if not result.ok:
            raise SiteUnidentifiedError(f"DOWN/UNIDENTIFIED: {result.detail}")
        assert expected is not None  # an unclaimed site never passes
        identity.remember(self.root, expected)

    # -- writing -----------------------------------------------------------------------------------------
    def write_segment(self, relpath: str, table: pa.Table, meta: dict[str, Any]) -> FileFacts:
        """Write a segment atomically; return its size and sha256.

        Locally, the sha256 is that of the bytes as they were written and fsynced (``atomic_local_write_stream``
        says why that is what is on disk); on S3 the file is built in memory, hashed and uploaded under its
        final key with the store checking every part's CRC-64/NVME (``storage.s3.put_verified``): no temporary key,
        no move, no read-back. On any other store the file is read back after the store's move.
        The Parquet settings are pyarrow's defaults, as a plain ``pq.write_table`` would use, plus a CRC32 in
        every page header, which every read verifies: a flipped bit in a data page fails the read instead of
        serving a changed value."""
        self.ensure_identified()
        version = {k: v for k, v in (table.schema.metadata or {}).items() if k == SCHEMA_META_KEY}  # kept
        table = table.replace_schema_metadata({**version, META_KEY: json.dumps(meta, sort_keys=True).encode()})
        final = self.path(relpath)
        if self.local:
            try:
                return atomic_local_write_stream(
                    final, lambda out: pq.write_table(table, out, write_page_checksum=True), root=self.root
                )
            except (NotADirectoryError, FileExistsError) as exc:  # a plain file where a directory must be
                raise file_in_the_way(self.name, final, exc) from None
        if self.s3 is not None:
            sink = pa.BufferOutputStream()
            pq.write_table(table, sink, write_page_checksum=True)
            data = memoryview(sink.getvalue())
            parts = (bytes(data[i : i + CHUNK]) for i in range(0, len(data), CHUNK))
            return put_verified(self.s3, final, parts, None)
        tmp = tmp_name(final)
        self.fs.create_dir(os.path.dirname(final), recursive=True)
        with self.fs.open_output_stream(tmp) as out:
            pq.write_table(table, out, write_page_checksum=True)
        self.fs.move(tmp, final)
        return self.facts(relpath)

    def delete(self, relpath: str) -> None:
        self.ensure_identified()
        if self.local:
            remove_quietly(self.path(relpath))
        else:
            with contextlib.suppress(FileNotFoundError):
                self.fs.delete_file(self.path(relpath))

    # -- reading -----------------------------------------------------------------------------------------
    def facts(self, relpath: str) -> FileFacts:
        """Size, sha256 and CRC-64/NVME of a stored file, computed from its bytes."""
        self.ensure_identified()
        if self.local:
            return hash_local(self.path(relpath), fsync=False)
        with self.fs.open_input_stream(self.path(relpath)) as f:
            return hash_stream(f)

    def verify(self, relpath: str, byte_size: int, sha256: str) -> FileFacts:
        """Raise CorruptSegmentError unless the file has exactly the recorded size and hash; else return its
        facts (with the CRC-64/NVME of the bytes just checked)."""
        try:
            facts = self.facts(relpath)
        except FileNotFoundError:
            raise CorruptSegmentError(f"segment file {self.path(relpath)} is missing") from None
        if facts != FileFacts(byte_size, sha256):
            raise CorruptSegmentError(
                f"segment file {self.path(relpath)} does not match the catalog: size {facts.byte_size} "
                f"(expected {byte_size}), sha256 {facts.sha256[:12]}... (expected {sha256[:12]}...)"
            )
        return facts

    def read_segment(
        self,
        relpath: str,
        columns: list[str] | None = None,
        versions: ReadVersions | None = None,
        *,
        pace: ChunkPace | None = None,
    ) -> pa.Table:
        """A segment's rows, page checksums verified (pyarrow raises OSError on a mismatch); no catalog check:
        for a file this process just wrote or verified. Reads for users go through ``read_checked``. With
        ``versions``, the rows are projected to ``versions.target`` (``columns`` then name its columns). With
        ``pace`` (a read across a link), the file's bytes are read into memory chunk by chunk, each paid as it
        is read, and parsed from there."""
        self.ensure_identified()
        if pace is not None:
            with self.fs.open_input_stream(self.path(relpath)) as stream:
                source: Any = pa.BufferReader(load_paced(stream, pace))
        elif versions is None:
            return pq.read_table(
                self.path(relpath), columns=columns, filesystem=self.fs, page_checksum_verification=True
            )
        else:
            source = self.fs.open_input_file(self.path(relpath))
        with source as f:
            parquet = pq.ParquetFile(f, page_checksum_verification=True)
            if versions is None:
                return parquet.read(columns=columns)
            return read_projected(parquet.schema_arrow, versions, columns, lambda cols: parquet.read(columns=cols))

    def check_footer(self, relpath: str, expected: ExpectedSegment) -> pq.FileMetaData:
        """The file's Parquet footer, once the file proved to be the segment the catalog names: its size, its
        footer entry (segment id, table, partition, counts and ranges), its row count and its columns equal the
        catalog's.
        Reads the footer only. CorruptSegmentError naming the site, the file and every difference otherwise."""
        self.ensure_identified()
        path = self.path(relpath)
        try:
            with self.fs.open_input_file(path) as f:
                metadata, problems = self._footer(f, expected)
        except FileNotFoundError:
            raise self.missing(relpath, expected) from None
        except OSError as exc:
            raise SegrepError(f"site {self.name}: cannot open segment file {path}: {first_line(exc)}") from None
        if metadata is None or problems:
            raise self.corrupt(relpath, expected, problems)
        return metadata

    def read_checked(
        self,
        relpath: str,
        expected: ExpectedSegment,
        primary_key: Sequence[str],
        columns: list[str] | None = None,
        versions: ReadVersions | None = None,
        *,
        pace: ChunkPace | None = None,
    ) -> pa.Table:
        """A segment's rows, checked on the way: the file's bytes are read once, into memory, and their content
        checksum computed as they come (``storage.content``: CRC-64/NVME where the catalog has it, else
        sha256); the Parquet is parsed from that buffer. Then the footer (as ``check_footer``), every page's
        checksum, the row count, the key range and (where read) the version range and tombstones are checked
        against the catalog. A file whose bytes are not the catalog's is refused even if everything else in it
        agrees (a rewrite with other values); no row is returned before every check passed. With ``pace`` (a
        read across a link) each chunk is paid as it is read. With ``versions``
        the rows are projected to ``versions.target`` (``core.projection``; ``columns`` and ``primary_key`` then
        name its columns), before the rows' checks.

        Never touches a column chunk's footer entry itself (``RowGroupMetaData.column``): on a damaged footer
        pyarrow 26 aborts the process there instead of raising; the read raises OSError for the same damage."""
        content = ExpectedContent.of(expected.sha256, expected.crc64nvme)
        path = self.path(relpath)
        try:
            if self.local:
                loaded = load_local(path, content.kind, pace)
            else:
                with self.fs.open_input_stream(path) as stream:
                    loaded = load_stream(stream, content.kind, pace)
        except FileNotFoundError:
            raise self.missing(relpath, expected) from None
        except OSError as exc:
            raise SegrepError(f"site {self.name}: cannot read segment file {path}: {first_line(exc)}") from None
        metadata, problems = self._footer(pa.BufferReader(loaded.data), expected)
        mismatch = content.difference(loaded.hexdigest)
        if mismatch is not None:
            problems.append(mismatch)
        if metadata is None or problems:
            raise self.corrupt(relpath, expected, problems)
        try:
            parquet = pq.ParquetFile(pa.BufferReader(loaded.data), metadata=metadata, page_checksum_verification=True)
            if versions is None:
                rows = parquet.read(columns=columns)
            else:
                rows = read_projected(parquet.schema_arrow, versions, columns, lambda cols: parquet.read(columns=cols))
        except DECODE_ERRORS as exc:
            raise self.corrupt(relpath, expected, [f"its pages cannot be read ({first_line(exc)})"]) from None
        problems = rows_differences(expected, rows, primary_key)
        if problems:
            raise self.corrupt(relpath, expected, problems)
        return rows

    @staticmethod
    def _footer(f: pa.NativeFile, expected: ExpectedSegment) -> tuple[pq.FileMetaData | None, list[str]]:
        """The footer of an open file and how the file differs from the catalog's row (``footer_differences``);
        no footer (None) if it cannot be read, with that problem named."""
        size = f.size()
        try:
            metadata = pq.read_metadata(f)
            raw = (metadata.metadata or {}).get(META_KEY)
            num_rows = metadata.num_rows
            schema = metadata.schema.to_arrow_schema()
        except DECODE_ERRORS as exc:
            problems = [f"its footer cannot be read ({first_line(exc)})"]
            if size != expected.byte_size:
                problems.insert(0, f"size {size} bytes (the catalog says {expected.byte_size})")
            return None, problems
        try:
            entry = json.loads(raw) if raw is not None else None
        except ValueError:
            entry = None
        return metadata, footer_differences(
            expected, entry if isinstance(entry, dict) else None, num_rows, size, schema
        )

    def missing(self, relpath: str, expected: ExpectedSegment) -> CorruptSegmentError:
        """The error for a file the catalog lists that is not there (the reader adds what to do about it)."""
        return CorruptSegmentError(
            f"site {self.name}: segment file {self.path(relpath)} ({expected.describe()}) is missing"
        )

    def corrupt(self, relpath: str, expected: ExpectedSegment, problems: Sequence[str]) -> CorruptSegmentError:
        """The error for a file that is not what the catalog says (the reader adds what to do about it)."""
        return CorruptSegmentError(
            f"site {self.name}: segment file {self.path(relpath)} is not {expected.describe()} as the catalog "
            "records it: " + "; ".join(problems)
        )

    def read_meta(self, relpath: str) -> dict[str, Any]:
        """The segment's catalog entry from the Parquet footer (no row is read)."""
        self.ensure_identified()
        try:
            md = pq.read_metadata(self.path(relpath), filesystem=self.fs).metadata or {}
        except (pa.ArrowInvalid, OSError) as exc:
            raise CorruptSegmentError(f"{self.path(relpath)} is not a readable Parquet file: {exc}") from None
        if META_KEY not in md:
            raise CorruptSegmentError(f"{self.path(relpath)} is not a segrep segment (no {META_KEY.decode()})")
        doc: dict[str, Any] = json.loads(md[META_KEY])
        return doc

    def read_schema(self, relpath: str) -> pa.Schema:
        """The segment file's Arrow schema from the footer: its columns' field ids and, in its metadata, the
        schema version it was written at (``core.schema_versions.version_of_file``). No row is read."""
        self.ensure_identified()
        try:
            return pq.read_schema(self.path(relpath), filesystem=self.fs)
        except (pa.ArrowInvalid, OSError) as exc:
            raise CorruptSegmentError(f"{self.path(relpath)} is not a readable Parquet file: {exc}") from None

    def exists(self, relpath: str) -> bool:
        self.ensure_identified()
        return bool(self.fs.get_file_info(self.path(relpath)).type == pafs.FileType.File)

    def list_segment_files(self) -> Iterator[str]:
        """Relative paths of every ``<table>/<partition>/<segment>.parquet`` under the root, sorted.

        Only names that fit the layout (valid table name, partition number, segment id) are segment files;
        anything else (temporary files, a user's notes) is not listed and never touched."""
        self.ensure_identified()
        selector = pafs.FileSelector(self.root, recursive=True, allow_not_found=True)
        prefix = self.root.rstrip("/") + "/"
        rels = []
        for info in self.fs.get_file_info(selector):
            if info.type != pafs.FileType.File or not info.path.endswith(".parquet"):
                continue
            rel = info.path[len(prefix) :] if info.path.startswith(prefix) else info.path
            if _SEGMENT_PATH_RE.fullmatch(rel):
                rels.append(rel)
        return iter(sorted(rels))
