"""The store's fast path (``emustore.fastpath``) answers the plainest reads as aiohttp's path does, byte for byte but
the ``Date``, with the same counters and pacing, and hands a connection to aiohttp at the first request it does not
answer, which aiohttp then answers as before, on the same connection.

Two in-process stores over one root, the fast path on and off, read over raw sockets so that every byte of the
answers, keep-alive and pipelining are seen as a client sees them. Timing checks are lower bounds only.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from emustore import Knobs, start_store
from emustore.fastpath import FastGets, FastRunner
from tests.servers.plain import SHARD

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def stores(root: Path) -> AsyncIterator[tuple[int, int, FastGets]]:
    """(the fast store's port, the other's port, the fast path's own object)."""
    fast, fast_port = await start_store(root, knobs=Knobs(seed=0))
    slow, slow_port = await start_store(root, knobs=Knobs(seed=0), fast=False)
    assert isinstance(fast, FastRunner) and not isinstance(slow, FastRunner)
    try:
        yield fast_port, slow_port, fast.fast
    finally:
        await fast.cleanup()
        await slow.cleanup()


async def _exchange(port: int, raw: bytes, answers: int) -> list[tuple[bytes, dict[str, str], bytes]]:
    """Send ``raw`` (one or more requests) on one connection; read ``answers`` answers: (status line, headers but
    Date, body). The connection is then closed by us."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        methods = [request.split(b" ", 1)[0] for request in raw.split(b"\r\n\r\n")[:answers]]
        out = []
        for method in methods:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            status, *lines = head[:-4].split(b"\r\n")
            headers = {}
            for line in lines:
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.lower()] = value.strip()
            body = b""
            if method != b"HEAD" and "content-length" in headers:
                body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 10)
            date = headers.pop("date")
            assert date.endswith(" GMT")
            out.append((status, headers, body))
        return out
    finally:
        writer.close()
        await writer.wait_closed()


def _get(path: str, *headers: str, method: str = "GET") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n").encode()


async def _stats(port: int) -> dict[str, object]:
    ((_, _, body),) = await _exchange(port, _get("/_stats"), 1)
    stats = json.loads(body)
    stats.pop("cpu_s")
    return stats


#: Requests and whether the fast path answers them itself.
REQUESTS = [
    _get(f"/{SHARD}"),
    _get(f"/{SHARD}", "Range: bytes=0-99"),
    _get(f"/{SHARD}", "Range: bytes=1000-"),
    _get(f"/{SHARD}", "Range: bytes=-300"),
    _get(f"/{SHARD}", "Range: bytes=5-2"),  # invalid: the whole object
    _get(f"/{SHARD}", "Range: bytes=0-1,5-6"),  # several: the whole object
    _get(f"/{SHARD}", "Range: bytes=0-9", "Connection: keep-alive", "User-Agent: x/1"),
    _get(f"/{SHARD}", "Range: bytes=0-9", method="HEAD"),
    _get(f"/{SHARD}", method="HEAD"),
    _get(f"/{SHARD}", "Range: bytes=0-9", "Connection: close"),
    _get(f"/{SHARD}", "Range: bytes=0-9", "Connection: Close"),
    _get(f"/{SHARD}", "Range: bytes=0-9").replace(b"Host: 127.0.0.1", b"Host: a b"),  # neither checks it
    f"GET /{SHARD} HTTP/1.1\r\nhOsT: 127.0.0.1\r\nRange: bytes=3-4\r\n\r\n".encode(),  # names in any case
]
FAST = len(REQUESTS)
REQUESTS += [
    _get("/data.json"),  # another content type (the root has no such file: aiohttp's 404)
    _get(f"/{SHARD}", "Range: bytes=99999999-"),  # unsatisfiable: aiohttp's 416
    _get(f"/{SHARD}?ttfb=0"),  # a query: aiohttp's path
    _get(f"/{SHARD}", "If-Match: \"nope\""),  # a condition: aiohttp's 412
    _get("/escape.txt"),  # a link out of the root: never served
    _get("/../etc/passwd"),
    _get("/%73hard-000000.tar"),  # an escape: aiohttp decodes it
    _get("/missing.tar", "Range: bytes=0-9"),
    _get(f"/{SHARD}", "Range: bytes=0-9", "X-Amz-Date: 20260101T000000Z"),  # the S3 face
    _get(f"/{SHARD}", "Range: bytes=0-9").replace(b"HTTP/1.1", b"HTTP/1.0"),
    _get(f"/{SHARD}", "Range: bytes=0-9", " folded"),  # an obsolete line folding
    f"GET /{SHARD} HTTP/1.1\r\nRange: bytes=3-4\r\n\r\n".encode(),  # no Host: aiohttp's 400
    _get(f"/{SHARD}", "Range: bytes=0-9", "Connection: keep-alive, close"),
    _get(f"/{SHARD}", "Range: bytes=0-9", "Bad Name: x"),  # not a token: aiohttp's 400
    _get(f"/{SHARD}", "Range: bytes=0-9", "X-Bad: a\x01b"),  # a control byte in a value
    _get(f"/{SHARD}", "Range: bytes=0-9", "X-Long: " + "a" * 9000),  # a line over aiohttp's limit: its 400
    _get(f"/{SHARD}", "Range: bytes=0-9", *(f"X-{i}: " + "a" * 100 for i in range(90))),  # a long head
]


@pytest.mark.parametrize("n", range(len(REQUESTS)),
                         ids=[r.split(b"\r\n")[0].decode() + f" #{n}" for n, r in enumerate(REQUESTS)])
async def test_each_answer_is_aiohttps(stores: tuple[int, int, FastGets], n: int) -> None:
    fast_port, slow_port, fast = stores
    raw = REQUESTS[n]
    assert await _exchange(fast_port, raw, 1) == await _exchange(slow_port, raw, 1)
    assert fast.answered == (n < FAST)


async def test_keep_alive_pipelining_and_the_hand_over(stores: tuple[int, int, FastGets]) -> None:
    """Requests on one connection, sent in one piece: fast ones, then one aiohttp answers (a query), then plain ones
    again (aiohttp answers those too now); the counters of both stores agree after."""
    fast_port, slow_port, fast_path = stores
    raw = b"".join([_get(f"/{SHARD}", "Range: bytes=0-9"), _get(f"/{SHARD}", "Range: bytes=10-19", method="HEAD"),
                    _get(f"/{SHARD}", "Range: bytes=20-29"), _get(f"/{SHARD}?bw=0", "Range: bytes=30-39"),
                    _get(f"/{SHARD}", "Range: bytes=40-49"), _get("/missing"), _get(f"/{SHARD}")])
    fast = await _exchange(fast_port, raw, 7)
    assert fast == await _exchange(slow_port, raw, 7)
    assert [status for status, _, _ in fast] == [b"HTTP/1.1 206 Partial Content"] * 5 + [
        b"HTTP/1.1 404 Not Found", b"HTTP/1.1 200 OK"]
    assert fast_path.answered == 3  # then the query: aiohttp from there on
    assert await _stats(fast_port) == await _stats(slow_port)


async def test_requests_split_across_packets(stores: tuple[int, int, FastGets]) -> None:
    fast_port, _, fast = stores
    raw = _get(f"/{SHARD}", "Range: bytes=0-9") * 2
    reader, writer = await asyncio.open_connection("127.0.0.1", fast_port)
    try:
        for i in range(0, len(raw), 7):  # a head in pieces, one head ending where the next begins
            writer.write(raw[i : i + 7])
            await writer.drain()
            await asyncio.sleep(0.001)
        for _ in range(2):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 206 ")
            assert len(await asyncio.wait_for(reader.readexactly(10), 10)) == 10
        assert fast.answered == 2
    finally:
        writer.close()
        await writer.wait_closed()


async def test_pacing_and_a_client_that_leaves(root: Path) -> None:
    """``ttfb`` and ``bw`` pace the fast path too; a client that leaves mid-body leaves nothing active."""
    size = (root / SHARD).stat().st_size
    runner, port = await start_store(root, knobs=Knobs(ttfb=0.2, bw=4e6))
    assert isinstance(runner, FastRunner)
    try:
        start = time.monotonic()
        ((status, _, body),) = await _exchange(port, _get(f"/{SHARD}", "Range: bytes=0-399999"), 1)
        assert (status, len(body)) == (b"HTTP/1.1 206 Partial Content", 400_000)
        assert time.monotonic() - start >= 0.2 + 0.8 * 400_000 / 4e6
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_get(f"/{SHARD}"))
        await reader.readuntil(b"\r\n\r\n")
        writer.close()  # mid-body: the whole shard takes size / bw seconds
        await writer.wait_closed()
        for _ in range(100):
            await asyncio.sleep(0.02)
            stats = await _stats(port)
            if stats["active"] == 0:
                break
        assert stats["active"] == 0
        assert stats["bytes_sent"] < 400_000 + size
    finally:
        await runner.cleanup()


async def test_cleanup_closes_open_fast_connections(root: Path) -> None:
    runner, port = await start_store(root, knobs=Knobs(bw=1e5))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_get(f"/{SHARD}"))  # ten seconds of body at this bandwidth
    await reader.readuntil(b"\r\n\r\n")
    await asyncio.wait_for(runner.cleanup(), 5)
    assert await asyncio.wait_for(reader.read(), 5) is not None  # the rest is cut: EOF, not a hang
    writer.close()


@pytest.mark.parametrize("knobs", [Knobs(fail_rate=0.5), Knobs(drop_rate=0.5), Knobs(ignore_range=True),
                                   Knobs(max_concurrent=3)])
async def test_fault_knobs_keep_every_request_on_aiohttp(root: Path, knobs: Knobs) -> None:
    runner, _ = await start_store(root, knobs=knobs)
    try:
        assert not isinstance(runner, FastRunner)
    finally:
        await runner.cleanup()

