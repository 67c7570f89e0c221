"""One connection of the builtin HTTP/1.1 client (:mod:`._h1`): a byte pipe with flow control and a stall watch.

It parses nothing: the answer (:class:`._h1.H1Answer`) takes what it needs through :meth:`Wire.take`. See
:mod:`._h1` for the sizes (``READ_BYTES``, ``PAUSE_BYTES``) and why they are what they are.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import cast

__all__ = ["PAUSE_BYTES", "READ_BYTES", "SPARE_BUFFERS", "Wire"]

#: The receive buffer of a connection while an answer is read and its socket is not paused (allocated per answer,
#: dropped while paused or idle). The pieces it hands over are up to this size: fewer, larger pieces cost the engine
#: less (1 GB through the loader, medians of 5 side by side: 256 KiB 1.04-1.07x the MB/s of aiohttp, 160 KiB 0.98x).
READ_BYTES = 256 << 10
#: A connection stops reading from its socket while this much body waits for its reader in pieces.
PAUSE_BYTES = 128 << 10
#: Receive buffers a pool keeps for its next answers (a fresh one is zeroed: 256 KiB per small ranged GET).
SPARE_BUFFERS = 8
#: The smallest receive buffer: an answer expected to be smaller (``Wire.expect``) gets a buffer of its size, not
#: ``READ_BYTES``, when the pool has no spare one.
MIN_READ_BYTES = 16 << 10


class Wire(asyncio.BufferedProtocol):
    """One connection's bytes: a byte pipe with flow control, no parsing (the answer parses what it takes)."""

    def __init__(self, spare: list[bytearray]) -> None:
        self.transport: asyncio.Transport | None = None
        self.spare = spare  # the pool's buffers between answers: never referenced elsewhere (pieces are copies)
        self.buf: bytearray | None = None
        self.fill = 0
        #: The bytes the answer being read is expected to take (head and body), when the request says (a range);
        #: a fresh buffer for it is no larger. Cleared between answers.
        self.expect: int | None = None
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
            if self.spare:
                self.buf = self.spare.pop()
            else:
                # A 64 KiB range in a fresh 256 KiB buffer zeroed it all and faulted its pages in. Sized for the
                # range, 8,000 random samples (batches of 64) in one process peaked 9-10 MB lower with half the
                # minor faults; CPU per sample moved within the noise
                expect = self.expect
                size = READ_BYTES if expect is None else min(READ_BYTES, max(MIN_READ_BYTES, expect))
                self.buf = bytearray(size)
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
                self._drop_buffer()
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
        if self.queued < PAUSE_BYTES // 2:
            self._resume()
        return piece

    def _resume(self) -> None:
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

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

    def _drop_buffer(self) -> None:
        if self.buf is not None and len(self.buf) == READ_BYTES and len(self.spare) < SPARE_BUFFERS:
            self.spare.append(self.buf)
        self.buf = None

    def idle(self) -> None:
        """Between answers: no buffer held, nothing pending, reading on (to see the server close it)."""
        self._drop_buffer()
        self.fill = 0
        self.received = 0
        self.expect = None
        self._unwatch()
        self._resume()

    def close(self) -> None:
        """Drop the connection now: ``abort``, not ``close``, as nothing it holds is worth a flush, and a TLS
        ``close`` waits for the peer's close_notify (up to 30 s), past the end of the engine's loop."""
        self.closed = True
        self._unwatch()
        if self.transport is not None:
            self.transport.abort()
