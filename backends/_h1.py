"""A lean HTTP/1.1 client for the one request that moves the bytes: a GET of an object (or a range of it).

Why not aiohttp for this request: aiohttp's response parser copies every piece of a body out of the socket's
bytes into a payload buffer of its own, and pays a few Python frames per piece and per request on the loop
thread, which is the loader's bottleneck wherever the CPU binds. Measured on the 2-core development machine
(unthrottled loopback http, `benchmarks.cpu`, a prototype of this module against aiohttp, in turn): raw download
2.16 -> 3.97 GB/s, the loader 0.95 -> 1.09 GB/s at 16 connections (CPU 1.05 -> 0.91-0.97 s/GB), and the README's
short-epoch scenario (b) at 256 connections 386-431 -> 472-525 MB/s. So :class:`~.http.HttpBackend` sends its GETs
here, and keeps aiohttp for everything else (HEAD, listings, uploads, proxies, redirects).

What it does:

* HTTP/1.1 GETs with keep-alive: idle connections are pooled per (scheme, host, port) and dropped after
  ``keepalive`` seconds idle; at most ``limit`` connections are in use at once (idle ones do not count).
  A reused connection that the server closed while it was idle is replaced once, before any byte of the answer.
* Bodies framed by Content-Length, by the chunked transfer coding, or by the connection's close.
* Flow control: a connection stops reading from its socket, and drops its receive buffer, while ``PAUSE_BYTES`` of
  body wait for the reader in pieces. So the memory one answer holds outside the engine's byte budget is at most
  ``READ_BYTES + PAUSE_BYTES`` (the buffer and what waits, or what waits after the piece that crossed the line):
  with the piece a reader holds before counting it, within ``HttpBackend.capabilities.buffer_allowance``.
* The receive buffer is filled across socket reads while the reader is busy and handed over as one ``bytes``
  when the reader asks (or the buffer is full): one copy per byte, like the socket's own, and fewer, larger
  pieces for the engine when the loop is busy.
* Errors are aiohttp's types where aiohttp has one for the same event (a body cut short is a
  ``ClientPayloadError``, a server that closed before answering a ``ServerDisconnectedError``), ``TimeoutError``
  for a stall, ``OSError`` and ``ssl`` errors as the socket raises them, so :mod:`._errors` stays the one table.
  A malformed answer is a :class:`MalformedAnswer`, an ``aiohttp.ClientError`` (the table's "request failed").

What it does not do (the caller sends those requests through aiohttp): proxies, redirects (a 3xx answer is
handed back, and the caller repeats the request there), cookies, compression (``Accept-Encoding: identity``),
HTTP/2.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

__all__ = ["H1Answer", "H1Pool", "MalformedAnswer", "READ_BYTES", "PAUSE_BYTES"]

#: The receive buffer of a connection while an answer is read and its socket is not paused (allocated per answer,
#: dropped while paused or idle). The pieces it hands over are up to this size: fewer, larger pieces cost the engine
#: less (1 GB through the loader, medians of 5 side by side: 256 KiB 1.04-1.07x the MB/s of aiohttp, 160 KiB 0.98x).
READ_BYTES = 256 << 10
#: A connection stops reading from its socket while this much body waits for its reader in pieces.
PAUSE_BYTES = 128 << 10
#: An answer's head (status line and headers) larger than this is refused as malformed.
MAX_HEAD_BYTES = 64 << 10
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) (\d{3})(?: ([^\r\n]*))?")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_DNS_TTL = 300.0


class MalformedAnswer(aiohttp.ClientError):
    """The server's bytes are not an HTTP/1.x answer (a bad status line, header or chunk size)."""


class _Wire(asyncio.BufferedProtocol):
    """One connection's bytes: a byte pipe with flow control, no parsing (the answer parses what it takes)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf: bytearray | None = None
        self.fill = 0
        self.pieces: collections.deque[bytes] = collections.deque()
        self.queued = 0
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.error: BaseException | None = None
        self.paused = False
        self.received = 0  # bytes since the connection was made or went idle: 0 means the server said nothing
        self.stirred = 0.0  # the loop's time when bytes last came or a wait began: a stall is measured from it
        self.watch: asyncio.TimerHandle | None = None
        self.stall: float | None = None

    # -- the transport's side ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.buf is None:
            self.buf = bytearray(READ_BYTES)
        return memoryview(self.buf)[self.fill:]

    def buffer_updated(self, nbytes: int) -> None:
        if self.watch is not None:
            self.stirred = time.monotonic()
        self.fill += nbytes
        self.received += nbytes
        if self.waiter is not None or self.fill >= len(self.buf or b"") - 4096:
            self._flush()
            self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._flush()
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.error = exc
        self._flush()
        self._wake()

    # -- the reader's side ---------------------------------------------------------------------------------
    def _flush(self) -> None:
        """Hand the buffer's bytes over as one piece; pause the socket (and drop the buffer) when the pieces
        waiting reach ``PAUSE_BYTES``."""
        if self.fill and self.buf is not None:
            self.pieces.append(bytes(memoryview(self.buf)[: self.fill]))
            self.queued += self.fill
            self.fill = 0
            if self.queued >= PAUSE_BYTES and not self.paused and not self.closed and self.transport is not None:
                self.paused = True
                self.buf = None
                self.transport.pause_reading()

    def _wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def take(self) -> bytes | None:
        """The next piece of what the server sent, or None when nothing is there now."""
        if not self.pieces:
            self._flush()
            if not self.pieces:
                return None
        piece = self.pieces.popleft()
        self.queued -= len(piece)
        if self.paused and self.queued < PAUSE_BYTES // 2 and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return piece

    def unread(self, piece: bytes) -> None:
        """Put back what the reader took too much of (the start of the body after the head)."""
        self.pieces.appendleft(piece)
        self.queued += len(piece)

    async def wait(self, stall: float | None) -> None:
        """Until the server sends more or closes; ``TimeoutError`` after ``stall`` seconds of neither.

        The stall is watched by one timer per connection, re-armed for what is left when it fires early, rather
        than a timeout per wait (``asyncio.timeout`` schedules and cancels a timer each time: 5-10% of the loop
        thread when every socket read wakes a reader)."""
        loop = asyncio.get_running_loop()
        self.waiter = waiter = loop.create_future()
        if stall is not None:
            self.stirred = time.monotonic()
            self.stall = stall
            if self.watch is None:
                self.watch = loop.call_later(stall, self._watchdog)
        await waiter

    def _watchdog(self) -> None:
        self.watch = None
        waiter, stall = self.waiter, self.stall
        if waiter is None or waiter.done() or stall is None:
            return  # nobody waits: a reader that comes back arms it again
        quiet = time.monotonic() - self.stirred
        if quiet >= stall:
            self.waiter = None
            waiter.set_exception(TimeoutError(f"no data for {stall:g} s"))
        else:
            self.watch = asyncio.get_running_loop().call_later(stall - quiet, self._watchdog)

    def _unwatch(self) -> None:
        if self.watch is not None:
            self.watch.cancel()
            self.watch = None

    def idle(self) -> None:
        """Between answers: no buffer held, nothing pending, reading on (to see the server close it)."""
        self.buf = None
        self.fill = 0
        self.received = 0
        self._unwatch()
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        """Drop the connection now: ``abort``, not ``close``, as nothing it holds is worth a flush, and a TLS
        ``close`` waits for the peer's close_notify (up to 30 s), past the end of the engine's loop."""
        self.closed = True
        self._unwatch()
        if self.transport is not None:
            self.transport.abort()


class _Dechunk:
    """The chunked transfer coding (RFC 9112 section 7.1), sans I/O: ``feed`` bytes of the wire, get bytes of
    the body; ``done`` after the last chunk and its trailer."""

    def __init__(self) -> None:
        self.line = b""       # a size or trailer line being gathered
        self.left = 0         # data bytes left in the current chunk
        self.state = "size"   # size, data, crlf, trailer, done

    def feed(self, data: bytes) -> list[bytes]:
        out: list[bytes] = []
        i, n = 0, len(data)
        while i < n and self.state != "done":
            if self.state == "data":
                take = min(self.left, n - i)
                out.append(data[i : i + take] if (i or take < n) else data)
                i += take
                self.left -= take
                if not self.left:
                    self.state = "crlf"
                continue
            end = data.find(b"\n", i)
            if end < 0:
                self.line += data[i:]
                if len(self.line) > 4096:
                    raise MalformedAnswer("chunked body: a chunk size or trailer line over 4 KiB")
                break
            line, self.line, i = (self.line + data[i:end]).rstrip(b"\r"), b"", end + 1
            if self.state == "crlf":
                if line:
                    raise MalformedAnswer("chunked body: chunk data not followed by CRLF")
                self.state = "size"
            elif self.state == "size":
                digits = line.split(b";", 1)[0].strip()
                if not digits or len(digits) > 16 or not all(c in b"0123456789abcdefABCDEF" for c in digits):
                    raise MalformedAnswer(f"chunked body: bad chunk size {line[:40]!r}")
                self.left = int(digits, 16)
                self.state = "data" if self.left else "trailer"
            elif not line:  # trailer: header lines until an empty one
                self.state = "done"
        return out


class H1Answer:
    """One answer: status and headers at once, the body through ``readchunk()``/``read()``, as aiohttp's
    ``ClientResponse`` and its ``content`` offer them (the subset :class:`~.http.HttpBackend` uses)."""

    method = "GET"

    def __init__(self, pool: H1Pool, key: tuple[str, str, int], wire: _Wire, url: URL, sent: CIMultiDict[str],
                 version: int, status: int, reason: str, headers: CIMultiDict[str], stall: float | None) -> None:
        self._pool, self._key, self._wire = pool, key, wire
        self.url = url
        self.request_info = _Sent(sent)
        self.status, self.reason = status, reason
        self.headers: CIMultiDictProxy[str] = CIMultiDictProxy(headers)
        self.content = self  # aiohttp's ``response.content.readchunk()`` reads as ``answer.readchunk()``
        self._stall = stall
        self._reusable = version == 1 and "close" not in headers.get("Connection", "").lower()
        self._dechunk: _Dechunk | None = None
        self._left: int | None = None  # body bytes still to come, when Content-Length framed it
        self._carry = b""  # taken by read(n) beyond n
        self._out: collections.deque[bytes] = collections.deque()
        self._eof = False
        self._held = True  # the connection (and its slot in the pool) is still ours
        if status in (204, 304) or 100 <= status < 200:
            self._left = 0
        elif "chunked" in headers.get("Transfer-Encoding", "").lower():
            self._dechunk = _Dechunk()
        elif "Content-Length" in headers:
            value = headers["Content-Length"].strip()
            if not value.isdigit():
                raise MalformedAnswer(f"bad Content-Length {value[:40]!r}")
            self._left = int(value)
        else:
            self._reusable = False  # framed by the close
        self.content_length = self._left if self._dechunk is None else None
        if self._left == 0:
            self._eof = True

    def at_eof(self) -> bool:
        return self._eof and not self._out and not self._carry

    async def readchunk(self) -> tuple[bytes, bool]:
        """The next piece of the body, ``(b"", False)`` at its end (aiohttp's contract; never an end of chunk)."""
        if self._carry:
            carried, self._carry = self._carry, b""
            return carried, False
        while not self._out:
            if self._eof:
                return b"", False
            piece = self._wire.take()
            if piece is None:
                if self._wire.closed:
                    self._at_close()
                    continue
                await self._wire.wait(self._stall)
                continue
            self._frame(piece)
        return self._out.popleft(), False

    def _frame(self, piece: bytes) -> None:
        """Add a piece of the wire to the body, by the answer's framing."""
        if self._dechunk is not None:
            self._out.extend(p for p in self._dechunk.feed(piece) if p)
            if self._dechunk.state == "done":
                self._eof = True
        elif self._left is not None:
            if len(piece) >= self._left:
                if len(piece) > self._left:
                    self._reusable = False  # bytes beyond the body: the connection is out of step
                    piece = piece[: self._left]
                self._eof = True
            self._left -= len(piece)
            if piece:
                self._out.append(piece)
        else:
            self._out.append(piece)

    def _at_close(self) -> None:
        """The server closed the connection with nothing left unread."""
        self._reusable = False
        if self._dechunk is None and self._left is None:
            self._eof = True  # the close is the end of this body
            return
        cause = self._wire.error
        raise aiohttp.ClientPayloadError(f"Response payload is not completed: connection closed "
                                         f"{'(' + str(cause) + ') ' if cause else ''}before the end of the body")

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes of the body (all of it for -1): what error answers are read with."""
        parts: list[bytes] = []
        have = 0
        while n < 0 or have < n:
            piece, _ = await self.readchunk()
            if not piece:
                break
            if n >= 0 and have + len(piece) > n:
                piece, self._carry = piece[: n - have], piece[n - have :]
            parts.append(piece)
            have += len(piece)
        return b"".join(parts)

    def release(self) -> None:
        """Done with the answer: its connection goes back to the pool when the body was read to its end and the
        connection can carry another request, else it is closed."""
        if not self._held:
            return
        self._held = False
        wire = self._wire
        if self.at_eof() and self._reusable and not wire.closed and not wire.pieces and not wire.fill:
            self._pool._put_back(self._key, wire)
        else:
            wire.close()
            self._pool._slots.release()

    def close(self) -> None:
        """Done with the answer before its end: the connection is closed."""
        if self._held:
            self._reusable = False
            self.release()


class _Sent:
    """What aiohttp's ``RequestInfo`` offers that the backends read: the headers that were sent."""

    def __init__(self, headers: CIMultiDict[str]) -> None:
        self.headers = CIMultiDictProxy(headers)


class H1Pool:
    """Keep-alive connections for GETs, per (scheme, host, port); one per event loop (a backend's)."""

    def __init__(self, *, limit: int, tls: Callable[[], ssl.SSLContext], connect_timeout: float | None,
                 read_timeout: float | None, headers: Mapping[str, str], keepalive: float = 15.0) -> None:
        self.limit = limit
        self.tls = tls
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.keepalive = keepalive
        self.default_headers = dict(headers)
        self._slots: asyncio.Semaphore | _NoLimit = asyncio.Semaphore(limit) if limit > 0 else _NoLimit()
        self._idle: dict[tuple[str, str, int], list[tuple[_Wire, float]]] = {}
        self._dns: dict[tuple[str, int], tuple[float, list[Any]]] = {}
        self._closed = False

    async def get(self, url: str, headers: Mapping[str, str]) -> H1Answer:
        """Send ``GET url`` with ``headers`` and return the answer once its head has arrived (any status)."""
        target = URL(url)
        scheme, host, port = target.scheme, target.raw_host, target.port
        if scheme not in ("http", "https") or not host or port is None:
            raise aiohttp.InvalidURL(url)
        key = (scheme, host, port)
        sent = CIMultiDict(self.default_headers)
        sent.update(headers)
        sent["Host"] = _host_header(host, port, target.is_default_port())
        request = _request_bytes(target.raw_path_qs, sent)
        await self._slots.acquire()
        try:
            return await self._exchange(key, target, sent, request)
        except BaseException:
            self._slots.release()
            raise

    async def _exchange(self, key: tuple[str, str, int], target: URL, sent: CIMultiDict[str],
                        request: bytes) -> H1Answer:
        while True:
            wire = self._take_idle(key)
            reused = wire is not None
            if wire is None:
                wire = await self._connect(key)
            try:
                assert wire.transport is not None
                wire.transport.write(request)
                version, status, reason, headers = await self._head(wire)
                return H1Answer(self, key, wire, target, sent, version, status, reason, headers, self.read_timeout)
            except aiohttp.ServerDisconnectedError:
                wire.close()
                if reused and not wire.received:
                    continue  # the server closed it while it was idle: once more on a fresh connection
                raise
            except BaseException:
                wire.close()
                raise

    async def _head(self, wire: _Wire) -> tuple[int, int, str, CIMultiDict[str]]:
        """Read the status line and headers (skipping 1xx answers); put back the body's first bytes."""
        head = b""
        while True:
            end = head.find(b"\r\n\r\n")
            if end < 0:
                if len(head) > MAX_HEAD_BYTES:
                    raise MalformedAnswer(f"an answer's head over {MAX_HEAD_BYTES >> 10} KiB")
                piece = wire.take()
                if piece is not None:
                    head += piece
                elif wire.closed:
                    raise aiohttp.ServerDisconnectedError(
                        f"Server disconnected{' (' + str(wire.error) + ')' if wire.error else ''}")
                else:
                    await wire.wait(self.read_timeout)
                continue
            rest, head = head[end + 4 :], head[:end]
            version, status, reason, headers = _parse_head(head)
            if 100 <= status < 200 and status != 101:
                head = rest  # an interim answer (100 Continue, 103 Early Hints): the real one follows
                continue
            if rest:
                wire.unread(rest)
            return version, status, reason, headers

    def _take_idle(self, key: tuple[str, str, int]) -> _Wire | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            wire, since = idle.pop()
            if not wire.closed and not wire.received and now - since < self.keepalive:
                return wire
            wire.close()  # closed by the server, too old, or sent bytes nobody asked for (out of step)
        return None

    def _put_back(self, key: tuple[str, str, int], wire: _Wire) -> None:
        wire.idle()
        if self._closed:
            wire.close()
        else:
            self._idle.setdefault(key, []).append((wire, time.monotonic()))
        self._slots.release()

    async def _connect(self, key: tuple[str, str, int]) -> _Wire:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        tls = self.tls() if scheme == "https" else None
        async with asyncio.timeout(self.connect_timeout):
            addresses = await self._resolve(host, port)
            error: BaseException | None = None
            for family, kind, proto, _, address in addresses:
                try:
                    transport, wire = await loop.create_connection(
                        _Wire, address[0], address[1], family=family, proto=proto, ssl=tls,
                        server_hostname=host if tls is not None else None)
                except OSError as exc:  # the next address (an IPv6 one refused, the IPv4 one listening)
                    error = exc
                    continue
                sock = transport.get_extra_info("socket")
                if sock is not None and kind == socket.SOCK_STREAM:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return wire
        assert error is not None
        raise error

    async def _resolve(self, host: str, port: int) -> list[Any]:
        """The host's addresses, looked up once per ``_DNS_TTL`` seconds (as aiohttp's ``ttl_dns_cache``)."""
        now = time.monotonic()
        known = self._dns.get((host, port))
        if known is not None and now - known[0] < _DNS_TTL:
            return known[1]
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        if not found:
            raise OSError(f"no address for {host}")
        self._dns[(host, port)] = (now, found)
        return found

    async def aclose(self) -> None:
        """Close the idle connections; those in use close when their answers are released."""
        self._closed = True
        for idle in self._idle.values():
            for wire, _ in idle:
                wire.close()
        self._idle.clear()


class _NoLimit:
    """A semaphore that never waits (``limit=0``: no cap on connections, as aiohttp's ``limit=0``)."""

    async def acquire(self) -> bool:
        return True

    def release(self) -> None:
        return None


def _host_header(host: str, port: int, default_port: bool) -> str:
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    return host if default_port else f"{host}:{port}"


def _request_bytes(path: str, headers: CIMultiDict[str]) -> bytes:
    """``GET path HTTP/1.1`` and the headers, refusing a name or value that would split the request."""
    lines = [f"GET {path or '/'} HTTP/1.1\r\n"]
    for name, value in headers.items():
        value = str(value)
        if not _TOKEN.fullmatch(name) or any(c in value for c in "\r\n\0"):
            raise ValueError(f"a request header cannot be sent as it is: {name!r}")
        lines.append(f"{name}: {value}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")


def _parse_head(head: bytes) -> tuple[int, int, str, CIMultiDict[str]]:
    """(minor version, status, reason, headers) of an answer's head, without its final blank line."""
    status_line, _, rest = head.partition(b"\r\n")
    m = _STATUS_LINE.fullmatch(status_line)
    if m is None:
        raise MalformedAnswer(f"not an HTTP/1.x status line: {status_line[:60]!r}")
    headers: CIMultiDict[str] = CIMultiDict()
    for line in rest.split(b"\r\n") if rest else ():
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise MalformedAnswer(f"bad header line {line[:60]!r}")
        headers.add(name.decode("latin-1"), value.strip(b" \t").decode("latin-1"))
    return int(m.group(1)), int(m.group(2)), (m.group(3) or b"").decode("latin-1"), headers
