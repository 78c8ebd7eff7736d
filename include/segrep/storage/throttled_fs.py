"""A site's request limits around pyarrow's S3 file system (``storage.throttle`` says what they are).

pyarrow takes no retry policy from Python (only the AWS SDK's standard or default strategy, which retries a
throttled request a few times, unseen, within the site's ``retries``) and reports nothing of its retries: as of
pyarrow 26, ``S3FileSystem(retry_strategy=...)`` refuses any other ``S3RetryStrategy`` subclass and builds the
C++ strategy from ``max_attempts`` alone, so a Python subclass's methods are never called and cannot count them. So
the S3 file system is wrapped (``pyarrow.fs.PyFileSystem``): each call, and each read of a file it opened,
first waits for the site's request rate; one that fails throttled once the SDK gave up is sent again after
the site's back-off and counted, up to ``throttle_retries``; then it raises ``StoreThrottledError`` naming the
site. Other errors pass unchanged. A read is safe to send again: pyarrow's S3 file moves its position only
once a read succeeded. Writes of an output stream are not retried (its buffered upload cannot be resumed
from Python); segrep writes S3 segments through boto3 (``storage.s3``), where they are.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from segrep.storage.store_errors import THROTTLE_PYARROW, first_line, throttled
from segrep.storage.throttle import SiteLimits

T = TypeVar("T")


def limited(fs: pafs.FileSystem, limits: SiteLimits) -> pafs.FileSystem:
    """``fs`` with ``limits`` applied to its requests."""
    return pafs.PyFileSystem(ThrottledHandler(fs, limits))


def _send(limits: SiteLimits, what: str, where: str, fn: Callable[[], T]) -> T:
    """``fn()`` paced, and sent again while the store throttles it and the site's retries allow."""
    retry = 0
    while True:
        limits.pace()
        try:
            return fn()
        except OSError as exc:
            if not THROTTLE_PYARROW.search(str(exc)):
                raise
            retry += 1
            delay = limits.retry_after(retry)
            if delay is None:
                raise throttled(limits.site, where, what, first_line(exc), retry - 1) from None
            time.sleep(delay)


class ThrottledHandler(pafs.FileSystemHandler):  # type: ignore[misc]  # pyarrow ships no type hints
    """Every call of the inner file system through ``_send``."""

    def __init__(self, fs: pafs.FileSystem, limits: SiteLimits) -> None:
        self.fs = fs
        self.limits = limits

    def _do(self, what: str, where: str, fn: Callable[[], T]) -> T:
        return _send(self.limits, what, where, fn)

    def equals(self, other: object) -> bool:
        return isinstance(other, ThrottledHandler) and bool(self.fs.equals(other.fs)) and self.limits is other.limits

    def get_type_name(self) -> str:
        return f"limited-{self.fs.type_name}"

    def normalize_path(self, path: str) -> str:
        return str(self.fs.normalize_path(path))

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self._do("look at", ", ".join(paths), lambda: self.fs.get_file_info(paths))

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self._do("list", selector.base_dir, lambda: self.fs.get_file_info(selector))

    def create_dir(self, path: str, recursive: bool) -> None:
        self._do("create", path, lambda: self.fs.create_dir(path, recursive=recursive))

    def delete_dir(self, path: str) -> None:
        self._do("delete", path, lambda: self.fs.delete_dir(path))

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._do("delete under", path, lambda: self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok))

    def delete_root_dir_contents(self) -> None:
        self._do("delete under", "/", lambda: self.fs.delete_dir_contents("/", accept_root_dir=True))

    def delete_file(self, path: str) -> None:
        self._do("delete", path, lambda: self.fs.delete_file(path))

    def move(self, src: str, dest: str) -> None:
        self._do("move", f"{src} to {dest}", lambda: self.fs.move(src, dest))

    def copy_file(self, src: str, dest: str) -> None:
        self._do("copy", f"{src} to {dest}", lambda: self.fs.copy_file(src, dest))

    def open_input_stream(self, path: str) -> pa.NativeFile:
        inner = self._do("read", path, lambda: self.fs.open_input_stream(path))
        return pa.PythonFile(_RetryingReader(inner, self.limits, path), mode="r")

    def open_input_file(self, path: str) -> pa.NativeFile:
        inner = self._do("read", path, lambda: self.fs.open_input_file(path))
        return pa.PythonFile(_RetryingReader(inner, self.limits, path), mode="r")

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        return self._do("write", path, lambda: self.fs.open_output_stream(path, metadata=metadata))

    def open_append_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        return self._do("append to", path, lambda: self.fs.open_append_stream(path, metadata=metadata))


class _RetryingReader:
    """A file object over an opened pyarrow file whose reads are paced and retried (``_send``)."""

    def __init__(self, inner: pa.NativeFile, limits: SiteLimits, path: str) -> None:
        self._inner = inner
        self._limits = limits
        self._path = path

    @property
    def closed(self) -> bool:
        return bool(self._inner.closed)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return bool(self._inner.seekable())

    def read(self, nbytes: int | None = None) -> bytes:
        data: bytes = _send(self._limits, "read", self._path, lambda: self._inner.read(nbytes))
        return data

    def seek(self, position: int, whence: int = 0) -> int:
        return int(self._inner.seek(position, whence))

    def tell(self) -> int:
        return int(self._inner.tell())

    def size(self) -> int:
        return int(self._inner.size())

    def close(self) -> None:
        self._inner.close()
