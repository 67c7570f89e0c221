"""The node service: one engine's worth of connections per node, serving every local loader process.

:func:`serve` listens on a Unix socket (see :mod:`wds_async.service.paths` for the namespace and the
permissions) and runs one :class:`~wds_async.service.session.Session` per client connection. What the node
shares lives here, once:

* one :class:`~wds_async.engine.limiter.Limiter`: every session's engine takes its tokens, so the node has at most
  its total requests in flight; with ``max_connections="auto"`` one
  :class:`~wds_async.engine.autotune.Autotuner` sets that total from the service-wide counters (bytes read,
  throttling, time to first byte, summed over the sessions every tick, and the sessions' byte budgets
  taken together), between 1 and ``node_connections``;
* one :class:`~wds_async.io.BackendSet` per distinct ``backend_options`` the clients send (in
  practice one, so one connection pool), and one shard cache per cache directory;
* the node byte budget: a session's budget is its share, ``node_buffered_bytes`` divided by the loader
  processes its client says share the node (as :func:`~wds_async.node.share_config` divides it in-process),
  less its ring, and never more than the other sessions' rings and budgets leave of the node budget (a
  client that claims to be alone on the node gets what is left, not a second node's worth). A floor of
  8 MiB keeps every session making progress; the request pool (:mod:`wds_async.service.limits`) is taken
  out of the node budget first;
* the bounds on what a client can make the service hold (connections per user, handshake and frame
  timeouts, request bytes; :mod:`wds_async.service.limits`), and the checks of what a client sends
  (:mod:`wds_async.service.validate`).

A failure to accept (out of descriptors, ``EMFILE``) never ends the service: the connection is accepted on a
spare descriptor, told why in an ``error`` frame, closed, and the refusal logged.

Lifetime: a second service on a live socket refuses to start (a lock file beside the socket, then a connect
test; :mod:`wds_async.service.listen`); a socket file nobody answers on is replaced. SIGTERM and SIGINT stop it
cleanly: sessions are cancelled, backends closed, the socket and lock file removed.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import signal
import socket
from asyncio import TaskGroup
from collections.abc import Callable
from typing import Any

from .._loop import new_event_loop
from ..backends.pipe import pipes_allowed
from ..cache.disk import ShardCache, make_cache
from ..config import EngineConfig
from ..engine.autotune import Autotuner
from ..engine.limiter import Limiter
from ..errors import ServiceError
from ..io import BackendSet
from ..io.budget import ByteBudget
from ..node import MIN_BUFFERED_BYTES, NODE_BUFFERED_BYTES, NODE_CONNECTIONS, share_config
from ..stats import Stats
from .limits import (
    HANDSHAKE_TIMEOUT,
    MAX_BACKEND_SETS,
    REQUEST_POOL_BYTES,
    RefusalLog,
    RequestPool,
    SpareDescriptor,
    connection_cap,
    raise_fd_limit,
)
from .listen import bind, refuse, unbind
from .paths import check_length, peer_uid
from .protocol import MAX_REQUEST_FRAME
from .session import Session
from .validate import BACKEND_SETTINGS, check_settings

__all__ = ["DEFAULT_RING_BYTES", "Service", "serve"]

log = logging.getLogger("wds_async")

#: Each client's ring (shared memory, part of its share of the node budget). 16 MiB measured better than 64 MiB
#: with 4 ranks x 2 workers (248 against 201-226 MB/s, 137 MB less at the peak): the pages it cycles through stay
#: in the CPU caches' reach and fewer are touched. Samples over half of it travel in a memfd of their own.
DEFAULT_RING_BYTES = 16 << 20
_TICK = 0.02
#: Seconds the accept loop pauses after a failure it could not even answer (no spare descriptor, ENOBUFS):
#: the pending connection keeps the listening socket readable, and retrying at once would spin a core.
ACCEPT_BACKOFF = 0.1
#: Accept errors that concern only the connection being accepted (it went away first): try the next one.
_GONE_BEFORE_ACCEPT = (errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.EINTR)
#: The sessions' counters the service sums into its own (its autotuner reads them; a session's are kept when it ends).
_SUMMED = ("bytes_read", "throttled", "requests", "retries", "samples_read", "samples_delivered", "shards_done",
           "shards_skipped", "cache_hits", "cache_fills", "cache_bypasses")


class Service:
    """The state a node service shares between its sessions (see the module docstring)."""

    def __init__(self, socket_path: str, *, config: EngineConfig | None = None, max_connections: int | str = "auto",
                 backend_options: dict[str, Any] | None = None, cache_dir: str | None = None,
                 cache_size: int | str | None = None, node_connections: int | None = None,
                 node_buffered_bytes: int | None = None, ring_bytes: int = DEFAULT_RING_BYTES,
                 allow_pipe: bool | None = None, max_clients: int | None = None,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT) -> None:
        self.socket_path = os.path.abspath(socket_path)
        check_length(self.socket_path)
        self.node_connections = node_connections or NODE_CONNECTIONS
        self.node_buffered_bytes = node_buffered_bytes or NODE_BUFFERED_BYTES
        if max_connections != "auto" and (not isinstance(max_connections, int) or max_connections < 1):
            raise ValueError(f"max_connections must be 'auto' or a positive int, got {max_connections!r}")
        self.max_connections = max_connections
        self.config = (config or EngineConfig()).replace(
            max_connections="auto", connection_cap=self.node_connections,
            min_connections=min(2, self.node_connections))
        if not isinstance(ring_bytes, int) or isinstance(ring_bytes, bool) or ring_bytes < 4096:
            raise ValueError(f"ring_bytes must be an int of at least 4096, got {ring_bytes!r}")
        self.ring_bytes = ring_bytes
        self.backend_options = backend_options
        #: The operator's switch: False refuses every pipe: item, whatever a client's allow_pipe says.
        self.pipes_allowed = pipes_allowed(allow_pipe)
        if max_clients is not None and (not isinstance(max_clients, int) or max_clients < 1):
            raise ValueError(f"max_clients must be a positive int, got {max_clients!r}")
        self.max_clients = max_clients  # connections per user; None: from the descriptor limit, at run()
        if not handshake_timeout > 0:
            raise ValueError(f"handshake_timeout must be > 0 seconds, got {handshake_timeout!r}")
        self.handshake_timeout = handshake_timeout
        #: Client frames held, all connections together; taken out of the node budget before it is shared.
        self.requests = RequestPool(max(MAX_REQUEST_FRAME, min(REQUEST_POOL_BYTES, self.node_buffered_bytes // 8)))
        self.default_cache = make_cache(cache_dir, cache_size) if cache_dir else None
        fixed = max_connections if isinstance(max_connections, int) else self.config.first_connections
        self.limiter = Limiter(fixed)
        self.stats = Stats()          # service-wide: what the autotuner reads
        self.budget = ByteBudget(self.node_buffered_bytes)  # its ``used``: every session's, summed
        self.sessions: set[Session] = set()
        self.sessions_served = 0  # client sessions that opened a ring (not probes and status requests)
        self._tasks: dict[Session, asyncio.Task[None]] = {}
        self._retired = Stats()
        self._backends: dict[str, BackendSet] = {}
        self._backend_users: dict[str, int] = {}  # sessions running an open on each set
        self._caches: dict[str, ShardCache] = {}
        self._count = 0
        self._stop: asyncio.Event | None = None
        self._connections: dict[int, int] = {}  # open connections per uid
        self._refusals = RefusalLog()
        self.refused = 0  # connections refused (over the cap, out of descriptors, another user)
        self.fd_limit = 0

    # -- what sessions share ---------------------------------------------------------------------------
    def session_config(self, settings: Any, session: Session | None = None) -> EngineConfig:
        """The engine settings of one client's items: the service's, with the client's own choices (checked:
        ServiceError naming a refused one) and its share of the node byte budget, less its ring; never more
        than the other sessions leave of the node budget, never less than 8 MiB."""
        checked = check_settings(settings, self.config, self.socket_path)
        cap = self.node_connections
        if checked.max_connections is not None:  # the client's own ceiling on its readers
            cap = max(1, min(cap, checked.max_connections))
        config = self.config.replace(**checked.changes, connection_cap=cap, min_connections=min(2, cap))
        node_bytes = max(1, self.node_buffered_bytes - self.requests.budget.limit)
        shared, _ = share_config(config, node_connections=self.node_connections, node_buffered_bytes=node_bytes,
                                 processes=checked.processes, explicit=checked.explicit)
        # The client's ring is part of its share: engine budget + ring = what one per-process engine may hold.
        want = shared.max_buffered_bytes - self.ring_bytes
        left = node_bytes - self.ring_bytes - sum(s.held_bytes for s in self.sessions if s is not session)
        return config.replace(max_buffered_bytes=max(MIN_BUFFERED_BYTES, min(want, left)))

    async def backends_for(self, options: dict[str, Any] | None, config: EngineConfig) -> tuple[str, BackendSet]:
        """``(key, backends)``: the backend set (one connection pool per scheme) for these options and this
        config's backend settings, shared by every session that asks for the same; give it back with
        :meth:`release_backends`. At most :data:`~wds_async.service.limits.MAX_BACKEND_SETS` sets: an unused
        one is closed to make room, and ServiceError when all are in use."""
        options = options if options is not None else self.backend_options
        key = json.dumps([options, [getattr(config, name) for name in BACKEND_SETTINGS]], sort_keys=True)
        found = self._backends.get(key)
        if found is None:
            if len(self._backends) >= MAX_BACKEND_SETS:
                idle = next((k for k in self._backends if not self._backend_users.get(k)), None)
                if idle is None:
                    raise ServiceError(f"the wds-async service at {self.socket_path} serves {MAX_BACKEND_SETS} "
                                       "different backend settings (backend_options, timeouts, chunk_bytes) at "
                                       "once, its limit; give its clients the same settings, or run a service "
                                       "per job", url=self.socket_path)
                old = self._backends.pop(idle)
                self._backend_users.pop(idle, None)
                await old.aclose()
            found = self._backends[key] = BackendSet(self.config.replace(
                **{name: getattr(config, name) for name in BACKEND_SETTINGS}), None, options, engine_capped=True)
        self._backend_users[key] = self._backend_users.get(key, 0) + 1
        return key, found

    def release_backends(self, key: str) -> None:
        self._backend_users[key] = max(0, self._backend_users.get(key, 0) - 1)

    def cache_for(self, spec: dict[str, Any] | None) -> ShardCache | None:
        """The client's shard cache (``{"dir", "max_bytes", "validate"}``, checked), else the service's own.
        The most recent :data:`~wds_async.service.limits.MAX_BACKEND_SETS` are kept (a cache object holds
        only its settings: one dropped is made again when asked for)."""
        if not spec:
            return self.default_cache
        key = json.dumps(spec, sort_keys=True)
        found = self._caches.pop(key, None)
        if found is None:
            found = ShardCache(spec["dir"], spec.get("max_bytes"), validate=bool(spec.get("validate", True)))
            while len(self._caches) >= MAX_BACKEND_SETS:
                self._caches.pop(next(iter(self._caches)))
        self._caches[key] = found  # the most recently used last
        return found

    def status(self) -> dict[str, Any]:
        """What a ``status`` request answers: the client sessions and the service-wide counters."""
        clients = [s for s in self.sessions if s.ring is not None]
        return {"pid": os.getpid(), "socket": self.socket_path, "sessions": len(clients),
                "sessions_served": self.sessions_served,
                "clients": sorted(s.pid for s in clients), "connections": self.limiter.total,
                "in_flight": self.limiter.borrowed, "stats": self.stats.snapshot(),
                "open_connections": sum(self._connections.values()), "max_clients": self.max_clients,
                "refused": self.refused, "request_bytes": self.requests.used,
                "backends": [dict(zip(BACKEND_SETTINGS, json.loads(key)[1])) for key in self._backends],
                "held_bytes": sum(s.held_bytes for s in self.sessions) + self.requests.used}

    async def _aggregate(self) -> None:
        """Sum the sessions' counters into the service-wide ones the autotuner reads, every tick."""
        while True:
            live = list(self.sessions)
            stats = self.stats
            for name in _SUMMED:
                setattr(stats, name, getattr(self._retired, name) + sum(getattr(s.stats, name) for s in live))
            stats.wait_seconds = self._retired.wait_seconds + sum(s.stats.wait_seconds for s in live)
            stats.open_streams = sum(s.stats.open_streams for s in live)
            ttfbs = [s.stats.ttfb_s for s in live if s.stats.ttfb_s is not None]
            if ttfbs:
                stats.ttfb_s = sum(ttfbs) / len(ttfbs)
            self.budget.used = sum(s.budget.used for s in live if s.budget is not None)
            self.budget.limit = max(1, sum(s.budget.limit for s in live if s.budget is not None))
            await asyncio.sleep(_TICK)

    def _retire(self, session: Session) -> None:
        self.sessions.discard(session)
        self._tasks.pop(session, None)
        for name in (*_SUMMED, "wait_seconds"):
            setattr(self._retired, name, getattr(self._retired, name) + getattr(session.stats, name))

    async def run(self, on_ready: Callable[[], None] | None = None) -> None:
        """Serve until :meth:`stop` (or SIGTERM/SIGINT when installed by :func:`serve`)."""
        self._stop = asyncio.Event()
        self.fd_limit = raise_fd_limit()
        if self.max_clients is None:
            self.max_clients = connection_cap(self.fd_limit, self.node_connections)
        listener, lock = bind(self.socket_path)
        spare = SpareDescriptor()
        log.info("wds-async service listening on %s (pid %d; at most %d connections per user, %d descriptors)",
                 self.socket_path, os.getpid(), self.max_clients, self.fd_limit)
        try:
            async with TaskGroup() as group:
                helpers = [group.create_task(self._aggregate())]
                if self.max_connections == "auto":
                    tuner = Autotuner(self.limiter, self.stats, self.budget, minimum=1, cap=self.node_connections,
                                      has_work=lambda: bool(self.sessions))
                    helpers.append(group.create_task(tuner.run()))
                helpers.append(group.create_task(self._accept(listener, group, spare)))
                if on_ready is not None:
                    on_ready()
                await self._stop.wait()
                for task in helpers:
                    task.cancel()
                for task in list(self._tasks.values()):
                    task.cancel()
        finally:
            unbind(self.socket_path, listener, lock)
            spare.close()
            for backends in self._backends.values():
                await backends.aclose()
            log.info("wds-async service on %s stopped", self.socket_path)

    def stop(self) -> None:
        """Ask :meth:`run` to end (from the loop's thread)."""
        if self._stop is not None:
            self._stop.set()

    async def _accept(self, listener: socket.socket, group: Any, spare: SpareDescriptor) -> None:
        """Accept connections until cancelled; no accept failure ends the service (see the module docstring)."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:
                if exc.errno in _GONE_BEFORE_ACCEPT:
                    continue
                if not (exc.errno in (errno.EMFILE, errno.ENFILE) and self._refuse_on_spare(listener, spare, exc)):
                    self._refused("accept", f"accept() failed on {self.socket_path}: {exc}")
                    await asyncio.sleep(ACCEPT_BACKOFF)
                continue
            try:
                conn.setblocking(False)
                uid = peer_uid(conn)
            except OSError:
                conn.close()
                continue
            if uid != os.getuid():
                self._refuse(conn, "user", f"refused a connection from uid {uid}: this service serves its own user "
                             f"(uid {os.getuid()}) only; start a service of your own (`wds-async serve`)")
                continue
            if self._connections.get(uid, 0) >= (self.max_clients or 1):
                self._refuse(conn, "cap", f"{self._connections[uid]} connections of uid {uid} are open, the most "
                             f"this service takes per user ({self.max_clients}); close idle clients or dataset "
                             "iterators, or start the service with a larger --max-clients")
                continue
            self._connections[uid] = self._connections.get(uid, 0) + 1
            self._count += 1
            session = Session(self, conn, self._count, uid)
            self.sessions.add(session)
            self._tasks[session] = group.create_task(self._session(session))

    def _refuse_on_spare(self, listener: socket.socket, spare: SpareDescriptor, exc: OSError) -> bool:
        """Out of descriptors: free the spare one, accept the waiting connection on it, tell it why, close it.
        False when even that failed (the caller backs off)."""
        if not spare.release():
            spare.restore()
            return False
        try:
            conn, _ = listener.accept()
        except OSError:
            spare.restore()
            return False
        self._refuse(conn, "descriptors", f"the service is out of file descriptors ({exc.strerror}; its limit is "
                     f"{self.fd_limit}); close other clients, or raise its limit (ulimit -n) and restart it")
        spare.restore()
        return True

    def _refused(self, reason: str, message: str) -> None:
        self.refused += 1
        self._refusals.refused(reason, message)

    def _refuse(self, conn: socket.socket, reason: str, message: str) -> None:
        """Tell a connection it is refused and close it (:func:`~wds_async.service.listen.refuse`); count and log it."""
        self._refused(reason, message)
        refuse(conn, self.socket_path, message)

    async def _session(self, session: Session) -> None:
        try:
            await session.run()
        finally:
            self._retire(session)
            left = self._connections.get(session.uid, 1) - 1
            if left > 0:
                self._connections[session.uid] = left
            else:
                self._connections.pop(session.uid, None)


def serve(socket_path: str | None = None, *, on_ready: Callable[[], None] | None = None,
          metrics_port: int | None = None, **options: Any) -> None:
    """Run a node service on ``socket_path`` (default: :func:`~wds_async.service.paths.default_socket_path`)
    until SIGTERM or SIGINT. ``options``: :class:`Service`'s keywords (``config``, ``max_connections``,
    ``backend_options``, ``cache_dir``, ``cache_size``, ``node_connections``, ``node_buffered_bytes``,
    ``ring_bytes``, ``allow_pipe`` (False: refuse every ``pipe:`` item; None: unless ``WDS_ASYNC_NO_PIPE``),
    ``max_clients`` (connections per user), ``handshake_timeout``). ``metrics_port``: also serve the service-wide counters in Prometheus' format on
    127.0.0.1:PORT (:func:`wds_async.metrics.serve_metrics`, ``dataset="service"``)."""
    from .paths import default_socket_path

    service = Service(socket_path or default_socket_path(), **options)
    metrics = None
    if metrics_port is not None:
        from ..metrics import serve_metrics
        from ..stats import watch

        watch(service.stats, "service")
        metrics = serve_metrics(metrics_port)
    loop = new_event_loop()
    try:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, service.stop)
        loop.run_until_complete(service.run(on_ready))
    finally:
        if metrics is not None:
            metrics.close()
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
