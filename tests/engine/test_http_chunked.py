"""A body sent with chunked transfer encoding (no Content-Length) streams completely."""

from __future__ import annotations

import asyncio
import io
import tarfile

import pytest
from aiohttp import web

from wds_async.backends.http import HttpBackend


def _tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for i in range(20):
            info = tarfile.TarInfo(f"s{i}.bin")
            info.size = 3000
            tf.addfile(info, io.BytesIO(bytes([i]) * 3000))
    return buf.getvalue()


@pytest.mark.asyncio
async def test_chunked_body_is_read_to_the_end() -> None:
    data = _tar()

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i in range(0, len(data), 777):
            await resp.write(data[i : i + 777])
            await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/x.tar", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    backend = HttpBackend()
    try:
        async with backend.open(f"http://127.0.0.1:{port}/x.tar") as stream:
            got = b"".join([c async for c in stream])
        assert got == data
    finally:
        await backend.aclose()
        await runner.cleanup()
