"""One client connection of the node service: its ring, its engines, its share of the node budget.

A session answers ``hello`` with ``ready`` (the ring's descriptor passed along), then runs one
:class:`~wds_async.engine.engine.Engine` per ``open`` over the client's work items, on the service's shared
limiter and backends, into a channel and byte budget of its own. Its *pump* takes samples from that channel,
copies their fields into the ring and sends their offsets; when the ring is full it waits for the client's
``ack``, so a slow client fills only its own ring and budget, and its readers give their tokens back while
they wait (``Engine(yield_tokens=True)``): other sessions keep the node's connections.

Errors the engine hands to a handler are not decided here but by the client's handler, at the item's
position (:mod:`wds_async.service.inband`). An error the engine raises outside any item ends the data, as
it does in-process. A client that closes its socket or dies ends its session:
the engine is cancelled, the channel abandoned (its bytes freed) and the ring closed.
"""

from __future__ import annotations

import array
import asyncio
import logging
import os
import socket
import time
from asyncio import TaskGroup
from typing import TYPE_CHECKING, Any

from ..cache.source import source_for
from ..engine.channel import SampleChannel
from ..engine.engine import Engine
from ..engine.failures import leaves
from ..engine.grouping import Sample
from ..engine.spec import StreamSpec
from ..engine.work import ItemDone
from ..errors import SampleError, ServiceError
from ..io.budget import ByteBudget
from ..stats import Stats
from .inband import InBand, InBandChannel
from .protocol import VERSION, FrameDecoder, encode, error_to_json, item_from_json
from .ring import Ring, one_shot

if TYPE_CHECKING:
    from .server import Service

__all__ = ["Session"]

log = logging.getLogger("wds_async")

#: Seconds without anything to send after which the pump sends ``alive`` (the client's stall guard).
ALIVE_SECONDS = 2.0
_META = ("__key__", "__url__")


class _Gone(Exception):
    """The client closed its end."""


class Session:
    """One connected client (see the module docstring)."""

    def __init__(self, service: Service, sock: socket.socket, number: int) -> None:
        self.service = service
        self.sock = sock
        self.number = number
        self.stats = Stats()
        self.ring: Ring | None = None
        self.budget: ByteBudget | None = None
        self.pid = 0
        self._decoder = FrameDecoder("a client")
        self._frames: list[dict[str, Any]] = []
        self._acked = asyncio.Event()
        self._opens: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._send_lock = asyncio.Lock()

    # -- socket I/O ------------------------------------------------------------------------------------
    async def _recv(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        while not self._frames:
            data = await loop.sock_recv(self.sock, 1 << 16)
            if not data:
                raise _Gone()
            self._frames.extend(self._decoder.feed(data))
        return self._frames.pop(0)

    async def _send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        loop = asyncio.get_running_loop()
        data = encode({**message, "fds": len(fds)} if fds else message)
        async with self._send_lock:
            if fds:
                sent = 0
                while True:
                    try:
                        sent = self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                           array.array("i", fds))])
                        break
                    except BlockingIOError:
                        await _writable(loop, self.sock)
                data = data[sent:]
            if data:
                await loop.sock_sendall(self.sock, data)

    # -- the session -------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Serve this connection until the client closes it, it fails, or the service stops."""
        try:
            hello = await self._recv()
            if hello["type"] == "status":
                await self._send({"type": "status", **self.service.status()})
                return
            self._check_hello(hello)
            self.ring = Ring(self.service.ring_bytes)
            self.service.sessions_served += 1
            await self._send({"type": "ready", "ring_bytes": self.ring.size, "session": self.number},
                             [self.ring.fd])
            async with TaskGroup() as group:
                worker = group.create_task(self._serve())
                try:
                    await self._listen()
                finally:
                    worker.cancel()
        except BaseException as exc:  # one client's failure never takes the service down
            found = [e for e in leaves(exc) if not _gone(e)]
            if any(isinstance(e, (KeyboardInterrupt, SystemExit)) for e in found):
                raise
            if found:
                if not isinstance(found[0], ServiceError):
                    log.warning("wds-async service: session %d failed", self.number, exc_info=found[0])
                await self._try_send_error(found[0])
        finally:
            self.close()

    def _check_hello(self, hello: dict[str, Any]) -> None:
        if hello.get("type") != "hello" or hello.get("version") != VERSION:
            raise ServiceError(f"this service speaks protocol version {VERSION}; the client sent "
                               f"{hello.get('type')!r} version {hello.get('version')!r} (upgrade both to the "
                               "same wds-async)", url=self.service.socket_path)
        if hello.get("socket") != self.service.socket_path:
            raise ServiceError(f"the client dialed {hello.get('socket')!r} but this service is "
                               f"{self.service.socket_path!r}", url=self.service.socket_path)
        self.pid = int(hello.get("pid") or 0)

    async def _try_send_error(self, exc: BaseException) -> None:
        try:
            await asyncio.wait_for(self._send({"type": "error", "error": error_to_json(exc)}), 1.0)
        except (TimeoutError, OSError, ServiceError):
            pass

    async def _listen(self) -> None:
        """Read the client's frames until it closes: acks free ring space, opens queue up."""
        while True:
            message = await self._recv()
            kind = message["type"]
            if kind == "ack":
                assert self.ring is not None
                self.ring.ack(int(message.get("bytes", 0)))
                self._acked.set()
            elif kind == "open":
                self._opens.put_nowait(message)
            elif kind == "close":
                return
            else:
                raise ServiceError(f"unexpected {kind!r} frame from a client", url=self.service.socket_path)

    async def _serve(self) -> None:
        while True:
            message = await self._opens.get()
            await self._run_items(message)
            await self._send({"type": "end"})

    async def _run_items(self, message: dict[str, Any]) -> None:
        items = [item_from_json(value) for value in message.get("items", ())]
        config = self.service.session_config(message.get("settings") or {})
        self.budget = budget = ByteBudget(config.max_buffered_bytes)
        channel = InBandChannel(budget, ordered=config.deterministic)
        engine = Engine(items, StreamSpec(config, channel.handler),
                        backends=self.service.backends_for(message.get("backend_options")), channel=channel,
                        stats=self.stats,
                        source=source_for(self.service.cache_for(message.get("cache")), config.retry, self.stats),
                        limiter=self.service.limiter, yield_tokens=True)
        async with TaskGroup() as group:
            task = group.create_task(engine.run())
            try:
                await self._pump(channel, config.handoff_max_samples, config.handoff_bytes)
            finally:
                if not task.done():
                    task.cancel()
                channel.abandon()

    async def _pump(self, channel: SampleChannel, max_items: int, max_bytes: int) -> None:
        """Move the channel's items into the ring and their offsets to the client, in order."""
        ring = self.ring
        assert ring is not None
        while True:
            started = time.perf_counter()
            try:
                items, done = await asyncio.wait_for(channel.get_many(max_items, max_bytes), ALIVE_SECONDS)
            except TimeoutError:
                await self._send({"type": "alive"})
                continue
            finally:
                self.stats.wait_seconds += time.perf_counter() - started
            entries: list[Any] = []
            span = 0
            for item in items:
                kind = type(item)
                if kind is Sample:
                    span = await self._put_sample(item, entries, span)
                    self.stats.samples_delivered += 1
                elif kind is ItemDone:
                    entries.append(["d", item.id])
                elif kind is InBand:
                    level = "sample" if type(item.error) is SampleError else "item"
                    entries.append(["e", error_to_json(item.error), level])
                else:  # an error the engine raised outside any item: it ends the data
                    entries.append(["e", error_to_json(item), "fatal"])
            if entries:
                await self._send({"type": "batch", "entries": entries, "span": span})
            if done:
                return

    async def _put_sample(self, sample: Sample, entries: list[Any], span: int) -> int:
        """Copy one sample's fields into the ring (waiting for acks, after sending what is pending, when it
        is full) and add its entry; return the batch's span so far."""
        ring = self.ring
        assert ring is not None
        names = [k for k in sample if k not in _META]
        blocks: list[bytes] = [sample[k] for k in names]
        total = sum(len(b) for b in blocks)
        if not ring.fits(total):  # alone, in a file of its own (see ring.py)
            if entries:
                await self._send({"type": "batch", "entries": list(entries), "span": span})
                entries.clear()
            fd, offsets = one_shot(blocks)
            try:
                fields = [[n, o, len(b)] for n, o, b in zip(names, offsets, blocks)]
                await self._send({"type": "batch", "entries": [_entry(sample, fields)], "span": 0}, [fd])
            finally:
                os.close(fd)
            return 0
        while True:
            self._acked.clear()  # before any await: an ack that arrives while we send below is not lost
            got = ring.allocate(total)
            if got is not None:
                break
            if entries:  # the client can only ack what it has been told about
                await self._send({"type": "batch", "entries": list(entries), "span": span})
                entries.clear()
                span = 0
            await self._acked.wait()
        at, consumed = got
        fields = []
        for name, block in zip(names, blocks):
            ring.write(at, block)
            fields.append([name, at, len(block)])
            at += len(block)
        entries.append(_entry(sample, fields))
        return span + consumed

    def close(self) -> None:
        """Release the ring and the socket (idempotent)."""
        if self.ring is not None:
            self.ring.close()
        try:
            self.sock.close()
        except OSError:
            pass


def _gone(exc: BaseException) -> bool:
    """The client left (closed, reset) or the service is stopping: nothing to report."""
    if isinstance(exc, ServiceError):
        return False
    return isinstance(exc, (_Gone, ConnectionError, asyncio.CancelledError))


def _entry(sample: Sample, fields: list[list[Any]]) -> list[Any]:
    return ["s", sample["__key__"], sample.url, sample.offset, sample.end, sample.item, fields]


async def _writable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """Wait until ``sock`` can take more bytes."""
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_writer(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_writer(sock.fileno())
