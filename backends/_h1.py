"""A lean HTTP/1.1 client for the one request that moves the bytes: a GET of an object (or a range of it).

Why not aiohttp for this request: aiohttp's response parser copies every piece of a body out of the socket's
bytes into a payload buffer of its own, and pays a few Python frames per piece and per request on the loop
thread, which is the loader's bottleneck wherever the CPU binds. Measured on the 2-core development machine against
aiohttp, in turn (unthrottled loopback http, 16 connections): the loader 1.04-1.12x the MB/s (medians of 5 passes of
1 GB) at 4-12% less CPU per GB, raw download 1.1x, CPU per sample of random access 8-16% less; the figures are in
``docs/benchmarks.md``. (A prototype that handed out views of its buffers and let 512 KiB wait gained more, 1.14x and
1.83x, but held memory the byte budget does not count.) So :class:`~.http.HttpBackend` sends its GETs here, and keeps
aiohttp for everything else (HEAD, listings, uploads, proxies, redirects).

The client is three modules: :mod:`._h1frame` (the framing, sans I/O), :mod:`._h1wire` (one connection's bytes,
flow control and stall watch) and this one (answers and the pool).

What it does:

* HTTP/1.1 GETs with keep-alive: idle connections are pooled per (scheme, host, port) and dropped after
  ``keepalive`` seconds idle; at most ``limit`` connections are in use at once (idle ones do not count).
  A reused connection that the server closed while it was idle is replaced once, before any byte of the answer.
* Bodies framed by Content-Length, by the chunked transfer coding, or by the connection's close. Another transfer
  coding is refused as a malformed answer (its bytes are not the object's); an answer framed both by chunks and by
  Content-Length is read by its chunks, and its connection closed after.
* Flow control: a connection stops reading from its socket, and drops its receive buffer, while ``PAUSE_BYTES`` of
  body wait for the reader in pieces. So the memory one answer holds outside the engine's byte budget is at most
  ``READ_BYTES + PAUSE_BYTES`` (the buffer and what waits, or what waits after the piece that crossed the line):
  with the piece a reader holds before counting it, within ``HttpBackend.capabilities.buffer_allowance``.
* The receive buffer is filled across socket reads while the reader is busy and handed over as one ``bytes``
  when the reader asks (or the buffer is full): one copy per byte, like the socket's own, and fewer, larger
  pieces for the engine when the loop is busy. A ranged GET's buffer, when the pool has no spare one, is sized for
  its range (``Wire.expect``: the range and ``HEAD_ROOM``) rather than ``READ_BYTES``: random access sends one
  64 KiB range per sample, a batch at a time, and a fresh buffer is zeroed and faulted in whole.
* Errors are the namesakes of aiohttp's types for the same event, defined in :mod:`._h1frame` (a body cut short
  is a ``ClientPayloadError``, a server that closed before answering a ``ServerDisconnectedError``), ``TimeoutError``
  for a stall, ``OSError`` and ``ssl`` errors as the socket raises them, so :mod:`._errors` stays the one table.
  A malformed answer is a :class:`MalformedAnswer`, a ``ClientError`` (the table's "request failed"). This module
  does not import aiohttp, so neither does a process that reads every shard through it.

What it does not do (the caller sends those requests through aiohttp): proxies, redirects (a 3xx answer is
handed back, and the caller repeats the request there), cookies, compression (``Accept-Encoding: identity``),
HTTP/2.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ipaddress
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from . import _h1frame as frame
from ._h1frame import MAX_HEAD_BYTES, Dechunk, MalformedAnswer, host_header, parse_head, range_size, request_bytes
from ._h1wire import PAUSE_BYTES, READ_BYTES, Wire

__all__ = ["PAUSE_BYTES", "READ_BYTES", "H1Answer", "H1Pool", "MalformedAnswer"]

_DNS_TTL = 300.0


def _literal_address(host: str, port: int) -> list[Any] | None:
    """``getaddrinfo``'s answer for an IP literal host (no lookup needed), or None for a name (and for an IPv6
    literal with a zone, whose scope id only the resolver fills in)."""
    if "%" in host:
        return None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if ip.version == 6:
        return [(socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port, 0, 0))]
    return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port))]


#: What an answer's head may take beyond a ranged GET's body, in the receive buffer sized for it (``Wire.expect``).
HEAD_ROOM = 8 << 10


class H1Answer:
    """One answer: status and headers at once, the body through ``readchunk()``/``read()``, as aiohttp's
    ``ClientResponse`` and its ``content`` offer them (the subset :class:`~.http.HttpBackend` uses)."""

    method = "GET"

    def __init__(self, pool: H1Pool, key: tuple[str, str, int], wire: Wire, url: URL, sent: CIMultiDict[str],
                 version: int, status: int, reason: str, headers: CIMultiDict[str], stall: float | None) -> None:
        self._pool, self._key, self._wire = pool, key, wire
        self.url = url
        self.request_info = _Sent(sent)
        self.status, self.reason = status, reason
        self.headers: CIMultiDictProxy[str] = CIMultiDictProxy(headers)
        self.content = self  # aiohttp's ``response.content.readchunk()`` reads as ``answer.readchunk()``
        self._stall = stall
        self._reusable = version == 1 and "close" not in headers.get("Connection", "").lower()
        self._dechunk: Dechunk | None = None
        self._left: int | None = None  # body bytes still to come, when Content-Length framed it
        self._carry = b""  # taken by read(n) beyond n
        self._out: collections.deque[bytes] = collections.deque()
        self._eof = False
        self._held = True  # the connection (and its slot in the pool) is still ours
        codings = [c.strip() for c in ",".join(headers.getall("Transfer-Encoding", ())).lower().split(",") if c.strip()]
        if status in (204, 304) or 100 <= status < 200:
            self._left = 0
        elif codings:
            # Only the chunked coding is understood: any other would hand coded bytes over as the object's
            # (RFC 9112 section 6.1; the request asked for none)
            if codings != ["chunked"]:
                raise MalformedAnswer(f"unsupported Transfer-Encoding {', '.join(codings)[:60]!r}")
            self._dechunk = Dechunk()
            if "Content-Length" in headers:
                self._reusable = False  # both framings: chunked wins, and the connection is not trusted after
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
        raise frame.ClientPayloadError(f"Response payload is not completed: connection closed "
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
        keep = self.at_eof() and self._reusable and not wire.closed and not wire.pieces and not wire.fill
        self._pool._give_back(self._key, wire, keep)

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
        self._idle: dict[tuple[str, str, int], list[tuple[Wire, float]]] = {}
        self._spare: list[bytearray] = []  # receive buffers between answers, at most SPARE_BUFFERS
        self._dns: dict[tuple[str, int], tuple[float, list[Any]]] = {}
        self._looking_up: dict[tuple[str, int], asyncio.Future[list[Any]]] = {}  # lookups in flight, shared
        self._closed = False

    async def get(self, url: str, headers: Mapping[str, str]) -> H1Answer:
        """Send ``GET url`` with ``headers`` and return the answer once its head has arrived (any status)."""
        target = URL(url)
        scheme, host, port = target.scheme, target.raw_host, target.port
        if scheme not in ("http", "https") or not host or port is None:
            raise frame.InvalidURL(url)
        key = (scheme, host, port)
        sent = CIMultiDict(self.default_headers)
        sent.update(headers)
        sent["Host"] = host_header(host, port, target.is_default_port())
        request = request_bytes(target.raw_path_qs, sent)
        size = range_size(sent.get("Range"))
        expect = None if size is None else size + HEAD_ROOM
        await self._slots.acquire()
        try:
            return await self._exchange(key, target, sent, request, expect)
        except BaseException:
            self._slots.release()
            raise

    async def _exchange(self, key: tuple[str, str, int], target: URL, sent: CIMultiDict[str],
                        request: bytes, expect: int | None) -> H1Answer:
        while True:
            wire = self._take_idle(key)
            reused = wire is not None
            if wire is None:
                wire = await self._connect(key)
            try:
                assert wire.transport is not None
                wire.expect = expect
                wire.transport.write(request)
                version, status, reason, headers = await self._head(wire)
                return H1Answer(self, key, wire, target, sent, version, status, reason, headers, self.read_timeout)
            except frame.ServerDisconnectedError:
                wire.close()
                if reused and not wire.received:
                    continue  # the server closed it while it was idle: once more on a fresh connection
                raise
            except BaseException:
                wire.close()
                raise

    async def _head(self, wire: Wire) -> tuple[int, int, str, CIMultiDict[str]]:
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
                    raise frame.ServerDisconnectedError(
                        f"Server disconnected{' (' + str(wire.error) + ')' if wire.error else ''}")
                else:
                    await wire.wait(self.read_timeout)
                continue
            rest, head = head[end + 4 :], head[:end]
            version, status, reason, headers = parse_head(head)
            if 100 <= status < 200 and status != 101:
                head = rest  # an interim answer (100 Continue, 103 Early Hints): the real one follows
                continue
            if rest:
                wire.unread(rest)
            return version, status, reason, headers

    def _take_idle(self, key: tuple[str, str, int]) -> Wire | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            wire, since = idle.pop()
            if not wire.closed and not wire.received and now - since < self.keepalive:
                return wire
            wire.close()  # closed by the server, too old, or sent bytes nobody asked for (out of step)
        return None

    def _give_back(self, key: tuple[str, str, int], wire: Wire, keep: bool) -> None:
        """An answer is done with ``wire``: pooled for the next request when ``keep`` (and the pool is open), else
        closed; either way its slot is free again."""
        if keep and not self._closed:
            wire.idle()
            self._idle.setdefault(key, []).append((wire, time.monotonic()))
        else:
            wire.close()
        self._slots.release()

    async def _connect(self, key: tuple[str, str, int]) -> Wire:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        tls = self.tls() if scheme == "https" else None
        async with asyncio.timeout(self.connect_timeout):
            addresses = await self._resolve(host, port)
            error: BaseException | None = None
            for family, kind, proto, _, address in addresses:
                try:
                    transport, wire = await loop.create_connection(
                        lambda: Wire(self._spare), address[0], address[1], family=family, proto=proto, ssl=tls,
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
        """The host's addresses, looked up once per ``_DNS_TTL`` seconds (as aiohttp's ``ttl_dns_cache``); an IP
        literal is its own address. Connections opened together (the first wave of a job: hundreds) share one
        lookup rather than each sending its own to the resolver's few threads."""
        literal = _literal_address(host, port)
        if literal is not None:
            return literal
        key = (host, port)
        while True:
            known = self._dns.get(key)
            if known is not None and time.monotonic() - known[0] < _DNS_TTL:
                return known[1]
            pending = self._looking_up.get(key)
            if pending is None:
                break
            await asyncio.wait([pending])  # never raises, and this caller's cancellation leaves the lookup alone
            if not pending.cancelled() and pending.exception() is not None:
                raise OSError(str(pending.exception()))  # it names the host
        pending = self._looking_up[key] = asyncio.get_running_loop().create_future()
        try:
            try:
                found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:  # the resolver's text ("Name or service not known") does not say which name
                raise OSError(f"cannot resolve {host}: {exc}") from exc
            if not found:
                raise OSError(f"no address for {host}")
        except BaseException as exc:
            if isinstance(exc, Exception):
                pending.set_exception(exc)
                pending.exception()  # read here, so an error nobody else waited for is not logged as lost
            else:
                pending.cancel()  # this caller was cancelled: a waiter looks the host up itself
            raise
        finally:
            del self._looking_up[key]
        self._dns[key] = (time.monotonic(), found)
        pending.set_result(found)
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
