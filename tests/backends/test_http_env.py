"""The http backend honours the environment as aiohttp's ``trust_env`` does (a proxy from ``http_proxy``, bypassed
by ``no_proxy``; ``.netrc`` logins from ``NETRC``), read once per session rather than on every request. Real
servers on 127.0.0.1: a store that wants a login, and a forwarding proxy that records what it forwarded."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from wds_async.backends.http import HttpBackend
from wds_async.errors import PermissionDenied

BODY = b"0123456789" * 100


async def _store(request: web.Request) -> web.Response:
    want = "Basic " + base64.b64encode(b"alice:s3cret").decode()
    if request.headers.get("Authorization") != want:
        return web.Response(status=401)
    return web.Response(body=BODY)


@pytest_asyncio.fixture
async def servers() -> AsyncIterator[tuple[str, str, list[str]]]:
    store = web.Application()
    store.router.add_get("/{name}", _store)
    seen: list[str] = []

    async def forward(request: web.Request) -> web.Response:  # a proxy gets the absolute URL in its request line
        seen.append(str(request.url))
        async with aiohttp.ClientSession() as session, session.get(
                str(request.url), headers={k: v for k, v in request.headers.items() if k.lower() != "host"}) as up:
            return web.Response(status=up.status, body=await up.read())

    proxy = web.Application()
    proxy.router.add_route("GET", "/{tail:.*}", forward)
    runners = [web.AppRunner(store), web.AppRunner(proxy)]
    urls = []
    for runner in runners:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        urls.append(f"http://127.0.0.1:{port}")
    try:
        yield urls[0], urls[1], seen
    finally:
        for runner in runners:
            await runner.cleanup()


async def _read(url: str) -> bytes:
    backend = HttpBackend()
    try:
        async with backend.open(url) as stream:
            return b"".join([chunk async for chunk in stream])
    finally:
        await backend.aclose()


@pytest.mark.asyncio
async def test_a_netrc_login_is_sent_to_its_host(servers: tuple[str, str, list[str]], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    store, _proxy, _seen = servers
    rc = tmp_path / "netrc"
    rc.write_text("machine 127.0.0.1 login alice password s3cret\n")
    rc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(rc))
    for name in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert await _read(f"{store}/x.tar") == BODY
    backend = HttpBackend()  # a HEAD for the size carries the login too (the store answers 401 without it)
    try:
        assert await backend.size(f"{store}/sized.tar") == len(BODY)
    finally:
        await backend.aclose()
    rc.write_text("machine 127.0.0.1 login alice password wrong\n")
    with pytest.raises(PermissionDenied):
        await _read(f"{store}/x.tar")  # a new session reads the file again


@pytest.mark.asyncio
async def test_http_proxy_is_used_unless_no_proxy_names_the_host(servers: tuple[str, str, list[str]],
                                                                  tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    store, proxy, seen = servers
    rc = tmp_path / "netrc"
    rc.write_text("machine 127.0.0.1 login alice password s3cret\n")
    rc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(rc))
    monkeypatch.setenv("http_proxy", proxy)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert await _read(f"{store}/via-proxy.tar") == BODY
    assert seen == [f"{store}/via-proxy.tar"]

    monkeypatch.setenv("no_proxy", "127.0.0.1")
    assert await _read(f"{store}/direct.tar") == BODY
    assert seen == [f"{store}/via-proxy.tar"], "no_proxy names the host: the request went straight to it"
