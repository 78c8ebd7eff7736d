"""The static bearer token a Prometheus scraper sends to ``/segrep/metrics`` instead of an Airflow login.

An Airflow token expires (``[api_auth] jwt_expiration_time``), so a scraper would need something to renew it.
This token does not: it is ``$SEGREP_METRICS_TOKEN`` in the api-server's environment or, when that is unset
or empty, the Airflow Variable ``segrep_metrics_token`` (so it can be set and rotated from the UI or a secrets
backend without a restart; read at request time, kept ``CACHE_S`` seconds). It opens the metrics of every
table and nothing else (``access.current_user`` accepts it on the metrics route only). Compared in constant
time; never logged.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time

log = logging.getLogger(__name__)

TOKEN_ENV = "SEGREP_METRICS_TOKEN"
TOKEN_VARIABLE = "segrep_metrics_token"
CACHE_S = 30.0


class ScrapeToken:
    """The configured token, the Variable's value kept a short while (one per app)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._variable: str | None = None
        self._read_at: float | None = None

    def configured(self) -> str | None:
        """The token, or None when neither the environment nor the Variable sets one."""
        env = os.environ.get(TOKEN_ENV, "").strip()
        if env:
            return env
        with self._lock:
            now = time.monotonic()
            if self._read_at is None or now - self._read_at > CACHE_S:
                self._variable, self._read_at = _variable(), now
            return self._variable

    def matches(self, presented: str) -> bool:
        token = self.configured()
        return token is not None and hmac.compare_digest(presented.encode(), token.encode())


def _variable() -> str | None:
    """The Variable's value (stripped: a file pasted into the UI ends with a newline); None if unset or
    unreadable (the cause is logged, the value never)."""
    try:
        from airflow.models.variable import Variable

        value = Variable.get(TOKEN_VARIABLE, default_var=None)
    except Exception as exc:  # the metadata database or a secrets backend failing: no token, the login still works
        log.warning("segrep page: the Variable %s cannot be read (%s)", TOKEN_VARIABLE, type(exc).__name__)
        return None
    return (value.strip() or None) if isinstance(value, str) else None
