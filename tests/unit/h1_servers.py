"""Scripted HTTP/1.1 servers on 127.0.0.1 for the builtin client's tests (``test_h1.py``, ``test_h1_buffers.py``).

A server reads each request's head and answers with bytes a test writes by hand (``reply(path, writer, connection
number)``), so framings, cut bodies, stalls and malformed answers are exactly what the test wrote.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from wds_async.backends._h1 import H1Pool
from wds_async.backends.http import HttpBackend

Reply = Callable[[str, asyncio.StreamWriter, int], Awaitable[bool]]


@dataclass
class Scripted:
    """A server whose answers ``reply(path, writer, connection number)`` writes; it returns whether the
    connection stays open for another request."""

    reply: Reply
    port: int = 0
    connections: int = 0
    requests: list[tuple[int, str, dict[str, str]]] = field(default_factory=list)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                line, *rest = head.decode("latin-1").split("\r\n")
                headers = dict(h.split(": ", 1) for h in rest if h)
                path = line.split(" ")[1]
                self.requests.append((number, path, headers))
                if not await self.reply(path, writer, number):
                    return
        finally:
            writer.close()


@asynccontextmanager
async def scripted(reply: Reply) -> AsyncIterator[Scripted]:
    server = Scripted(reply)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        listener.close()
        await listener.wait_closed()


def answer(body: bytes, status: str = "200 OK", extra: str = "") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def chunked(body: bytes, sizes: list[int]) -> bytes:
    out, i = [], 0
    for n in sizes:
        out.append(f"{n:x};ext=1\r\n".encode() + body[i : i + n] + b"\r\n")
        i += n
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(out) + b"0\r\nX-Trailer: t\r\n\r\n"


@asynccontextmanager
async def http_backend(**options: Any) -> AsyncIterator[HttpBackend]:
    backend = HttpBackend(**options)
    try:
        yield backend
    finally:
        await backend.aclose()


async def read_all(backend: HttpBackend, url: str, start: int = 0, end: int | None = None) -> bytes:
    async with backend.open(url, start=start, end=end) as stream:
        return b"".join([bytes(chunk) async for chunk in stream])


BODY = bytes(range(256)) * 4000  # 1 MB


def answering(body_of: Callable[[str], bytes]) -> Reply:
    """A reply that answers every request with ``body_of(path)`` (Content-Length framed) and keeps the
    connection open."""

    async def reply(path: str, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(answer(body_of(path)))
        await w.drain()
        return True

    return reply


def new_pool(limit: int = 0, timeout: float = 5) -> H1Pool:
    """A bare keep-alive pool (no backend around it), for tests that look at its connections and buffers."""
    return H1Pool(limit=limit, tls=ssl.create_default_context, connect_timeout=timeout, read_timeout=timeout,
                  headers={})
