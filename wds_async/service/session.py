"""One client connection of the node service: its ring, its engines, its share of the node budget.

A session answers ``hello`` with ``ready`` (the ring's descriptor passed along), then runs one
:class:`~wds_async.engine.engine.Engine` per ``open`` over the client's work items, on the service's shared
limiter and backends, into a channel and byte budget of its own. Its *pump* (:mod:`~wds_async.service.pump`)
takes samples from that channel, copies their fields into the ring and sends their offsets; when the ring is full
it waits for the client's ``ack``, so a slow client fills only its own ring and budget, and its readers give their
tokens back while they wait (``Engine(yield_tokens=True)``): other sessions keep the node's connections.

Errors the engine hands to a handler are not decided here but by the client's handler, at the item's
position (:mod:`wds_async.service.inband`). An error the engine raises outside any item ends the data, as
it does in-process. A client that closes its socket or dies ends its session:
the engine is cancelled, the channel abandoned (its bytes freed) and the ring closed.

What a client can make a session hold is bounded (:mod:`wds_async.service.limits`): its first frame must
arrive within the handshake timeout, every frame within the frame timeout of its first byte and within
:data:`~wds_async.service.protocol.MAX_REQUEST_FRAME`; a large frame takes room in the node's request pool
before its body is read; at most one ``open`` waits behind the one being served. What an ``open`` carries is
checked before any of it reaches an engine (:mod:`wds_async.service.validate`); ``pipe:`` items run in the
client's working directory and environment.
"""

from __future__ import annotations

import array
import asyncio
import errno
import logging
import socket
from asyncio import TaskGroup
from typing import TYPE_CHECKING, Any, Protocol

from ..backends.pipe import PipeBackend
from ..cache.source import source_for
from ..config import EngineConfig
from ..engine.engine import Engine
from ..engine.failures import leaves
from ..engine.spec import StreamSpec
from ..engine.work import WorkItem
from ..errors import ServiceError
from ..io import BackendSet
from ..io.backend import Backend
from ..io.budget import ByteBudget
from ..io.registry import backend_key
from ..stats import Stats
from .inband import InBandChannel
from .limits import FRAME_TIMEOUT, SMALL_FRAME
from .protocol import MAX_REQUEST_FRAME, VERSION, FrameDecoder, encode, error_to_json, item_from_json
from .pump import Pump
from .ring import Ring
from .validate import check_backend_options, check_cache, check_items, pipe_context

if TYPE_CHECKING:
    from ..cache.disk import ShardCache
    from ..engine.limiter import Limiter
    from .limits import RequestPool

__all__ = ["ServiceState", "Session"]

log = logging.getLogger("wds_async")



class _Gone(Exception):
    """The client closed its end."""


class ServiceState(Protocol):
    """What a session uses of the service it belongs to (``server.Service``, which imports this module)."""

    socket_path: str
    ring_bytes: int
    handshake_timeout: float
    fd_limit: int
    pipes_allowed: bool
    sessions_served: int
    requests: RequestPool
    limiter: Limiter

    def status(self) -> dict[str, Any]: ...

    def session_config(self, settings: Any, session: Session | None = None) -> EngineConfig: ...

    async def backends_for(self, options: dict[str, Any] | None, config: EngineConfig) -> tuple[str, BackendSet]: ...

    def release_backends(self, key: str) -> None: ...

    def cache_for(self, spec: dict[str, Any] | None) -> ShardCache | None: ...


class _SessionBackends(BackendSet):
    """The service's shared backends, except ``pipe:``: one of this open's own, running its commands in the
    client's working directory and environment."""

    def __init__(self, shared: BackendSet, pipe: PipeBackend | None) -> None:
        super().__init__(shared._config)
        self._shared = shared
        self._pipe = pipe

    def for_url(self, url: str) -> Backend:
        if self._pipe is not None and backend_key(url) == "pipe":
            return self._pipe
        return self._shared.for_url(url)


class Session:
    """One connected client (see the module docstring)."""

    def __init__(self, service: ServiceState, sock: socket.socket, number: int, uid: int = -1) -> None:
        self.service = service
        self.sock = sock
        self.number = number
        self.uid = uid
        self.stats = Stats()
        self.ring: Ring | None = None
        self.budget: ByteBudget | None = None
        self.pid = 0
        self._decoder = FrameDecoder("a client", MAX_REQUEST_FRAME)
        self._frames: list[tuple[dict[str, Any], int]] = []  # with the request-pool bytes each holds
        self._held = 0  # request-pool bytes taken for the frame under assembly
        self._acked = asyncio.Event()
        # At most one open waits behind the one being served (a client sends the next after ``end``).
        self._opens: asyncio.Queue[tuple[dict[str, Any], int]] = asyncio.Queue(maxsize=1)
        self._send_lock = asyncio.Lock()

    @property
    def held_bytes(self) -> int:
        """What this session holds of the node byte budget: its ring and its engine budget's limit."""
        return (self.ring.size if self.ring is not None else 0) + (self.budget.limit if self.budget else 0)

    # -- socket I/O ------------------------------------------------------------------------------------
    async def _recv(self, within: float | None = None) -> tuple[dict[str, Any], int]:
        """The next frame and the request-pool bytes it holds (give them back with ``requests.give``).
        ``within``: seconds for the frame to arrive at all (the handshake); in any case a frame must
        complete within FRAME_TIMEOUT of its first byte."""
        loop = asyncio.get_running_loop()
        path = self.service.socket_path
        deadline = None if within is None else loop.time() + within
        started = loop.time()  # of the frame under assembly, once it has a byte
        while not self._frames:
            announced = self._decoder.announced
            if announced is not None and announced > SMALL_FRAME and announced > self._held:
                left = FRAME_TIMEOUT if deadline is None else max(0.0, deadline - loop.time())
                self._held += await self.service.requests.take(announced - self._held, left, path)
            if not self._decoder.pending:
                started = loop.time()
            limit = started + FRAME_TIMEOUT if self._decoder.pending else None
            if deadline is not None:
                limit = deadline if limit is None else min(limit, deadline)
            try:
                async with asyncio.timeout_at(limit):
                    data = await loop.sock_recv(self.sock, 1 << 16)
            except TimeoutError:
                if deadline is not None and not self._decoder.pending:
                    raise ServiceError(f"the wds-async service at {path} closed a connection that sent no request "
                                       f"for {within:.0f} s after connecting; a client sends 'hello' at once",
                                       url=path) from None
                raise ServiceError(f"the wds-async service at {path} closed a connection that took over "
                                   f"{FRAME_TIMEOUT if within is None else within:.0f} s to send one frame",
                                   url=path) from None
            if not data:
                raise _Gone()
            frames = self._decoder.feed(data)
            if frames:  # the frame the pool bytes were taken for is the first one completed
                held, self._held = self._held, 0
                self._frames.extend((frame, held if n == 0 else 0) for n, frame in enumerate(frames))
        return self._frames.pop(0)

    def _give_back(self) -> None:
        """Return every request-pool byte this session holds (it ends)."""
        requests = self.service.requests
        requests.give(self._held + sum(held for _, held in self._frames))
        self._held, self._frames = 0, []
        while not self._opens.empty():
            requests.give(self._opens.get_nowait()[1])

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
            hello, held = await self._recv(self.service.handshake_timeout)
            self.service.requests.give(held)
            if hello["type"] == "status":
                await self._send({"type": "status", **self.service.status()})
                return
            self._check_hello(hello)
            try:
                self.ring = Ring(self.service.ring_bytes)
            except OSError as exc:
                raise ServiceError(f"the wds-async service at {self.service.socket_path} cannot make this client's "
                                   f"shared-memory ring: {exc.strerror or exc}" + (
                                       f" (out of file descriptors, its limit is {self.service.fd_limit}; close "
                                       "other clients or raise its limit)" if exc.errno in (errno.EMFILE, errno.ENFILE)
                                       else ""), url=self.service.socket_path) from None
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
            self._give_back()
            self.close()

    def _check_hello(self, hello: dict[str, Any]) -> None:
        if hello.get("type") != "hello" or hello.get("version") != VERSION:
            raise ServiceError(f"this service speaks protocol version {VERSION}; the client sent "
                               f"{hello.get('type')!r} version {hello.get('version')!r} (upgrade both to the "
                               "same wds-async)", url=self.service.socket_path)
        if hello.get("socket") != self.service.socket_path:
            raise ServiceError(f"the client dialed {hello.get('socket')!r} but this service is "
                               f"{self.service.socket_path!r}", url=self.service.socket_path)
        pid = hello.get("pid")
        if type(pid) is not int or pid < 0:
            raise ServiceError(f"the client's hello names pid {pid!r}, not a process id", url=self.service.socket_path)
        self.pid = pid

    async def _try_send_error(self, exc: BaseException) -> None:
        if isinstance(exc, ServiceError) and exc.url is None:
            exc.url = self.service.socket_path  # the client's message names the socket it dialed
        try:
            await asyncio.wait_for(self._send({"type": "error", "error": error_to_json(exc)}), 1.0)
        except (TimeoutError, OSError, ServiceError):
            pass

    async def _listen(self) -> None:
        """Read the client's frames until it closes: acks free ring space, opens queue up."""
        path = self.service.socket_path
        while True:
            message, held = await self._recv()
            kind = message["type"]
            if kind == "open":
                if self._opens.full():
                    self.service.requests.give(held)
                    raise ServiceError(f"the client sent an 'open' while two were pending at {path}; a client "
                                       "sends the next one after the previous one's 'end'", url=path)
                self._opens.put_nowait((message, held))
                continue
            self.service.requests.give(held)
            if kind == "ack":
                nbytes = message.get("bytes", 0)
                if self.ring is None or type(nbytes) is not int:
                    raise ServiceError(f"bad 'ack' frame from a client of {path}: {{'bytes': {nbytes!r}}}", url=path)
                self.ring.ack(nbytes)
                self._acked.set()
            elif kind == "close":
                return
            else:
                raise ServiceError(f"unexpected {kind!r} frame from a client", url=path)

    async def _serve(self) -> None:
        while True:
            message, held = await self._opens.get()
            try:
                await self._run_items(message)
            finally:
                self.service.requests.give(held)
            await self._send({"type": "end"})

    async def _prepare(self, message: dict[str, Any]) -> tuple[list[WorkItem], EngineConfig, dict[str, Any] | None,
                                                               dict[str, Any] | None, PipeBackend | None]:
        """Check an ``open`` (:mod:`~wds_async.service.validate`): its items, the engine config they run
        with, their backend options and cache, and the pipe: backend for the client's context. ServiceError
        naming what is refused; nothing of a refused open reaches an engine."""
        service, path = self.service, self.service.socket_path
        values = message.get("items", ())
        if not isinstance(values, list):
            raise ServiceError(f"bad 'open' frame from a client of {path}: 'items' is not a list", url=path)
        items = [item_from_json(value) for value in values]
        config = service.session_config(message.get("settings"), self)
        options, chosen = check_backend_options(message.get("backend_options"), items, path)
        cache = check_cache(message.get("cache"), path)
        context = pipe_context(message.get("context"), path)
        check_items(items, context, service.pipes_allowed, path)
        pipe = None
        if context is not None:
            pipe = PipeBackend(chunk_bytes=config.chunk_bytes, kill_grace=chosen.get("kill_grace", 1.0),
                               allow_pipe=service.pipes_allowed and chosen.get("allow_pipe", True) is not False,
                               cwd=context.cwd, env=context.env)
        return items, config, options, cache, pipe

    async def _run_items(self, message: dict[str, Any]) -> None:
        items, config, options, cache, pipe = await self._prepare(message)
        key, shared = await self.service.backends_for(options, config)
        try:
            self.budget = budget = ByteBudget(config.max_buffered_bytes)
            channel = InBandChannel(budget, ordered=config.deterministic)
            engine = Engine(items, StreamSpec(config, channel.handler),
                            backends=_SessionBackends(shared, pipe), channel=channel,
                            stats=self.stats,
                            source=source_for(self.service.cache_for(cache), config.retry, self.stats),
                            limiter=self.service.limiter, yield_tokens=True)
            async with TaskGroup() as group:
                task = group.create_task(engine.run())
                try:
                    assert self.ring is not None
                    await Pump(self.ring, self._send, self._acked, self.stats).run(
                        channel, config.handoff_max_samples, config.handoff_bytes)
                finally:
                    if not task.done():
                        task.cancel()
                    channel.abandon()
        finally:
            self.service.release_backends(key)

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
