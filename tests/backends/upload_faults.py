"""A loopback HTTP proxy in front of an emulator that fails chosen requests, for the upload tests.

Requests pass through unchanged (one upstream connection each) unless a :class:`Fault` matches: then the
proxy answers with the fault's status itself, after forwarding the request first when the fault says so
(the store got it, the answer was lost), possibly cut short (the store persisted part of it). Counters
tell a test that the fault was actually hit.
"""

from __future__ import annotations

import http.client
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    from typing import Self

_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "content-length", "proxy-connection"}

Forward = Callable[[dict[str, str], bytes], tuple[dict[str, str], bytes]]


def query(path: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(path).query, keep_blank_values=True)


@dataclass
class Fault:
    """Answer the matching requests whose 1-based number is in ``which`` (None: all) with ``status``."""

    match: Callable[[str, str], bool]  # (method, path) -> bool
    which: set[int] | None = None
    status: int = 503
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    #: Forward the request (transformed) before answering the error: the store acts on it, the client
    #: never learns. None: the store never sees the request.
    forward: Forward | None = None
    seen: int = 0     # matching requests
    failed: int = 0   # of those, answered with the fault


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet about a client that reset its idle keep-alive connection (boto3 does, between tests): printed,
        that traceback read as a failure in the middle of a passing run."""
        if isinstance(sys.exc_info()[1], ConnectionResetError | BrokenPipeError):
            return
        super().handle_error(request, client_address)


class FaultProxy:
    """``with FaultProxy(upstream) as proxy:``; ``proxy.url`` is where clients go; ``proxy.faults`` the rules."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.faults: list[Fault] = []
        self._seen: dict[tuple[str, str], int] = {}  # (method, path) -> requests seen
        self._lock = threading.Lock()
        self._server: _ProxyServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def requests(self, match: Callable[[str, str], bool]) -> int:
        """How many requests seen so far match (faulted or not)."""
        with self._lock:
            return sum(n for (method, path), n in self._seen.items() if match(method, path))

    def __enter__(self) -> Self:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def relay(self) -> None:
                proxy._relay(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = relay

        self._server = _ProxyServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    def _fault_for(self, method: str, path: str) -> Fault | None:
        with self._lock:
            self._seen[(method, path)] = self._seen.get((method, path), 0) + 1
            for fault in self.faults:
                if fault.match(method, path):
                    fault.seen += 1
                    if fault.which is None or fault.seen in fault.which:
                        fault.failed += 1
                        return fault
        return None

    def _relay(self, handler: BaseHTTPRequestHandler) -> None:
        body = _read_body(handler)
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP}
        fault = self._fault_for(handler.command, handler.path)
        if fault is not None:
            if fault.forward is not None:
                self._send(handler.command, handler.path, *fault.forward(headers, body))
            _answer(handler, fault.status, fault.headers, fault.body)
            return
        status, reason, answer_headers, data = self._send(handler.command, handler.path, headers, body)
        handler.send_response_only(status, reason)
        for name, value in answer_headers:
            if name.lower() not in _HOP:
                handler.send_header(name, value)
        length = dict((k.lower(), v) for k, v in answer_headers).get("content-length", "0")
        handler.send_header("Content-Length", length if handler.command == "HEAD" else str(len(data)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(data)

    def _send(self, method: str, path: str, headers: dict[str, str],
              body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            conn.request(method, path, body=body, headers={**headers, "Content-Length": str(len(body))})
            response = conn.getresponse()
            return response.status, response.reason, response.getheaders(), response.read()
        finally:
            conn.close()


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        out = bytearray()
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(out)
            out += handler.rfile.read(size)
            handler.rfile.readline()
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))


def _answer(handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str], body: bytes) -> None:
    handler.send_response_only(status)
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@contextmanager
def faults(proxy: FaultProxy, *rules: Fault) -> Iterator[tuple[Fault, ...]]:
    """Install ``rules`` for the block."""
    proxy.faults = list(rules)
    try:
        yield rules
    finally:
        proxy.faults = []
