"""A site's request limits inside botocore's own request loop (``storage.throttle`` says what they are).

Two handlers on the client's events, so every HTTP attempt of every call (paginators, aborts and deletes
included) is covered without wrapping each call:
- ``before-send``: each attempt waits for the site's request rate;
- ``needs-retry`` (registered first, so its answer is the one botocore takes): a throttled answer is retried
  after the site's back-off and counted, or, once the site's ``throttle_retries`` ran out, not retried at all
  (``False``): the caller gets botocore's ClientError, which ``store_errors.classify_boto`` names as throttled.
  Any other answer is left to botocore's standard retries (``None``), as before.
"""

from __future__ import annotations

from typing import Any

from segrep.storage.store_errors import THROTTLE_CODES
from segrep.storage.throttle import SiteLimits

_CONTEXT_KEY = "segrep_throttled"  # throttled attempts of one call, in botocore's per-call request context


def install(client: Any, limits: SiteLimits) -> None:
    """Hook ``limits`` into ``client``'s (an S3 client's) requests."""
    hooks = _Hooks(limits)
    events = client.meta.events
    events.register("before-send.s3", hooks.before_send, unique_id="segrep-pace-s3")
    events.register_first("needs-retry.s3", hooks.needs_retry, unique_id="segrep-throttle-s3")


def is_throttled(response: Any) -> bool:
    """Whether a botocore ``(http response, parsed)`` pair is a throttling answer."""
    if response is None:
        return False
    http, parsed = response
    code = str((parsed or {}).get("Error", {}).get("Code", ""))
    return code in THROTTLE_CODES or getattr(http, "status_code", None) in (429, 503)


class _Hooks:
    def __init__(self, limits: SiteLimits) -> None:
        self.limits = limits

    def before_send(self, **_: Any) -> None:
        self.limits.pace()  # None: botocore sends the request

    def needs_retry(self, response: Any = None, request_dict: Any = None, **_: Any) -> float | bool | None:
        if not is_throttled(response):
            return None
        context = request_dict.setdefault("context", {}) if isinstance(request_dict, dict) else {}
        retry = int(context.get(_CONTEXT_KEY, 0)) + 1
        context[_CONTEXT_KEY] = retry
        delay = self.limits.retry_after(retry)
        return False if delay is None else delay
