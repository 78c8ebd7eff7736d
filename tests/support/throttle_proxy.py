"""A throttling S3 front on loopback: answers the first N requests as a busy S3 does (503 SlowDown or 429),
then forwards every request unchanged to a moto endpoint, and records when each request came.

moto cannot throttle by itself; a site whose endpoint is this proxy sees real throttling answers on the
wire, so both botocore's request loop and pyarrow's AWS SDK go through their real retry paths. The request
keeps its Host header (the client signed it for the proxy's address; moto checks the signature against the
header it receives), so authentication works as without the proxy.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from tests.support.s3 import S3Endpoint

_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>throttle</RequestId></Error>"
)
_TOO_MANY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>TooManyRequests</Code>'
    b"<Message>Too many requests.</Message><RequestId>throttle</RequestId></Error>"
)
_INTERNAL = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error. Please try again.</Message><RequestId>x</RequestId></Error>"
)
_BODIES = {503: _SLOW_DOWN, 429: _TOO_MANY, 500: _INTERNAL}  # 500: a failure that is not throttling
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "te", "upgrade"}


@dataclass
class ProxyState:
    """What the proxy is told to do, and what it saw (guarded by ``lock``)."""

    upstream: str  # host:port of moto
    lock: threading.Lock = field(default_factory=threading.Lock)
    throttle_next: int = 0  # requests still to throttle
    status: int = 503  # 503 SlowDown, 429 TooManyRequests, or 500 InternalError (not throttling)
    throttled: int = 0
    forwarded: int = 0
    times: list[float] = field(default_factory=list)  # monotonic arrival of every request

    def decide(self) -> int | None:
        """Record a request's arrival; the status to throttle it with, or None to forward it."""
        with self.lock:
            self.times.append(time.monotonic())
            if self.throttle_next > 0:
                self.throttle_next -= 1
                self.throttled += 1
                return self.status
            self.forwarded += 1
            return None


class ThrottleProxy:
    """A running proxy: ``url`` to give a site as its endpoint; ``throttle(n, status)`` arms it."""

    def __init__(self, state: ProxyState, server: ThreadingHTTPServer) -> None:
        self.state = state
        self._server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}"

    def throttle(self, n: int, status: int = 503) -> None:
        with self.state.lock:
            self.state.throttle_next, self.state.status = n, status

    def reset(self) -> None:
        with self.state.lock:
            self.state.throttle_next = self.state.throttled = self.state.forwarded = 0
            self.state.times.clear()

    def endpoint(self, e: S3Endpoint) -> S3Endpoint:
        """``e`` as seen through the proxy (same keys and buckets, the proxy's URL)."""
        return S3Endpoint(e.name, self.url, e.region, e.access_key, e.secret_key, e.buckets)


def _handler(state: ProxyState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet: no line per request
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                pieces = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return b"".join(pieces)
                    pieces.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
            """Send an answer; to HEAD with the upstream's Content-Length (the object's size), else the body's."""
            head = self.command == "HEAD"
            self.send_response(status)
            for name, value in headers:
                if name.lower() not in _HOP_HEADERS and (head or name.lower() != "content-length"):
                    self.send_header(name, value)
            if not (head and any(name.lower() == "content-length" for name, _ in headers)):
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _serve(self) -> None:
            body = self._body()
            status = state.decide()
            if status is not None:
                self._answer(status, [("Content-Type", "application/xml")], _BODIES[status])
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
            headers["Content-Length"] = str(len(body))
            conn = http.client.HTTPConnection(state.upstream, timeout=60)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                self._answer(answer.status, answer.getheaders(), data)
            finally:
                conn.close()

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve

    return Handler


@contextmanager
def throttle_proxy(upstream: S3Endpoint) -> Iterator[ThrottleProxy]:
    """A proxy in front of ``upstream`` on a free loopback port, stopped afterwards."""
    state = ProxyState(urlsplit(upstream.url).netloc)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield ThrottleProxy(state, server)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
