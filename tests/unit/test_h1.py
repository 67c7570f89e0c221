"""The builtin HTTP/1.1 client (``backends/_h1.py``, ``_h1wire.py``, ``_h1frame.py``) against scripted servers on 127.0.0.1.

Each server is a real asyncio socket server that reads a request's head and answers with bytes a test
writes by hand: the framings (Content-Length, chunked, close), keep-alive and a connection the server
dropped while idle, bodies cut short, stalls, malformed answers, interim answers, redirects, flow control.
Bodies are read through :class:`~wds_async.backends.http.HttpBackend`, as the engine reads them, so the
errors checked are the ones the engine sees (and resumes from, at the offset they carry).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from multidict import CIMultiDict

import wds_async as wds
from wds_async.backends._h1 import HEAD_ROOM, PAUSE_BYTES, READ_BYTES, H1Pool, MalformedAnswer
from wds_async.backends._h1frame import Dechunk, host_header, parse_head, range_size, request_bytes
from wds_async.backends._h1wire import MIN_READ_BYTES, SPARE_BUFFERS
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


@pytest.mark.asyncio
async def test_content_length_bodies_reuse_one_connection() -> None:
    async def reply(path: str, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(answer(BODY if path == "/big" else b"small"))
        await w.drain()
        return True

    async with scripted(reply) as server, http_backend() as backend:
        assert await read_all(backend, server.url("/big")) == BODY
        assert await read_all(backend, server.url("/small")) == b"small"
        assert await read_all(backend, server.url("/big"), start=10, end=20) == BODY[10:20]
    assert server.connections == 1 and [p for _, p, _ in server.requests] == ["/big", "/small", "/big"]
    assert server.requests[2][2]["Range"] == "bytes=10-19"
    assert server.requests[0][2]["Host"] == f"127.0.0.1:{server.port}"
    assert server.requests[0][2]["Accept-Encoding"] == "identity"


@pytest.mark.asyncio
async def test_chunked_bodies_are_decoded_and_the_connection_reused() -> None:
    async def reply(path: str, w: asyncio.StreamWriter, n: int) -> bool:
        data = chunked(BODY[:100_000], [1, 4095, 50_000, 45_904])
        for i in range(0, len(data), 777):  # framing split anywhere, sizes and CRLFs included
            w.write(data[i : i + 777])
            await w.drain()
        return True

    async with scripted(reply) as server, http_backend() as backend:
        assert await read_all(backend, server.url("/c")) == BODY[:100_000]
        assert await read_all(backend, server.url("/c")) == BODY[:100_000]
    assert server.connections == 1


@pytest.mark.asyncio
async def test_an_answer_framed_both_ways_is_read_by_its_chunks_and_its_connection_not_reused() -> None:
    """Content-Length beside Transfer-Encoding: chunked (RFC 9112 6.3: chunked wins; a sign of smuggling, so the
    connection is not trusted with another request)."""
    async def reply(path: str, w: asyncio.StreamWriter, n: int) -> bool:
        data = chunked(BODY[:5000], [2000, 3000])
        w.write(data.replace(b"\r\n\r\n", b"\r\nContent-Length: 10\r\n\r\n", 1))
        await w.drain()
        return True

    async with scripted(reply) as server, http_backend() as backend:
        assert await read_all(backend, server.url("/c")) == BODY[:5000]
        assert await read_all(backend, server.url("/c")) == BODY[:5000]
    assert server.connections == 2


def test_the_chunked_decoder_refuses_bad_sizes_and_missing_crlf() -> None:
    with pytest.raises(MalformedAnswer, match="bad chunk size"):
        Dechunk().feed(b"zz\r\n")
    with pytest.raises(MalformedAnswer, match="not followed by CRLF"):
        Dechunk().feed(b"2\r\nabX\r\n")
    d = Dechunk()
    assert b"".join(d.feed(b"3\r\nabc\r\n0\r\n\r\n")) == b"abc" and d.state == "done"


@pytest.mark.asyncio
async def test_a_body_framed_by_the_close_ends_there_and_is_not_reused() -> None:
    async def reply(path: str, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + BODY[:5000])
        await w.drain()
        return False

    async with scripted(reply) as server, http_backend() as backend:
        assert await read_all(backend, server.url("/a")) == BODY[:5000]
        assert await read_all(backend, server.url("/a")) == BODY[:5000]
    assert server.connections == 2


@pytest.mark.asyncio
async def test_a_connection_the_server_dropped_while_idle_is_not_reused() -> None:
    async def reply(path: str, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(answer(b"hello"))
        await w.drain()
        return False  # closes after every answer, without saying so

    async with scripted(reply) as server, http_backend() as backend:
        assert await read_all(backend, server.url("/a")) == b"hello"
        await asyncio.sleep(0.05)  # the close reaches the pooled connection
        assert await read_all(backend, server.url("/a")) == b"hello"
    assert server.connections == 2 and len(server.requests) == 2  # the dead one was not written to


@pytest.mark.asyncio
async def test_a_reused_connection_closed_without_an_answer_is_replaced_once() -> None:
    served: dict[int, int] = {}

    async def reply(path: str, w: asyncio.StreamWriter, n: int) -> bool:
        served[n] = served.get(n, 0) + 1
        if n == 1 and served[n] == 2:
            return False  # the server's idle timeout crossing the request: closed, nothing said
        w.write(answer(b"hello"))
        await w.drain()
        return True

    async with scripted(reply) as server, http_backend() as backend:
        assert await read_all(backend, server.url("/a")) == b"hello"
        assert await read_all(backend, server.url("/a")) == b"hello"
    assert [n for n, _, _ in server.requests] == [1, 1, 2]


@pytest.mark.asyncio
async def test_a_body_cut_short_is_a_transient_error_at_the_offset_reached() -> None:
    async def reply(path: str, w: asyncio.StreamWriter, n: int) -> bool:
        head = b"HTTP/1.1 206 Partial Content\r\nContent-Length: 1000\r\nContent-Range: bytes 100-1099/5000\r\n\r\n"
        w.write(head + BODY[100:600])
        await w.drain()
        return False

    got = b""
    async with scripted(reply) as server, http_backend() as backend:
        with pytest.raises(wds.TransientError) as info:
            async with backend.open(server.url("/a"), start=100) as stream:
                async for chunk in stream:
                    got += chunk
    assert got == BODY[100:600]
    assert "closed mid-body" in info.value.message and info.value.offset == 600
    assert info.value.url == server.url("/a")


@pytest.mark.asyncio
async def test_a_chunked_body_cut_mid_chunk_is_an_error_not_a_short_body() -> None:
    async def reply(path: str, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(chunked(BODY[:3000], [3000])[:-200])
        await w.drain()
        return False

    async with scripted(reply) as server, http_backend() as backend:
        with pytest.raises(wds.TransientError, match="closed mid-body"):
            await read_all(backend, server.url("/a"))


@pytest.mark.asyncio
async def test_a_stalled_body_times_out_with_the_read_timeout() -> None:
    async def reply(path: str, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(BODY)}\r\n\r\n".encode() + BODY[:1000])
        await w.drain()
        await asyncio.sleep(5)
        return False

    async with scripted(reply) as server, http_backend(read_timeout=0.3) as backend:
        with pytest.raises(wds.TransientError, match=r"stalled: no data for 0\.3 s") as info:
            await read_all(backend, server.url("/a"))
    assert info.value.offset == 1000


@pytest.mark.asyncio
async def test_a_slow_but_steady_body_and_a_busy_reader_are_not_stalls() -> None:
    async def reply(path: str, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(f"HTTP/1.1 200 OK\r\nContent-Length: {6 * 1000}\r\n\r\n".encode())
        for i in range(6):  # 1.2 s in all, never 0.5 s without a byte
            w.write(BODY[i * 1000 : (i + 1) * 1000])
            await w.drain()
            await asyncio.sleep(0.2)
        return True

    async with scripted(reply) as server, http_backend(read_timeout=0.5) as backend:
        assert await read_all(backend, server.url("/steady")) == BODY[:6000]
        got = b""
        async with backend.open(server.url("/busy")) as stream:
            async for chunk in stream:
                got += chunk
                await asyncio.sleep(0.7)  # longer than the read timeout, between reads: not the server's stall
        assert got == BODY[:6000]


@pytest.mark.asyncio
@pytest.mark.parametrize("garbage", [b"SSH-2.0-OpenSSH_9.6\r\n\r\n", b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
                                     b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n",
                                     b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n\x1f\x8b",
                                     b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"])
async def test_a_malformed_answer_is_a_clear_permanent_error(garbage: bytes) -> None:
    async def reply(path: str, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(garbage)
        await w.drain()
        return False

    async with scripted(reply) as server, http_backend() as backend:
        with pytest.raises(wds.BackendError, match="request failed: MalformedAnswer") as info:
            await read_all(backend, server.url("/a"))
    assert not isinstance(info.value, wds.TransientError) and info.value.url == server.url("/a")


@pytest.mark.asyncio
async def test_a_server_that_closes_without_answering_is_transient() -> None:
    async def reply(path: str, w: asyncio.StreamWriter, n: int) -> bool:
        return False

    async with scripted(reply) as server, http_backend() as backend:
        with pytest.raises(wds.TransientError, match="connection failed: Server disconnected"):
            await read_all(backend, server.url("/a"))
    assert server.connections == 1  # a fresh connection is not tried again here: the engine's retries decide


@pytest.mark.asyncio
async def test_interim_answers_are_skipped_and_redirects_followed() -> None:
    async def reply(path: str, w: asyncio.StreamWriter, n: int) -> bool:
        if path == "/old":
            w.write(answer(b"", "302 Found", "Location: /new\r\n"))
        else:
            w.write(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + answer(b"moved here"))
        await w.drain()
        return True

    async with scripted(reply) as server, http_backend() as backend:
        assert await read_all(backend, server.url("/old")) == b"moved here"
        assert await read_all(backend, server.url("/new")) == b"moved here"
    # the builtin client's /old got the 302; aiohttp asked again and followed it; /new needs no aiohttp
    assert [p for _, p, _ in server.requests] == ["/old", "/old", "/new", "/new"]


@pytest.mark.asyncio
async def test_a_slow_reader_pauses_the_socket_so_memory_stays_bounded() -> None:
    big = BODY * 8

    async def reply(path: str, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(answer(big))
        await w.drain()
        return True

    async with scripted(reply) as server:
        pool = H1Pool(limit=4, tls=ssl.create_default_context, connect_timeout=5, read_timeout=5, headers={})
        try:
            answer_ = await pool.get(server.url("/a"), {})
            got = [(await answer_.readchunk())[0]]
            await asyncio.sleep(0.3)  # the server keeps writing; the socket must stop being read
            wire = answer_._wire
            assert wire.paused and wire.queued <= PAUSE_BYTES + READ_BYTES, wire.queued
            while piece := (await answer_.readchunk())[0]:
                got.append(piece)
            assert b"".join(got) == big and answer_.at_eof()
            assert not wire.paused  # reading again once the reader caught up
            answer_.release()
            assert pool._take_idle(("http", "127.0.0.1", server.port)) is wire  # and kept for the next request
            wire.close()
        finally:
            await pool.aclose()


@pytest.mark.asyncio
async def test_a_header_that_would_split_the_request_is_refused() -> None:
    pool = H1Pool(limit=1, tls=ssl.create_default_context, connect_timeout=1, read_timeout=1, headers={})
    with pytest.raises(ValueError, match="cannot be sent"):
        await pool.get("http://127.0.0.1:9/a", {"X-Evil": "a\r\nInjected: yes"})
    with pytest.raises(ValueError, match="cannot be sent"):
        await pool.get("http://127.0.0.1:9/a", {"Bad Name": "x"})
    await pool.aclose()


@pytest.mark.asyncio
async def test_the_aiohttp_client_remains_selectable() -> None:
    async def reply(path: str, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(answer(b"via aiohttp"))
        await w.drain()
        return True

    async with scripted(reply) as server, http_backend(client="aiohttp") as backend:
        assert await read_all(backend, server.url("/a")) == b"via aiohttp"
        assert backend._pool is None
    with pytest.raises(ValueError, match="client must be one of"):
        HttpBackend(client="curl")


def test_an_answer_holds_no_more_than_the_allowance_the_engine_counts() -> None:
    from wds_async.engine.engine import STREAM_ALLOWANCE

    # the receive buffer (or the piece that crossed the pause line), what waits, and the piece a reader holds
    assert READ_BYTES + PAUSE_BYTES + READ_BYTES <= HttpBackend.capabilities.buffer_allowance == STREAM_ALLOWANCE


def test_the_framing_without_a_socket() -> None:
    version, status, reason, headers = parse_head(b"HTTP/1.0 206 Partial Content\r\nETag: \"x\"\r\nX-A: 1\r\nx-a:  2 ")
    assert (version, status, reason) == (0, 206, "Partial Content")
    assert headers["etag"] == '"x"' and headers.getall("X-A") == ["1", "2"]
    assert parse_head(b"HTTP/1.1 404")[1:3] == (404, "")
    with pytest.raises(MalformedAnswer, match="bad header line"):
        parse_head(b"HTTP/1.1 200 OK\r\n folded: value")  # obsolete line folding is refused, not guessed at
    assert host_header("::1", 8080, False) == "[::1]:8080" and host_header("h.example", 443, True) == "h.example"
    assert [range_size(r) for r in ("bytes=0-9", "bytes=100-", "bytes=-5", "bytes=0-1,5-9", "items=0-9", None)] == \
        [10, None, None, None, None, None]
    sent = request_bytes("/b/k?x=1", CIMultiDict({"Host": "h", "Range": "bytes=0-9"}))
    assert sent == b"GET /b/k?x=1 HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\n\r\n"


@pytest.mark.asyncio
async def test_receive_buffers_are_reused_between_answers_and_the_spares_are_bounded() -> None:
    async def reply(path: str, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(answer(BODY[:70_000]))
        await w.drain()
        return True

    async with scripted(reply) as server:
        pool = H1Pool(limit=0, tls=ssl.create_default_context, connect_timeout=5, read_timeout=5, headers={})
        try:
            first = await pool.get(server.url("/a"), {})
            assert await first.read() == BODY[:70_000]
            buffer = first._wire.buf
            first.release()
            assert pool._spare == [buffer]  # kept for the next answer, not dropped with the idle connection
            second = await pool.get(server.url("/a"), {})
            assert await second.read() == BODY[:70_000] and second._wire.buf is buffer and not pool._spare
            second.release()
            many = [await pool.get(server.url("/a"), {}) for _ in range(12)]  # 12 connections at once
            for one in many:
                assert await one.read() == BODY[:70_000]
                one.release()
            assert len(pool._spare) == SPARE_BUFFERS
        finally:
            await pool.aclose()


@pytest.mark.asyncio
async def test_a_ranged_get_without_a_spare_buffer_gets_one_of_its_size() -> None:
    """A fresh receive buffer is zeroed: a 64 KiB range does not pay for READ_BYTES. Small buffers are not kept as
    spares (a later large answer would read through them 16 KiB at a time); a larger answer than its Range said
    still reads whole."""
    async def reply(path: str, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(answer(BODY[:70_000] if path == "/big" else BODY[:1000]))
        await w.drain()
        return True

    async with scripted(reply) as server:
        pool = H1Pool(limit=0, tls=ssl.create_default_context, connect_timeout=5, read_timeout=5, headers={})
        try:
            small = await pool.get(server.url("/a"), {"Range": "bytes=0-999"})
            assert await small.read() == BODY[:1000]
            assert len(small._wire.buf) == MIN_READ_BYTES
            small.release()
            assert pool._spare == []
            ranged = await pool.get(server.url("/big"), {"Range": "bytes=0-69999"})
            assert await ranged.read() == BODY[:70_000] and len(ranged._wire.buf) == 70_000 + HEAD_ROOM
            ranged.release()
            wrong = await pool.get(server.url("/big"), {"Range": "bytes=0-9"})  # the server sends more than asked
            assert await wrong.read() == BODY[:70_000]
            wrong.release()
            whole = await pool.get(server.url("/big"), {})
            assert await whole.read() == BODY[:70_000] and len(whole._wire.buf) == READ_BYTES
            whole.release()
            assert len(pool._spare) == 1
        finally:
            await pool.aclose()
