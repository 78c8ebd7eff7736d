"""Where data lives: the data directory and each site's URI, checked and resolved when the file is loaded.

A site is a local directory (a path, or ``file:///absolute/path``) or an S3 prefix (``s3://bucket/...``);
any other scheme is refused here rather than hanging or failing a write later. Loading only looks: it never
creates a directory. Relative paths resolve under the data directory, itself relative to the definitions
file's directory.

Whether a site's store exists and is usable (a plain file, not writable, unreachable) is not checked here but
by the probe ``segrep apply`` runs (storage/probe.py): the definitions are loaded by every command and every
DAG parse, and a site that is down must fail only its own targets, not make the file unreadable. The data
directory is different: it is this machine's own (work files, the default catalog), so a data_dir that is a
plain file is refused here.
"""

from __future__ import annotations

import re
from pathlib import Path

from segrep.core.errors import SegrepError
from segrep.core.names import LONGEST_RELPATH

SUPPORTED = "a local path, file:///absolute/path or s3://bucket/prefix"
S3_MAX_KEY_BYTES = 1024  # S3's limit on an object key, in UTF-8 bytes
_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_SYSTEM_ROOTS = (Path("/proc"), Path("/sys"), Path("/dev"))  # kernel views, not storage


def data_dir(raw: object, base: Path) -> Path:
    """The data directory (work files, the default SQLite catalog): a local path, default ``data``."""
    if not isinstance(raw, str) or not raw.strip():
        raise SegrepError(f"data_dir must be a local directory path (a string), got {raw!r}")
    if "://" in raw:
        raise SegrepError(f"data_dir {raw!r} must be a local directory path, not a URI")
    return local_dir(raw.strip(), base, "data_dir", must_be_dir=True)


def redact_uri(uri: str) -> str:
    """``uri`` fit to print: credentials embedded in it (``s3://KEY:SECRET@bucket``) and query values
    (``?secret_key=...``) replaced by ``***``. For URIs from an old catalog: the definitions refuse both."""
    scheme = _SCHEME_RE.match(uri)
    if scheme is None or not uri[scheme.end() :].startswith("//"):
        return uri
    head, rest = uri[: scheme.end() + 2], uri[scheme.end() + 2 :]
    authority, sep, tail = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rsplit("@", 1)[1]
    path, qmark, query = tail.partition("?")
    if qmark:
        query = "&".join(f"{p.split('=', 1)[0]}=***" if "=" in p else p for p in query.split("&"))
    return f"{head}{authority}{sep}{path}{qmark}{query}"


def site_uri(name: str, raw: str, data_dir: Path) -> str:
    """A site's URI as segrep opens it: an absolute local path, or the ``s3://`` URI unchanged.

    An s3:// URI may not carry credentials or options (``s3://KEY:SECRET@bucket``, ``?secret_key=``): they
    would be stored in the catalog and printed; endpoint and credentials go under ``storage_options`` and
    ``credentials``. The error never repeats such a URI whole."""
    where = f"site {name} uri {redact_uri(raw)!r}"
    scheme = _SCHEME_RE.match(raw)
    if scheme is None:
        return str(local_dir(raw, data_dir, where))
    kind = scheme.group(1).lower()
    rest = raw[scheme.end() :]
    if kind == "file":
        if not rest.startswith("//"):
            raise SegrepError(f"{where}: write file:///absolute/path")
        path = rest[2:]
        if not path.startswith("/"):
            raise SegrepError(f"{where}: file:// needs an absolute path (file:///absolute/path)")
        return str(local_dir(path, data_dir, where))
    if kind == "s3":
        bucket = rest[2:].split("/", 1)[0] if rest.startswith("//") else ""
        if "@" in rest.split("/", 3)[2 if rest.startswith("//") else 0]:
            raise SegrepError(
                f"{where}: credentials in a URI are refused (they would be stored and printed); give the site "
                "credentials: {env_prefix: PREFIX} and set PREFIX_ACCESS_KEY_ID and PREFIX_SECRET_ACCESS_KEY"
            )
        if "?" in rest or "#" in rest:
            raise SegrepError(f"{where}: options in the URI are refused; put them under the site's storage_options")
        if not bucket or "\x00" in raw or any(c.isspace() for c in raw):
            raise SegrepError(f"{where}: write s3://bucket/prefix")
        _check_key_room(name, rest[2:].strip("/").partition("/")[2])
        return raw
    raise SegrepError(f"{where}: unsupported scheme {kind!r}; a site is {SUPPORTED}")


def _check_key_room(name: str, prefix: str) -> None:
    """Refuse an S3 key prefix that leaves too little room under the store's key limit for the paths segrep
    writes beneath it: the site would be accepted and then fail its first write (or worse, its first bootstrap
    --mode replace). Counted in UTF-8 bytes, as S3 counts them."""
    used = len(prefix.encode("utf-8", "surrogatepass"))
    room = S3_MAX_KEY_BYTES - len(LONGEST_RELPATH) - 1  # the slash between the prefix and the path
    if used > room:
        raise SegrepError(
            f"site {name}: its s3 key prefix {prefix[:24]!r}... is {used} bytes long: at most {room} bytes (UTF-8), "
            f"since S3 keys are at most {S3_MAX_KEY_BYTES} bytes and segrep writes paths of up to "
            f"{len(LONGEST_RELPATH)} bytes under the prefix (<table>/<partition>/<segment>.parquet, moved aside "
            "under .replaced/<time>/)"
        )


def local_dir(raw: str, base: Path, where: str, *, must_be_dir: bool = False) -> Path:
    """``raw`` as an absolute path (relative to ``base``) outside the kernel's /proc, /sys and /dev; with
    ``must_be_dir``, also one that is, or could be created as, a directory."""
    if "\x00" in raw:
        raise SegrepError(f"{where}: a path cannot contain a NUL byte")
    try:
        path = (base / Path(raw)).resolve()
        existing = next(p for p in (path, *path.parents) if p.exists()) if must_be_dir else path
        is_dir = existing.is_dir() if must_be_dir else True
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a permission denied on the way
        raise SegrepError(f"{where}: cannot resolve the path: {exc}") from None
    for root in _SYSTEM_ROOTS:
        if path == root or root in path.parents:
            raise SegrepError(f"{where}: {path} is under {root}, a system directory, not storage")
    if not is_dir:
        what = "is not a directory" if existing == path else f"cannot be created: {existing} is not a directory"
        raise SegrepError(f"{where}: {path} {what}")
    return path
