"""What a store's failure means for the caller: *refused* or *unreachable* (DESIGN 14).

A store that refuses (wrong or missing credentials, no permission, no such bucket) will refuse again: the
error names the site, the object and what to fix, and a round does not back off and retry it in a loop.
A store that cannot be reached (connection refused or reset, a timeout, a 5xx) may answer on the next attempt:
the round backs off and tries again. A store that throttles (503 SlowDown, 429) is retried where the request
was made (``storage.throttle``); only one that still throttles once the site's retries ran out is an error,
*throttled* (an unreachable store to the round, with its own message). All are raised with the first line of
the store's own message only; no credential is ever part of it (the stores never echo secrets, and URIs
are printed redacted).
"""

from __future__ import annotations

import re
from pathlib import Path

import botocore.exceptions

from segrep.core.errors import SegrepError

# S3 error codes that will not clear by retrying (boto3's ClientError codes)
_REFUSED_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "AccountProblem",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidBucketName",
        "InvalidToken",
        "NoSuchBucket",
        "SignatureDoesNotMatch",
        "UnauthorizedAccess",
        "403",
    }
)
# The same, as pyarrow's S3 file system words them (its OSError messages carry the AWS SDK's error names)
_REFUSED_PYARROW = re.compile(
    r"ACCESS_DENIED|INVALID_ACCESS_KEY_ID|SIGNATURE_DOES_NOT_MATCH|NO_SUCH_BUCKET|EXPIRED_TOKEN|"
    r"AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch|NoSuchBucket|HTTP status 403|"
    r"Bucket '[^']*' not found|bucket does not exist",
)
# Answers that mean "too many requests, slow down": S3's SlowDown (503), HTTP 429 and the AWS SDKs' names for
# throttling (botocore's list of throttling codes, and the C++ SDK's error names pyarrow's messages carry).
# Every 503 of S3 asks to reduce the request rate (SlowDown, or ServiceUnavailable "Reduce your request
# rate"), and an answer to HEAD has no body to name its code: a 503 counts as throttling.
THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequests",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "ProvisionedThroughputExceededException",
        "LimitExceededException",
        "429",
        "503",
        "ServiceUnavailable",
    }
)
THROTTLE_PYARROW = re.compile(
    r"SLOW_DOWN|THROTTLING|TOO_MANY_REQUESTS|REQUEST_LIMIT_EXCEEDED|SlowDown|Throttl|TooManyRequests|"
    r"RequestLimitExceeded|SERVICE_UNAVAILABLE|HTTP status (429|503)",
)
_UNREACHABLE_PYARROW = re.compile(
    r"NETWORK_CONNECTION|Couldn't connect|curlCode: (6|7|28|52|56)|Connection refused|timed out|"
    r"Timeout was reached|INTERNAL_FAILURE|HTTP status 5\d\d",
)


class StoreRefusedError(SegrepError):
    """The store refused the request (credentials, permissions, missing bucket): fix the site, then retry."""


class StoreUnreachableError(OSError):
    """The store could not be reached or did not answer in time: retried after a back-off."""


class StoreThrottledError(StoreUnreachableError):
    """The store kept throttling a request (503 SlowDown, 429) after every retry its site allows: a round
    backs off and tries again, as for a store that cannot be reached."""


class PathBlockedError(NotADirectoryError):
    """A plain file stands where a local site needs a directory: its root, or a table's or a partition's
    directory under it. Still an OSError, so a round fails that target as it does a site that is down (the
    others go on); only the message changes, from the OS's bare "Not a directory" to the site and the file."""


def file_in_the_way(site: str, path: str, exc: OSError) -> OSError:
    """``exc`` (an OSError of writing or reading ``path`` at local site ``site``) as PathBlockedError naming
    the site and the plain file found where a directory of ``path`` should be; ``exc`` itself if there is none
    (the directories are fine: the error was something else)."""
    if isinstance(exc, PathBlockedError):
        return exc
    for parent in Path(path).parents:
        if parent.exists():  # False below a plain file (ENOTDIR): the walk goes on up to it
            if parent.is_dir():
                return exc
            return PathBlockedError(
                f"site {site}: {parent} is a plain file where a directory is needed (for {path}); move it out of "
                "the way"
            )
    return exc


def first_line(exc: BaseException) -> str:
    """An error's first line (store errors can be long), or its type's name."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _refused_message(site: str, where: str, what: str, detail: str) -> str:
    return (
        f"site {site}: the store refused to {what} {where}: {detail} (check the site's credentials, its "
        "permissions and that its bucket exists)"
    )


def classify_boto(exc: BaseException, site: str, where: str, what: str) -> Exception:
    """A boto3 failure as StoreRefusedError, FileNotFoundError (no such key) or StoreUnreachableError."""
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        detail = f"{code}: {error.get('Message') or first_line(exc)}"
        if code in _REFUSED_CODES:
            return StoreRefusedError(_refused_message(site, where, what, detail))
        if code in THROTTLE_CODES or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (429, 503):
            retries = exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
            return throttled(site, where, what, detail, int(retries))
        if code in ("NoSuchKey", "404", "NotFound"):
            return FileNotFoundError(f"site {site}: {where} does not exist")
        return StoreUnreachableError(f"site {site}: cannot {what} {where}: {detail}")
    if isinstance(exc, botocore.exceptions.NoCredentialsError | botocore.exceptions.PartialCredentialsError):
        return StoreRefusedError(_refused_message(site, where, what, first_line(exc)))
    return StoreUnreachableError(f"site {site}: cannot {what} {where}: the store is unreachable ({first_line(exc)})")


def throttled(site: str, where: str, what: str, detail: str, retries: int | None) -> StoreThrottledError:
    """The error for a request the store still throttled once its site's throttle retries (``retries``, if
    known) ran out."""
    after = "" if retries is None else f" and still did after {retries} retries with back-off"
    return StoreThrottledError(
        f"site {site}: the store throttled the request to {what} {where} ({detail}){after}; lower the site's "
        "max_requests_per_second or raise its throttle_retries (storage_options)"
    )


def classify_os(exc: BaseException, site: str, where: str, what: str) -> Exception:
    """A pyarrow (or OS) failure on a store, classified the same way (a missing object stays FileNotFoundError)."""
    if isinstance(exc, StoreRefusedError | StoreUnreachableError):
        return exc
    if isinstance(exc, FileNotFoundError):
        return FileNotFoundError(f"site {site}: cannot {what} {where}: it does not exist")
    text = str(exc)
    if THROTTLE_PYARROW.search(text):
        return throttled(site, where, what, first_line(exc), None)
    if _REFUSED_PYARROW.search(text):
        return StoreRefusedError(_refused_message(site, where, what, first_line(exc)))
    if _UNREACHABLE_PYARROW.search(text):
        return StoreUnreachableError(
            f"site {site}: cannot {what} {where}: the store is unreachable ({first_line(exc)})"
        )
    return OSError(f"site {site}: cannot {what} {where}: {first_line(exc)}")
