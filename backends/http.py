"""``http://`` and ``https://``: the builtin HTTP/1.1 client's pool, and one aiohttp session per event loop.

* Each pool (the builtin client's, aiohttp's connector) allows ``max_connections`` connections in use (no per-host
  limit below that), so all shard streams of a process share one pool.
* ``ClientTimeout(total=None, sock_connect=..., sock_read=...)``: a shard may stream for hours; what
  must not happen is ``read_timeout`` seconds without a byte (a stall).
* Bodies come through the builtin HTTP/1.1 client (:mod:`._h1`: fewer copies and less CPU per byte and per
  request than aiohttp on the loop thread, which is what binds a busy loader), unless a proxy applies to the URL
  or ``client="aiohttp"`` is given; a redirect answer is repeated through aiohttp, which follows it. HEAD
  requests (``size``) and everything the cloud backends list or upload go through aiohttp. The two pools are
  separate, so ``max_connections`` caps each of them. aiohttp is imported when its session is first made, so a
  process whose requests all go through the builtin client never imports it (about 0.19 s on two cores).
* ``open(start=N)`` sends ``Range: bytes=N-`` (or ``N-M``, never a suffix range). A server that answers
  200 instead of 206 ignored the range; the stream then discards the first ``N`` bytes itself.
* A body shorter than its Content-Length raises :class:`~wds_async.errors.TransientError` with the
  offset reached, so the engine can resume there.
* Errors: both clients' exceptions go through :class:`._errors.map_aiohttp_errors` (the request, with the
  start offset; each body read, with the offset reached), non-2xx answers through
  :meth:`HttpBackend.response_error` and :func:`._errors.status_error`. Subclasses reuse both.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, NamedTuple, Union

from wds_async.errors import BackendError, TransientError
from wds_async.io.backend import ByteStream, Capabilities, ObjectIdentity, check_http_url, status_error
from wds_async.urls import redact_text, redact_url

from ._errors import client_errors, map_aiohttp_errors
from ._h1 import PAUSE_BYTES, READ_BYTES, H1Answer, H1Pool
from ._httpenv import Environment

if TYPE_CHECKING:
    import aiohttp

__all__ = ["Answer", "HttpBackend"]

#: An answer as the backends read it: aiohttp's, or the builtin client's (which offers the same subset). aiohttp
#: is imported where its session is made, not with this module: a job whose requests all go through the builtin
#: client never pays for that import (see :class:`._h1frame.ClientError`).
Answer = Union["aiohttp.ClientResponse", H1Answer]  # a string in the union: aiohttp stays unimported


class _Timeouts(NamedTuple):
    """The two timeouts both clients take (the names of aiohttp's ``ClientTimeout`` fields)."""

    sock_connect: float | None
    sock_read: float | None


#: Which client sends the GETs of bodies (``backend_options={"http": {"client": ...}}``).
CLIENTS = ("builtin", "aiohttp")

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
#: What a store's error body names: S3/Azure XML ``<Code>``, GCS JSON ``"reason"`` and ``"message"``.
_XML_CODE = re.compile(rb"<Code>([^<]{1,100})</Code>")
_JSON_REASON = re.compile(rb'"reason"\s*:\s*"([^"]{1,100})"')
_JSON_MESSAGE = re.compile(rb'"message"\s*:\s*"([^"]{1,200})"')


def identity_from_headers(headers: Mapping[str, str], status: int) -> ObjectIdentity:
    """The object's identity and total size from response headers (206 uses Content-Range)."""
    size: int | None = None
    if status == 206:
        m = _CONTENT_RANGE.match(headers.get("Content-Range", ""))
        if m and m.group(3) != "*":
            size = int(m.group(3))
    elif "Content-Length" in headers and "Content-Encoding" not in headers:
        size = int(headers["Content-Length"])
    return ObjectIdentity(
        size=size,
        etag=headers.get("ETag"),
        generation=headers.get("x-goog-generation"),
        last_modified=headers.get("Last-Modified"),
    )


#: aiohttp's per-connection read buffer (its own default grew to 256 KiB in 3.14). It pauses the socket
#: above twice this; a connection's memory outside our counters is then at most that plus one socket
#: read (256 KiB in asyncio and uvloop), whatever the consumer does.
READ_BUFSIZE = 64 << 10
_SOCKET_READ = 256 << 10
#: What one open answer may hold outside the engine's counters, whichever client reads it: aiohttp's buffer
#: (up to twice READ_BUFSIZE plus one socket read), or the builtin client's receive buffer and what waits before it
#: pauses (see ``_h1``); and one more read for the chunk a reader takes just after its budget check. Both are
#: 640 KiB, the engine's ``STREAM_ALLOWANCE``.
_ALLOWANCE = max(2 * READ_BUFSIZE + 2 * _SOCKET_READ, READ_BYTES + PAUSE_BYTES + READ_BYTES)
#: The headers of every request this backend makes (no compression: shards are read as stored, by byte offset).
DEFAULT_HEADERS = {"User-Agent": "wds-async", "Accept-Encoding": "identity"}


class HttpBackend:
    """Streams http(s) objects with ranged GETs: the builtin HTTP/1.1 client's pool, or aiohttp's session."""

    #: ``open(..., expect=identity)`` makes the request conditional on that version (see ``conditions``).
    #: The buffer allowance is what one open response may hold outside the engine's counters (``_ALLOWANCE``),
    #: which the engine counts in its byte budget while the response is open.
    #: A plain server may ignore Range (so ranges are not guaranteed) and has no list API.
    capabilities = Capabilities(conditional_reads=True, buffer_allowance=_ALLOWANCE)

    def __init__(
        self,
        *,
        max_connections: int = 16,
        connect_timeout: float = 30.0,
        read_timeout: float = 60.0,
        chunk_bytes: int = 1 << 20,
        headers: Mapping[str, str] | None = None,
        ca_file: str | None = None,
        client: str = "builtin",
    ) -> None:
        if client not in CLIENTS:
            raise ValueError(f"client must be one of {', '.join(map(repr, CLIENTS))}, not {client!r}")
        #: ``"builtin"`` (:mod:`._h1`) or ``"aiohttp"``: which client sends the GETs of bodies.
        self.client = client
        self.max_connections = max_connections
        #: A PEM bundle to trust instead of the system's (a private CA, an emulator's self-signed one).
        self.ca_file = ca_file
        self.chunk_bytes = chunk_bytes
        self.headers = dict(headers or {})
        self._timeout = _Timeouts(sock_connect=connect_timeout, sock_read=read_timeout)
        self._session: aiohttp.ClientSession | None = None
        self._pool: H1Pool | None = None
        self._tls: ssl.SSLContext | None = None
        self._env = Environment.EMPTY
        self._env_read = False

    def _read_environment(self) -> None:
        """Look up the proxies and .netrc once, at the first request of either client."""
        if not self._env_read:
            self._env_read = True
            self._env = Environment()

    def _tls_context(self) -> ssl.SSLContext:
        """The verifying TLS context of the builtin client (made at its first https connection: loading the
        system's CAs costs milliseconds a plain-http job need not pay)."""
        if self._tls is None:
            self._tls = ssl.create_default_context(cafile=self.ca_file)
        return self._tls

    def _get_pool(self) -> H1Pool:
        if self._pool is None:
            self._pool = H1Pool(limit=self.max_connections, tls=self._tls_context,
                                connect_timeout=self._timeout.sock_connect, read_timeout=self._timeout.sock_read,
                                headers=DEFAULT_HEADERS)
        return self._pool

    def environment(self, target: str, headers: dict[str, str]) -> dict[str, Any]:
        """``headers`` plus what the environment adds to a request for ``target`` (a .netrc login; the proxy and its
        login): the keyword arguments of every request this backend sends, after :meth:`_get_session`."""
        proxy, proxy_headers, login = self._env.for_url(target, "Authorization" in headers)
        if login is not None:
            headers = {**headers, "Authorization": login}
        return {"headers": headers, "proxy": proxy, "proxy_headers": proxy_headers}

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            import aiohttp  # here, not at the top (see Answer)

            tls: ssl.SSLContext | bool = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else True
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0, ttl_dns_cache=300, ssl=tls)
            # trust_env=False: aiohttp would read .netrc and the proxy variables again on every request, two thread
            # hops each time (about 300 us a request on two busy cores); Environment reads them once instead.
            self._read_environment()
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, trust_env=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._timeout.sock_connect,
                                              sock_read=self._timeout.sock_read),
                read_bufsize=READ_BUFSIZE, headers=DEFAULT_HEADERS,
            )
        return self._session

    async def request_headers(self, url: str, start: int, end: int | None) -> dict[str, str]:
        """Headers for one request; signing backends (S3, GCS, Azure) override this."""
        headers = dict(self.headers)
        if start or end is not None:
            headers["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        return headers

    def request_url(self, url: str) -> str:
        """The URL actually fetched (cloud backends map their scheme to an https endpoint)."""
        check_http_url(url)
        return url

    async def resolve(self, url: str, start: int, end: int | None, method: str = "GET") -> tuple[str, dict[str, str]]:
        """The request to send for ``url``: target URL and headers. Backends that sign requests (a
        presigned URL, a bearer token) override this or the two hooks it calls."""
        return self.request_url(url), await self.request_headers(url, start, end)

    def auth_description(self) -> str:
        """Which credential source is in use, for permission errors (never a secret). Empty: none."""
        return ""

    async def response_error(self, response: Answer, shown: str, offset: int) -> Exception:
        """The error for a non-2xx answer, with the store's error code when its body names one."""
        body = b""
        with contextlib.suppress(*client_errors(), asyncio.TimeoutError):  # the status alone still says enough
            body = await response.content.read(2048)
        found = [m.group(1).decode("utf-8", "replace") if m else ""
                 for m in (_XML_CODE.search(body), _JSON_REASON.search(body), _JSON_MESSAGE.search(body))]
        code = found[0] or found[1] or response.headers.get("x-ms-error-code", "")
        detail = found[0] or redact_text(found[2]) or code
        auth = self.auth_description() if response.status in (401, 403) else ""
        return status_error(response.status, shown, response.reason or "", offset=offset, code=code,
                            notes=(detail, auth))

    def conditions(self, target: str, headers: dict[str, str], expect: ObjectIdentity | None) -> str:
        """Make a request conditional on the object version ``expect`` (``If-Match`` on its ETag, which S3,
        Azure and most http servers honour) and return the target URL; a store that has changed answers
        412, which becomes :class:`~wds_async.errors.ObjectChanged`. GCS overrides this."""
        if expect is not None and expect.etag:
            headers["If-Match"] = expect.etag
        return target

    def open(self, url: str, *, start: int = 0, end: int | None = None,
             expect: ObjectIdentity | None = None) -> AbstractAsyncContextManager[ByteStream]:
        """An async context manager that sends the GET and gives its 200/206 answer as a :class:`ByteStream`
        (an error answer raises, translated); on exit the connection is pooled or closed (see :meth:`streaming`)."""
        return _Opening(self, url, start, end, expect)

    async def answer(self, url: str, start: int, end: int | None, expect: ObjectIdentity | None) -> _Streaming:
        """Send the GET of ``[start, end)`` of ``url`` (conditional on ``expect``) and own its 200/206 answer; an
        error answer is closed and raised as the error it translates to. What :meth:`open` enters."""
        shown = redact_url(url)
        target, headers = await self.resolve(url, start, end)
        target = self.conditions(target, headers, expect)
        response = await self.get(target, headers, shown, start)
        if response.status not in (200, 206):
            try:
                raise await self.response_error(response, shown, start)
            finally:
                response.close()
        return self.streaming(response, shown, start, end)

    async def get(self, target: str, headers: dict[str, str], shown: str, start: int | None) -> Answer:
        """GET ``target`` (any status comes back): through the builtin client, unless a proxy applies to it or
        ``client="aiohttp"``; a redirect it answers (a 3xx with a Location) is asked again through aiohttp, which
        follows redirects."""
        self._read_environment()
        request = self.environment(target, headers)
        if self.client == "builtin" and request["proxy"] is None:
            with map_aiohttp_errors(shown, start):
                answer = await self._get_pool().get(target, request["headers"])
            if not (300 <= answer.status < 400 and "Location" in answer.headers):
                return answer
            answer.close()  # a redirect (a 3xx with nowhere to go is an answer, as aiohttp returns it)
        session = self._get_session()
        with map_aiohttp_errors(shown, start):
            return await session.get(target, **request, allow_redirects=True)

    def streaming(self, response: Answer, shown: str, start: int, end: int | None) -> _Streaming:
        """Own a 200/206 ``response`` as a :class:`ByteStream` (an async context manager): on exit the chunk
        iterator is finalised and the connection returns to the pool when the body was read to the end, else it
        is closed."""
        try:
            stream = self.stream_from(response, shown, start, end)
        except BaseException:
            response.close()  # an answer whose headers it cannot read: its connection must not stay held
            raise
        return _Streaming(stream, response)

    def stream_from(self, response: Answer, shown: str, start: int, end: int | None) -> ByteStream:
        """The :class:`ByteStream` of a 200/206 response to a request for ``[start, end)``; a 200 to a
        ranged request (the server ignored Range) skips the first ``start`` bytes itself."""
        skip = start if (response.status == 200 and start) else 0
        return ByteStream(
            self._chunks(response, shown, start, skip, response.content_length, end),
            start=start, identity=identity_from_headers(response.headers, response.status),
            info={"status": response.status,
                  # A 206, or "Accept-Ranges: bytes": ranged parts of this object will be served as ranges.
                  "accept_ranges": response.status == 206
                  or response.headers.get("Accept-Ranges", "").strip().lower() == "bytes"},
        )

    async def _chunks(
        self, response: Answer, url: str, start: int, skip: int, length: int | None,
        end: int | None,
    ) -> AsyncIterator[bytes]:
        received = 0  # bytes of the body, including skipped ones
        pos = start   # object offset of the next byte we yield
        content = response.content
        limit = self.chunk_bytes
        stall = self._timeout.sock_read
        while True:
            with map_aiohttp_errors(url, pos, reading=True, read_timeout=stall):
                # readchunk() hands over a piece aiohttp already holds (one socket read, ~256 KB at most)
                # as it is. read(n) joined the pieces into a fresh object of up to chunk_bytes: a copy of
                # every byte, into newly mapped pages, that cost ~0.3-0.5 CPU s/GB on loopback
                # (benchmarks/cpu.py). A piece over chunk_bytes is still handed over in parts below, so the
                # byte budget's per-reader slack stays one chunk. aiohttp's own buffer stays at its 64 KiB
                # default: it is memory outside max_buffered_bytes, per connection.
                chunk, http_chunk_end = await content.readchunk()
            if not chunk:
                if http_chunk_end:
                    continue  # the end of one chunk of a chunked-encoding body, not of the body
                break
            received += len(chunk)
            if skip:
                if len(chunk) <= skip:
                    skip -= len(chunk)
                    continue
                chunk, skip = chunk[skip:], 0
            last = False
            if end is not None and pos + len(chunk) >= end:
                chunk, last = chunk[: end - pos], True
            k = 0
            while len(chunk) - k > limit:  # chunk_bytes below one socket read: hand it over in parts
                pos += limit
                yield chunk[k : k + limit]
                k += limit
            if k < len(chunk):
                rest = chunk[k:] if k else chunk
                pos += len(rest)
                yield rest
            if last:
                return
        if length is not None and received < length:
            raise TransientError(f"body ended after {received} of {length} bytes", url=url, offset=pos)

    async def size(self, url: str) -> int | None:
        shown = redact_url(url)
        target, headers = await self.resolve(url, 0, None, "HEAD")
        headers.pop("Range", None)
        with map_aiohttp_errors(shown):
            session = self._get_session()
            async with session.head(target, **self.environment(target, headers), allow_redirects=True) as response:
                if response.status != 200:
                    raise await self.response_error(response, shown, 0)
                return response.content_length

    async def list(self, pattern: str) -> list[str]:
        raise BackendError("plain http(s) has no listing API: give the shard names with a brace pattern such as "
                           "shard-{000000..000099}.tar", url=redact_url(pattern))

    async def aclose(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.aclose()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


class _Streaming:
    """What :meth:`HttpBackend.streaming` returns: a class rather than an ``asynccontextmanager`` generator, since
    one is entered per request (a random-access read is a request per sample)."""

    __slots__ = ("response", "stream")

    def __init__(self, stream: ByteStream, response: Answer) -> None:
        self.stream, self.response = stream, response

    async def __aenter__(self) -> ByteStream:
        return self.stream

    async def __aexit__(self, *exc_info: object) -> None:
        response = self.response
        try:
            await self.stream.aclose()
        finally:
            response.release() if response.content.at_eof() else response.close()


class _Opening:
    """What :meth:`HttpBackend.open` returns: a class rather than an ``asynccontextmanager`` generator, since one
    is entered per request."""

    __slots__ = ("backend", "end", "expect", "held", "start", "url")

    def __init__(self, backend: HttpBackend, url: str, start: int, end: int | None,
                 expect: ObjectIdentity | None) -> None:
        self.backend, self.url, self.start, self.end, self.expect = backend, url, start, end, expect
        self.held: _Streaming | None = None

    async def __aenter__(self) -> ByteStream:
        self.held = held = await self.backend.answer(self.url, self.start, self.end, self.expect)
        return held.stream

    async def __aexit__(self, *exc_info: object) -> None:
        held, self.held = self.held, None
        if held is not None:
            await held.__aexit__(*exc_info)
