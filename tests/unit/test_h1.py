"""The builtin HTTP/1.1 client (``backends/_h1.py``, ``_h1wire.py``, ``_h1frame.py``) against scripted servers on 127.0.0.1.

Each server is a real asyncio socket server that reads a request's head and answers with bytes a test
writes by hand: the framings (Content-Length, chunked, close), keep-alive and a connection the server
dropped while idle, bodies cut short, stalls, malformed answers, interim answers, redirects, flow control.
Bodies are read through :class:`~wds_async.backends.http.HttpBackend`, as the engine reads them, so the
errors checked are the ones the engine sees (and resumes from, at the offset they carry). The servers live in
``h1_servers.py``; the framing without a socket is tested in ``test_h1frame.py``, the receive buffers in
``test_h1_buffers.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import wds_async as wds
from tests.unit.h1_servers import BODY, answer, answering, chunked, http_backend, new_pool, read_all, scripted
from wds_async.backends._h1 import PAUSE_BYTES, READ_BYTES
from wds_async.backends.http import HttpBackend


@pytest.mark.asyncio
async def test_content_length_bodies_reuse_one_connection() -> None:
    reply = answering(lambda path: BODY if path == "/big" else b"small")

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


BOTH_FRAMINGS = chunked(BODY[:5000], [2000, 3000]).replace(b"\r\n\r\n", b"\r\nContent-Length: 10\r\n\r\n", 1)
FRAMED_BY_CLOSE = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + BODY[:5000]


@pytest.mark.asyncio
@pytest.mark.parametrize("wire, server_closes", [(FRAMED_BY_CLOSE, True), (BOTH_FRAMINGS, False)],
                         ids=["framed-by-the-close", "chunked-and-content-length"])
async def test_an_answer_whose_connection_cannot_carry_another_is_read_whole_and_not_reused(
        wire: bytes, server_closes: bool) -> None:
    """A body framed by the close ends there. Content-Length beside Transfer-Encoding: chunked is read by its
    chunks (RFC 9112 6.3: chunked wins) and, a sign of smuggling, the connection is not trusted with another
    request even though the server keeps it open."""
    async def reply(path: str, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(wire)
        await w.drain()
        return not server_closes

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


_REDIRECT_IN_A_FRESH_PROCESS = r"""
import asyncio, json, sys
from tests.unit.h1_servers import answer, http_backend, read_all, scripted

async def main():
    async def reply(path, w, n):
        w.write(answer(b"", "302 Found", "Location: /new\r\n") if path == "/old" else answer(b"moved here"))
        await w.drain()
        return True

    async with scripted(reply) as server, http_backend() as backend:
        direct = await read_all(backend, server.url("/new"))
        before = "aiohttp" in sys.modules
        moved = await read_all(backend, server.url("/old"))
    return {"direct": direct.decode(), "before": before, "moved": moved.decode(), "after": "aiohttp" in sys.modules}

print(json.dumps(asyncio.run(main())))
"""


def test_a_redirect_imports_aiohttp_at_its_first_use_in_a_fresh_process() -> None:
    """The builtin client's path never imports aiohttp (see backends/_h1frame.ClientError); the first redirect,
    which aiohttp follows, imports it where the session is made, from the event loop, and is read as before."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", _REDIRECT_IN_A_FRESH_PROCESS], capture_output=True, text=True,
                         timeout=120, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"direct": "moved here", "before": False,
                                                               "moved": "moved here", "after": True}


@pytest.mark.asyncio
async def test_a_slow_reader_pauses_the_socket_so_memory_stays_bounded() -> None:
    big = BODY * 8

    reply = answering(lambda path: big)

    async with scripted(reply) as server:
        pool = new_pool(limit=4)
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
    pool = new_pool(limit=1, timeout=1)
    with pytest.raises(ValueError, match="cannot be sent"):
        await pool.get("http://127.0.0.1:9/a", {"X-Evil": "a\r\nInjected: yes"})
    with pytest.raises(ValueError, match="cannot be sent"):
        await pool.get("http://127.0.0.1:9/a", {"Bad Name": "x"})
    await pool.aclose()


@pytest.mark.asyncio
async def test_the_aiohttp_client_remains_selectable() -> None:
    reply = answering(lambda path: b"via aiohttp")

    async with scripted(reply) as server, http_backend(client="aiohttp") as backend:
        assert await read_all(backend, server.url("/a")) == b"via aiohttp"
        assert backend._pool is None
    with pytest.raises(ValueError, match="client must be one of"):
        HttpBackend(client="curl")


@pytest.mark.asyncio
async def test_an_answer_whose_stream_cannot_be_made_frees_its_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    def unreadable(*args: object, **kwargs: object) -> None:
        raise ValueError("unreadable headers")

    async with scripted(answering(lambda path: b"ok")) as server, http_backend(max_connections=1) as backend:
        with monkeypatch.context() as patch:
            patch.setattr(backend, "stream_from", unreadable)
            with pytest.raises(ValueError, match="unreadable"):
                await read_all(backend, server.url("/x"))
        # the pool's one slot was given back: the next request does not wait for it
        assert await asyncio.wait_for(read_all(backend, server.url("/x")), 5) == b"ok"
