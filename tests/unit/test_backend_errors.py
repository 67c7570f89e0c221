"""The translation tables at the backend boundary: aiohttp's exceptions (``map_aiohttp_errors``), HTTP
statuses (``status_error``) and the URL scrubber (``redact_url`` / ``redact_text``).

Every mapped case asserts the exact type, the scrubbed URL and the offset a retry resumes at. The last
tests drive the real HttpBackend against aiohttp servers on 127.0.0.1: refused, cut and stalled bodies.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest
import yarl
from aiohttp import web
from aiohttp.client_reqrep import ConnectionKey
from multidict import CIMultiDict, CIMultiDictProxy

import wds_async as wds
from wds_async.backends import _h1frame as h1
from wds_async.backends._errors import client_errors, map_aiohttp_errors
from wds_async.backends.http import HttpBackend
from wds_async.errors import Throttled
from wds_async.io.backend import status_error
from wds_async.urls import redact_text, redact_url

SIGNED = "https://alice:hunter2@h.example/b/shard-000001.tar?X-Amz-Credential=AKIA/x&X-Amz-Signature=SECRETSIG&v=1"
SHOWN = "https://alice:***@h.example/b/shard-000001.tar?X-Amz-Credential=***&X-Amz-Signature=***&v=1"
SECRETS = ("hunter2", "SECRETSIG", "AKIA")


def _key() -> ConnectionKey:
    fields = {name: None for name in ConnectionKey._fields}
    return ConnectionKey(**{**fields, "host": "h.example", "port": 443, "is_ssl": True, "ssl": True})


def _request_info() -> aiohttp.RequestInfo:
    url = yarl.URL(SIGNED.replace("alice:hunter2@", ""))
    return aiohttp.RequestInfo(url, "GET", CIMultiDictProxy(CIMultiDict()), url)


def _certificate() -> BaseException:
    cause = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] self-signed certificate")
    return aiohttp.ClientConnectorCertificateError(_key(), cause)


# (make the exception, reading the body?, expected type, a fragment of the message)
CASES: list[tuple[Callable[[], BaseException], bool, type[wds.WdsError], str]] = [
    (asyncio.TimeoutError, False, wds.TransientError, "timed out connecting or waiting for the response headers"),
    (lambda: aiohttp.ConnectionTimeoutError("connect"), False, wds.TransientError, "timed out connecting"),
    (lambda: aiohttp.SocketTimeoutError("read"), True, wds.TransientError, "stalled: no data for 7.5 s"),
    (asyncio.TimeoutError, True, wds.TransientError, "stalled"),
    (lambda: aiohttp.InvalidURL(SIGNED), False, wds.UrlError, "malformed URL"),
    (_certificate, False, wds.BackendError, "TLS certificate verification failed ([SSL: CERTIFICATE_VERIFY_FAILED]"),
    (lambda: aiohttp.ClientPayloadError("Response payload is not completed"), True, wds.TransientError,
     "connection closed mid-body (ClientPayloadError)"),
    (lambda: aiohttp.ClientConnectorError(_key(), ConnectionRefusedError(111, "Connect call failed")), False,
     wds.TransientError, "connection failed: Cannot connect to host h.example:443"),
    (aiohttp.ServerDisconnectedError, False, wds.TransientError, "connection failed: Server disconnected"),
    (aiohttp.ServerDisconnectedError, True, wds.TransientError, "read failed: Server disconnected"),
    (lambda: aiohttp.ClientOSError(104, "Connection reset by peer"), True, wds.TransientError, "read failed"),
    (lambda: ConnectionResetError(104, "Connection reset by peer"), True, wds.TransientError, "read failed"),
    (lambda: OSError(113, "No route to host"), False, wds.TransientError, "connection failed"),
    (lambda: aiohttp.TooManyRedirects(_request_info(), (), status=302), False, wds.BackendError,
     "request failed: TooManyRedirects: 302"),
    (lambda: aiohttp.ContentTypeError(_request_info(), ()), True, wds.TransientError, "read failed: ContentTypeError"),
    # The builtin client's own types, which stand for their aiohttp namesakes (it does not import aiohttp).
    (lambda: h1.InvalidURL(SIGNED), False, wds.UrlError, "malformed URL"),
    (lambda: h1.ClientPayloadError("Response payload is not completed"), True, wds.TransientError,
     "connection closed mid-body (ClientPayloadError)"),
    (h1.ServerDisconnectedError, False, wds.TransientError, "connection failed: Server disconnected"),
    (h1.ServerDisconnectedError, True, wds.TransientError, "read failed: Server disconnected"),
    (lambda: h1.MalformedAnswer("bad chunk size"), False, wds.BackendError, "request failed: MalformedAnswer: bad chunk"),
    (lambda: h1.MalformedAnswer("bad chunk size"), True, wds.TransientError, "read failed: MalformedAnswer: bad chunk"),
]


@pytest.mark.parametrize(("make", "reading", "kind", "fragment"), CASES)
def test_the_table_maps_type_url_and_offset(make: Callable[[], BaseException], reading: bool,
                                            kind: type[wds.WdsError], fragment: str) -> None:
    with pytest.raises(wds.WdsError) as info:
        with map_aiohttp_errors(SIGNED, 4096, reading=reading, read_timeout=7.5):
            raise make()
    err = info.value
    assert type(err) is kind, (type(err), err)
    assert err.url == SHOWN
    assert err.offset == (None if kind is wds.UrlError else 4096)
    assert fragment in err.message
    assert not any(secret in str(err) or secret in repr(err) for secret in SECRETS), str(err)
    assert err.__cause__ is None and err.__suppress_context__  # raised from None: no foreign text chained


def test_certificate_errors_are_permanent_and_name_the_fix() -> None:
    with pytest.raises(wds.BackendError) as info, map_aiohttp_errors(SIGNED, 0):
        raise _certificate()
    assert not isinstance(info.value, wds.TransientError)
    assert "ca_file" in info.value.message and "SSL_CERT_FILE" in info.value.message


@pytest.mark.parametrize("error", [wds.TransientError("ours", url="u", offset=3), ValueError("a bug"),
                                   RuntimeError("Session is closed"), KeyError("k")])
def test_our_errors_and_bugs_pass_through_unchanged(error: Exception) -> None:
    with pytest.raises(type(error)) as info, map_aiohttp_errors(SIGNED, 9):
        raise error
    assert info.value is error


@pytest.mark.asyncio
async def test_cancellation_passes_through() -> None:
    async def body() -> None:
        with map_aiohttp_errors(SIGNED, 1):
            await asyncio.sleep(30)

    task = asyncio.ensure_future(body())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_nothing_raised_nothing_mapped() -> None:
    with map_aiohttp_errors(SIGNED, 0) as result:
        pass
    assert result is None


# -- statuses ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "code", "kind"), [
    (404, None, wds.NotFound), (410, None, wds.NotFound), (401, None, wds.PermissionDenied),
    (403, None, wds.PermissionDenied), (429, None, Throttled), (503, None, Throttled),
    (500, None, wds.TransientError), (502, None, wds.TransientError), (408, None, wds.TransientError),
    (412, None, wds.ObjectChanged), (416, None, wds.BackendError), (400, None, wds.BackendError),
    (400, "RequestTimeout", wds.TransientError), (403, "rateLimitExceeded", Throttled),
    (503, "SlowDown", Throttled), (404, "NoSuchKey", wds.NotFound),
])
def test_status_table(status: int, code: str | None, kind: type[wds.WdsError]) -> None:
    err = status_error(status, SHOWN, "Reason", offset=77, code=code)
    assert type(err) is kind
    assert err.url == SHOWN and err.offset == 77
    assert err.message.startswith(f"HTTP {status} Reason: ")


def test_status_notes_end_the_message_and_empty_ones_are_dropped() -> None:
    err = status_error(403, SHOWN, code="AccessDenied", notes=("AccessDenied", "", "AWS credentials: env"))
    assert err.message.endswith("[AccessDenied; AWS credentials: env]")
    assert "[" not in status_error(404, SHOWN, notes=("", "")).message


# -- the scrubber -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("url", "shown"), [
    (SIGNED, SHOWN),
    ("https://user@h/x.tar", "https://user@h/x.tar"),
    ("s3://k:s@b/x", "s3://k:***@b/x"),
    ("https://acct.blob.core.windows.net/c/b.tar?sv=2021-08-06&se=2030&sp=r&sig=abc%2Bdef",
     "https://acct.blob.core.windows.net/c/b.tar?sv=***&se=***&sp=***&sig=***"),
    ("https://storage.googleapis.com/b/o?X-Goog-Credential=c&X-Goog-Signature=s&alt=media",
     "https://storage.googleapis.com/b/o?X-Goog-Credential=***&X-Goog-Signature=***&alt=media"),
    ("https://b.s3.amazonaws.com/k?AWSAccessKeyId=AKIA&Signature=s&Expires=1",
     "https://b.s3.amazonaws.com/k?AWSAccessKeyId=***&Signature=***&Expires=1"),
    ("https://h/x?X-Amz-Security-Token=t&access_token=a&api_key=k",
     "https://h/x?X-Amz-Security-Token=***&access_token=***&api_key=***"),
    # nothing to hide: the text stays exactly as given
    ("https://h/a%20b.tar?part=a%20b&alt=media", "https://h/a%20b.tar?part=a%20b&alt=media"),
    ("gs:///no-bucket", "gs:///no-bucket"),
    ("pipe:curl -s https://u:p@h/x", "pipe:curl -s https://u:***@h/x"),
    ("pipe:cat /data/shard-000000.tar", "pipe:cat /data/shard-000000.tar"),
    ("/data/shard-000000.tar", "/data/shard-000000.tar"),
])
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert redact_url(shown) == shown  # idempotent: scrubbing twice (caller and mapper) changes nothing


@pytest.mark.parametrize(("text", "shown"), [
    ("302, message='', url='https://h/x?X-Amz-Signature=S&v=1'",
     "302, message='', url='https://h/x?X-Amz-Signature=***&v=1'"),
    ("Cannot connect to host h:443 ssl:default [Connect call failed]",
     "Cannot connect to host h:443 ssl:default [Connect call failed]"),
    ("GET /c/b?sv=1&sig=S failed (https://u:pw@h/c)", "GET /c/b?sv=***&sig=*** failed (https://u:***@h/c)"),
    ("", ""),
])
def test_redact_text(text: str, shown: str) -> None:
    assert redact_text(text) == shown


# -- the real backend on loopback: resume offsets -------------------------------------------------

BODY = bytes(range(256)) * 40  # 10240 bytes


@asynccontextmanager
async def serve(handler: Callable[[web.Request], object]) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/{tail:.*}", handler)  # type: ignore[arg-type]
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/shard.tar?sig=SECRETSIG"
    finally:
        await runner.cleanup()


async def _read(backend: HttpBackend, url: str, start: int = 0) -> bytes:
    async with backend.open(url, start=start) as stream:
        return b"".join([chunk async for chunk in stream])


async def _cut(request: web.Request) -> web.StreamResponse:
    """Announce the whole body, send 6000 bytes from the requested start, then drop the connection."""
    start = int(request.headers.get("Range", "bytes=0-")[6:].split("-")[0])
    response = web.StreamResponse(status=206 if start else 200, headers={
        "Content-Length": str(len(BODY) - start),
        "Content-Range": f"bytes {start}-{len(BODY) - 1}/{len(BODY)}"})
    await response.prepare(request)
    await response.write(BODY[start:start + 6000])
    assert request.transport is not None
    request.transport.close()
    return response


@pytest.mark.asyncio
async def test_a_cut_body_is_transient_at_the_offset_reached() -> None:
    backend = HttpBackend(max_connections=2)
    try:
        async with serve(_cut) as url:
            for start in (0, 1000):
                with pytest.raises(wds.TransientError) as info:
                    await _read(backend, url, start)
                assert info.value.offset == start + 6000
                assert info.value.url == url.replace("SECRETSIG", "***")
    finally:
        await backend.aclose()


@pytest.mark.asyncio
async def test_a_stalled_body_is_transient_at_the_offset_reached() -> None:
    release = asyncio.Event()

    async def stall(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": str(len(BODY))})
        await response.prepare(request)
        await response.write(BODY[:3000])
        await asyncio.wait_for(release.wait(), 30)
        return response

    backend = HttpBackend(read_timeout=0.3)
    try:
        async with serve(stall) as url:
            try:
                with pytest.raises(wds.TransientError, match=re.escape("stalled: no data for 0.3 s")) as info:
                    await _read(backend, url)
            finally:
                release.set()
            assert info.value.offset == 3000 and "SECRETSIG" not in str(info.value)
    finally:
        await backend.aclose()


@pytest.mark.asyncio
async def test_a_refused_connection_is_transient_at_the_start() -> None:
    async with serve(_cut) as url:
        pass  # the server is gone: its port now refuses
    backend = HttpBackend()
    try:
        with pytest.raises(wds.TransientError, match="connection failed") as info:
            await _read(backend, url, start=512)
        assert info.value.offset == 512 and info.value.url == url.replace("SECRETSIG", "***")
        with pytest.raises(wds.TransientError, match="connection failed") as info:
            await backend.size(url)
        assert info.value.offset is None and "SECRETSIG" not in str(info.value)
    finally:
        await backend.aclose()


def test_client_errors_name_both_clients_once_aiohttp_is_imported() -> None:
    assert client_errors() == (h1.ClientError, aiohttp.ClientError)  # this module imported aiohttp
    assert not issubclass(h1.ClientError, aiohttp.ClientError)  # its own type: the builtin client needs no aiohttp
