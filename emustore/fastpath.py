"""The store's hot path without aiohttp: a GET or HEAD of a plain-face object, answered on the connection itself.

Why: the store and the loader share the two cores of the machines this project is measured on, and a ranged GET
through aiohttp's server cost the store 150-200 µs of CPU (a task, a request and a response object per request,
the headers written through its writer), as much as half of what the loader spends on the same random-access
sample; a real object store spends none of the client's cores. A server whose knobs inject no fault (no
``fail_rate``, ``drop_rate``, ``ignore_range`` nor ``max_concurrent``) and serves plain http starts every
connection here. Each request is answered here only when it is the plainest read: ``GET``/``HEAD`` over HTTP/1.1 with
a ``Host``, a path of plain characters (no query, no ``%``-escape, no dot segment), no body, no condition (``If-*``),
no signature (``Authorization``, ``x-amz-*``), well-formed header lines (each field once, ``Connection`` at most
``keep-alive`` or ``close``) within 8190 bytes, of a file that exists, with a satisfiable range or none. The first request
that is anything else (another face, a query, ``/_stats``, a missing object, an error) hands the connection, with
the bytes read so far, to aiohttp (``transport.set_protocol``) for good, which answers it as it always did.

What is answered here is what aiohttp's path answers: the same status line, headers (``Date`` and ``Server``
included), body and keep-alive, the same pacing (``ttfb``, then the body through :meth:`Sender.send` with ``bw``
and ``total_bw``) and the same counters (``requests``, ``active``, ``peak_active``, ``status``, ``bytes_sent``).
``tests/servers/test_fastpath.py`` compares the two answer by answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from email.utils import formatdate
from typing import Any, cast

from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE

from emustore.knobs import Knobs, Plan
from emustore.sender import object_headers, parse_range

__all__ = ["FastGets", "FastRunner", "fast_enabled"]

#: A longer head goes to aiohttp, whichever its lines: one line that long is over aiohttp's limit for a line (8190
#: bytes), which it answers with a 400, and a head of many shorter lines it answers as always.
_MAX_HEAD = 8190
_PLAIN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~/")
_TOKEN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!#$%&'*+-.^_`|~")  # a field name
_CONTROL = bytes(range(0, 9)) + bytes(range(10, 32)) + b"\x7f"  # never in a field value (a tab is)
#: Request headers that make a request something other than the plainest read (aiohttp answers it).
_DECLINED = frozenset({"authorization", "if-match", "if-none-match", "if-modified-since", "if-unmodified-since",
                       "if-range", "expect", "content-length", "transfer-encoding", "upgrade"})
_REASONS = {200: "OK", 206: "Partial Content"}


def fast_enabled(knobs: Knobs, tls: bool) -> bool:
    """Whether a server with ``knobs`` starts its connections on the fast path: plain http, no fault knob."""
    return not (tls or knobs.fail_rate or knobs.drop_rate or knobs.ignore_range or knobs.max_concurrent)


class _Clock:
    """The ``Date`` header, formatted once per second."""

    def __init__(self) -> None:
        self.second = -1
        self.text = ""

    def now(self) -> str:
        second = int(time.time())
        if second != self.second:
            self.second, self.text = second, formatdate(second, usegmt=True)
        return self.text


def _parse(head: bytes) -> tuple[str, str, dict[str, str]] | None:
    """(method, path, lower-cased headers) of a request head this path answers; None for anything else."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] != b"HTTP/1.1" or parts[0] not in (b"GET", b"HEAD"):
        return None
    target = parts[1]
    if not target.startswith(b"/") or not _PLAIN.issuperset(target) or b"/." in target or b"//" in target:
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or not _TOKEN.issuperset(name) or len(value.translate(None, _CONTROL)) != len(value):
            return None  # aiohttp refuses it (400)
        key = name.decode("latin-1").lower()
        if key in headers or key in _DECLINED or key.startswith("x-amz-"):
            return None
        headers[key] = value.strip(b" \t").decode("latin-1")
    if "host" not in headers:
        return None  # aiohttp refuses an HTTP/1.1 request without one (400)
    if headers.get("connection", "keep-alive").lower() not in ("keep-alive", "close"):
        return None  # a list of options: aiohttp's reading of it
    return parts[0].decode(), target.decode(), headers


class FastGets:
    """The protocol factory of a fast server: a :class:`_Connection` per connection; ``handlers()`` makes the aiohttp
    protocol a connection is handed to. ``store`` is the server's ``_Store`` (its files, sender, knobs and
    counters)."""

    def __init__(self, store: Any, handlers: Callable[[], asyncio.Protocol], roots: tuple[str, ...]) -> None:
        self.store = store
        self.handlers = handlers
        self.roots = roots  # paths of another face (GCS's), never answered here
        self.clock = _Clock()
        self.live: set[_Connection] = set()
        self.answered = 0  # requests answered here (aiohttp answered the rest): for tests and diagnosis

    def __call__(self) -> asyncio.Protocol:
        return _Connection(self)

    def close_all(self) -> None:
        """Close the connections still on the fast path (the server is shutting down)."""
        for conn in list(self.live):
            conn.close()

    def answer(self, method: str, path: str, headers: dict[str, str]) -> tuple[Any, int, int, int, list[str]] | None:
        """(object, start, end, status, header lines but ``Date``) for a request answered here; None to hand it to
        aiohttp. The object is looked up as the request arrives (aiohttp's path looks after ``ttfb``)."""
        if path in ("/", "/_stats") or path.startswith(self.roots):
            return None
        obj = self.store.files.lookup(path)
        if obj is None:
            return None
        size = obj.size
        start, end, status = 0, size, 200
        span = parse_range(headers.get("range"), size)
        if isinstance(span, str):
            return None  # unsatisfiable: aiohttp's 416
        headers = object_headers(obj, path)
        headers["Accept-Ranges"] = "bytes"
        if span is not None:
            start, end, status = span[0], span[1], 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        headers["Content-Length"] = str(end - start)
        return obj, start, end, status, [f"{name}: {value}" for name, value in headers.items()]

    def head(self, status: int, lines: list[str], close: bool) -> bytes:
        """The answer's head, dated now."""
        tail = "Connection: close\r\n\r\n" if close else "\r\n"
        return (f"HTTP/1.1 {status} {_REASONS[status]}\r\n" + "\r\n".join(lines) +
                f"\r\nDate: {self.clock.now()}\r\nServer: {SERVER_SOFTWARE}\r\n" + tail).encode("latin-1")


class _Connection(asyncio.Protocol):
    """One connection on the fast path: its requests in turn, until one goes to aiohttp or the connection closes."""

    def __init__(self, fast: FastGets) -> None:
        self.fast = fast
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.task: asyncio.Task[None] | None = None
        self.paused = False
        self.drained: asyncio.Future[None] | None = None

    # -- the loop's calls ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        self.fast.live.add(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.task is None:
            self._next()

    def eof_received(self) -> bool | None:
        return None  # the client stopped sending: close, as aiohttp's server does (unanswered requests too)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fast.live.discard(self)
        if self.task is not None:
            self.task.cancel()
        if self.drained is not None:
            self.drained.cancel()

    # -- the requests ----------------------------------------------------------------------------------
    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _next(self) -> None:
        """Start answering the next whole request in the buffer, or hand the connection to aiohttp."""
        end = self.buf.find(b"\r\n\r\n")
        if end < 0 or end > _MAX_HEAD:
            if end > _MAX_HEAD or len(self.buf) > _MAX_HEAD:
                self._hand_over()
            return
        parsed = _parse(bytes(self.buf[:end]))
        answer = self.fast.answer(*parsed) if parsed is not None else None
        if parsed is None or answer is None:
            self._hand_over()
            return
        del self.buf[: end + 4]
        self.fast.answered += 1
        close = parsed[2].get("connection", "").lower() == "close"
        self.task = asyncio.get_running_loop().create_task(self._answer(parsed[0] == "GET", *answer, close))

    def _hand_over(self) -> None:
        """From here on aiohttp serves this connection, starting with what it sent and was not answered."""
        assert self.transport is not None
        self.fast.live.discard(self)
        handler = self.fast.handlers()
        self.transport.set_protocol(handler)
        handler.connection_made(self.transport)
        data, self.buf = bytes(self.buf), bytearray()
        if data:
            handler.data_received(data)

    async def _answer(self, body: bool, obj: Any, start: int, end: int, status: int, lines: list[str],
                      close: bool) -> None:
        store = self.fast.store
        knobs = store.knobs
        store.requests += 1
        store.active += 1
        store.peak_active = max(store.peak_active, store.active)
        transport = self.transport
        assert transport is not None
        try:
            if knobs.ttfb:
                await asyncio.sleep(knobs.ttfb)
            transport.write(self.fast.head(status, lines, close))
            if body and end > start:
                await store.sender.send(self, obj.view, start, end, Plan(knobs, store.rng), -1)
        except ConnectionError:
            return  # the client went away
        finally:
            store.active -= 1
        store.status[status] += 1
        self.task = None
        if self.buf and not close:
            self._next()
        if self.task is None and close:
            transport.close()

    async def write(self, data: memoryview) -> None:
        """What :meth:`Sender.send` writes a piece of the body with: to the socket, waiting while its buffer is full."""
        assert self.transport is not None
        if self.transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        self.transport.write(data)
        if self.paused:
            self.drained = asyncio.get_running_loop().create_future()
            await self.drained


class FastRunner(web.ServerRunner):
    """aiohttp's runner, whose sites start each connection on the fast path (:mod:`emustore.fastpath`); aiohttp's
    server still serves every connection handed to it, and shuts down as before."""

    def __init__(self, server: web.Server, fast: FastGets, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self._fast = fast

    @property
    def fast(self) -> FastGets:
        return self._fast

    @property
    def server(self) -> Any:  # the protocol factory the sites listen with
        return self._fast if self._server is not None else None

    async def shutdown(self) -> None:
        self._fast.close_all()
        await super().shutdown()
