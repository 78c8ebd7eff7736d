"""pyiceberg's FileIO for the Iceberg files of a site on a local directory: each written atomically and durably.

pyiceberg's own FileIO writes a file by opening its final name and writing into it, and never fsyncs: the
catalog's pointer (a committed, synced database row) could outlive a power loss that the metadata JSON, the
manifests or the delete files it names did not, and the site's table could not be read again. Here each file
is written under a temporary name beside its final one, fsynced, given its final name and its directory
fsynced (``storage.atomic``) before ``close`` returns, so a snapshot is committed only over files that are
complete on disk; directories are made below the site's root only (a vanished root is not made again, as for
segment files). Reads and deletes are plain file operations, refused outside the root. Sites on an object store
keep pyiceberg's FileIO: an object is visible only once complete, and durable then.
"""

from __future__ import annotations

import os
from types import TracebackType

from pyiceberg.io import PY_IO_IMPL, FileIO, InputFile, InputStream, OutputFile, OutputStream
from pyiceberg.typedef import Properties

from segrep.storage.atomic import WriteOnlyStream, ensure_dirs_below, fsync_dir, remove_quietly, tmp_name

ROOT_PROPERTY = "segrep.site-root"  # the site's root directory, absolute


def local_io_properties(root: str) -> dict[str, str]:
    """The catalog properties that make pyiceberg write a local site's files through :class:`SiteFileIO`."""
    return {PY_IO_IMPL: f"{__name__}.{SiteFileIO.__name__}", ROOT_PROPERTY: root}


class SiteFileIO(FileIO):
    """``file://`` locations under the site root given as ``segrep.site-root``."""

    def __init__(self, properties: Properties) -> None:
        super().__init__(properties)
        root = properties.get(ROOT_PROPERTY)
        if not root or not os.path.isabs(root):
            raise ValueError(f"{type(self).__name__} needs the site's absolute root as {ROOT_PROPERTY!r}")
        self.root = os.path.normpath(root)

    def new_input(self, location: str) -> InputFile:
        return _LocalInput(location, self._path(location))

    def new_output(self, location: str) -> OutputFile:
        return _LocalOutput(location, self._path(location), self.root)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        """Remove the file (FileNotFoundError if there is none, as pyiceberg's own FileIO says)."""
        os.remove(self._path(location if isinstance(location, str) else location.location))

    def _path(self, location: str) -> str:
        if location.startswith("file://"):
            path = location.removeprefix("file://")
        elif "://" in location:
            raise ValueError(f"{location} is not a local file: {type(self).__name__} serves {self.root} only")
        else:
            path = location
        path = os.path.normpath(path)
        if not os.path.isabs(path) or os.path.commonpath([self.root, path]) != self.root:
            raise ValueError(f"{location} is not under the site root {self.root}")
        return path


class _LocalInput(InputFile):
    def __init__(self, location: str, path: str) -> None:
        super().__init__(location)
        self._local = path

    def __len__(self) -> int:
        return os.path.getsize(self._local)

    def exists(self) -> bool:
        return os.path.exists(self._local)

    def open(self, seekable: bool = True) -> InputStream:
        return open(self._local, "rb")


class _LocalOutput(OutputFile):
    def __init__(self, location: str, path: str, root: str) -> None:
        super().__init__(location)
        self._local, self._root = path, root

    def __len__(self) -> int:
        return os.path.getsize(self._local)

    def exists(self) -> bool:
        return os.path.exists(self._local)

    def to_input_file(self) -> InputFile:
        return _LocalInput(self.location, self._local)

    def create(self, overwrite: bool = False) -> OutputStream:
        if not overwrite and self.exists():
            raise FileExistsError(f"Cannot create file, already exists: {self.location}")
        return _AtomicFile(self._local, self._root, overwrite)


class _AtomicFile(WriteOnlyStream, OutputStream):
    """A new file under a temporary name; ``close`` makes it durable and gives it its final name (without
    ``overwrite``, only if that name is still free: FileExistsError otherwise). Leaving a ``with`` block on an
    error, or ``abort``, removes it: the final name never shows a partial file."""

    def __init__(self, final: str, root: str, overwrite: bool) -> None:
        self._final, self._overwrite = final, overwrite
        ensure_dirs_below(root, os.path.dirname(final))
        self._tmp = tmp_name(final)
        self._file = open(self._tmp, "xb")  # noqa: SIM115 (closed by close or abort)

    @property
    def closed(self) -> bool:
        return self._file.closed

    def write(self, b: bytes) -> int:
        return self._file.write(b)

    def tell(self) -> int:
        return self._file.tell()

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            if self._overwrite:
                os.replace(self._tmp, self._final)
            else:
                self._link()
            fsync_dir(os.path.dirname(self._final))
        except BaseException:
            self.abort()
            raise

    def _link(self) -> None:
        """Give the file its final name only if that is still free: a hard link fails if the name was taken
        meanwhile, unlike a rename. A file system without hard links (some network and FUSE mounts) gets a
        rename after a check, as pyiceberg's own FileIO does (the names are unique anyway)."""
        try:
            os.link(self._tmp, self._final)
        except FileExistsError:
            raise
        except OSError:
            if os.path.exists(self._final):
                raise FileExistsError(f"Cannot create file, already exists: {self._final}") from None
            os.rename(self._tmp, self._final)
        else:
            os.remove(self._tmp)

    def abort(self) -> None:
        self._file.close()
        remove_quietly(self._tmp)

    def __enter__(self) -> _AtomicFile:
        return self

    def __exit__(
        self, exctype: type[BaseException] | None, excinst: BaseException | None, exctb: TracebackType | None
    ) -> None:
        if exctype is None:
            self.close()
        else:
            self.abort()
