"""The builtin client's name lookups: an IP literal is never looked up, connections opened together to one host
share one lookup (the first wave of a job opens hundreds), a failed lookup fails every request waiting on it with
an error naming the host, and a lookup whose caller was cancelled is made again by the next one. The servers are
real (127.0.0.1); only the resolver's answer for a made-up name is scripted (no name may resolve elsewhere)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from tests.unit.h1_servers import answering, new_pool, scripted


def _counting_resolver(monkeypatch: pytest.MonkeyPatch, *, fail: bool = False, delay: float = 0.05
                       ) -> list[str]:
    """Make the running loop answer ``getaddrinfo`` for ``store.test`` with 127.0.0.1 (or fail), after ``delay``;
    every call is recorded."""
    calls: list[str] = []
    loop = asyncio.get_running_loop()

    async def getaddrinfo(host: str, port: int, **kwargs: Any) -> list[Any]:
        calls.append(host)
        await asyncio.sleep(delay)
        if fail or host != "store.test":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", port))]

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
    return calls


async def _get(pool: Any, url: str) -> bytes:
    answer = await pool.get(url, {})
    try:
        return await answer.read()
    finally:
        answer.release()


@pytest.mark.asyncio
async def test_an_ip_literal_is_never_looked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting_resolver(monkeypatch)
    pool = new_pool()
    try:
        async with scripted(answering(lambda path: b"ok")) as server:
            assert await asyncio.gather(*(_get(pool, server.url("/x")) for _ in range(20))) == [b"ok"] * 20
    finally:
        await pool.aclose()
    assert calls == []


@pytest.mark.asyncio
async def test_connections_opened_together_share_one_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting_resolver(monkeypatch)
    pool = new_pool()
    try:
        async with scripted(answering(lambda path: path.encode())) as server:
            urls = [f"http://store.test:{server.port}/{k}" for k in range(50)]
            assert await asyncio.gather(*(_get(pool, u) for u in urls)) == [f"/{k}".encode() for k in range(50)]
            assert server.connections == 50
            assert await _get(pool, urls[0]) == b"/0"  # cached afterwards
    finally:
        await pool.aclose()
    assert calls == ["store.test"]


@pytest.mark.asyncio
async def test_a_failed_lookup_fails_every_request_waiting_on_it(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting_resolver(monkeypatch, fail=True)
    pool = new_pool()
    try:
        results = await asyncio.gather(*(_get(pool, "http://store.test:1/x") for _ in range(10)),
                                       return_exceptions=True)
    finally:
        await pool.aclose()
    assert calls == ["store.test"]
    assert all(isinstance(r, OSError) for r in results), results
    # Each names the host (the resolver's own text does not), the first caller's as the waiters'.
    assert all(str(r) == "cannot resolve store.test: [Errno -2] Name or service not known" for r in results), results


@pytest.mark.asyncio
async def test_a_waiter_looks_the_host_up_itself_when_the_first_caller_is_cancelled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting_resolver(monkeypatch, delay=0.2)
    pool = new_pool()
    try:
        async with scripted(answering(lambda path: b"ok")) as server:
            url = f"http://store.test:{server.port}/x"
            first = asyncio.ensure_future(_get(pool, url))
            await asyncio.sleep(0.05)  # its lookup is in flight
            second = asyncio.ensure_future(_get(pool, url))
            await asyncio.sleep(0.05)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            assert await asyncio.wait_for(second, 5) == b"ok"
    finally:
        await pool.aclose()
    assert calls == ["store.test", "store.test"]


@pytest.mark.parametrize(("host", "family", "address"), [
    ("127.0.0.1", socket.AF_INET, ("127.0.0.1", 8080)),
    ("::1", socket.AF_INET6, ("::1", 8080, 0, 0)),
    ("fe80::1%eth0", None, None),  # a zone: only the resolver knows its scope id
    ("store.test", None, None),
])
def test_which_hosts_are_their_own_address(host: str, family: Any, address: Any) -> None:
    from wds_async.backends._h1 import _literal_address

    found = _literal_address(host, 8080)
    assert (found is None) == (family is None)
    if found is not None:
        assert (found[0][0], found[0][1], found[0][4]) == (family, socket.SOCK_STREAM, address)
