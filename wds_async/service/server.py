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
  processes its client says share the node (as :func:`~wds_async.node.share_config` divides it in-process).

Lifetime: a second service on a live socket refuses to start (a lock file beside the socket, then a connect
test); a socket file nobody answers on is replaced. SIGTERM and SIGINT stop it cleanly: sessions are
cancelled, backends closed, the socket and lock file removed.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import signal
import socket
from asyncio import TaskGroup
from collections.abc import Callable
from typing import Any

from .._loop import new_event_loop
from ..cache.disk import ShardCache, make_cache
from ..config import EngineConfig, RetryPolicy
from ..engine.autotune import Autotuner
from ..engine.limiter import Limiter
from ..errors import ServiceError
from ..io import BackendSet
from ..io.budget import ByteBudget
from ..node import NODE_BUFFERED_BYTES, NODE_CONNECTIONS, share_config
from ..stats import Stats
from .paths import check_length, peer_uid, prepare_directory
from .session import Session

__all__ = ["DEFAULT_RING_BYTES", "Service", "serve"]

log = logging.getLogger("wds_async")

#: Each client's ring (shared memory, part of its share of the node budget). 16 MiB measured better than 64 MiB
#: with 4 ranks x 2 workers (248 against 201-226 MB/s, 137 MB less at the peak): the pages it cycles through stay
#: in the CPU caches' reach and fewer are touched. Samples over half of it travel in a memfd of their own.
DEFAULT_RING_BYTES = 16 << 20
#: Settings a client may choose for its own items; everything else is the service's.
CLIENT_SETTINGS = ("max_sample_bytes", "deterministic", "part_bytes", "read_timeout", "connect_timeout",
                   "chunk_bytes", "handoff_max_samples", "handoff_max_bytes")
_TICK = 0.02


class Service:
    """The state a node service shares between its sessions (see the module docstring)."""

    def __init__(self, socket_path: str, *, config: EngineConfig | None = None, max_connections: int | str = "auto",
                 backend_options: dict[str, Any] | None = None, cache_dir: str | None = None,
                 cache_size: int | str | None = None, node_connections: int | None = None,
                 node_buffered_bytes: int | None = None, ring_bytes: int = DEFAULT_RING_BYTES) -> None:
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
        self.ring_bytes = ring_bytes
        self.backend_options = backend_options
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
        self._caches: dict[str, ShardCache | None] = {}
        self._count = 0
        self._stop: asyncio.Event | None = None

    # -- what sessions share ---------------------------------------------------------------------------
    def session_config(self, settings: dict[str, Any]) -> EngineConfig:
        """The engine settings of one client's items: the service's, with the client's own choices and
        its share of the node byte budget, less its ring (at least 8 MiB remain)."""
        changes: dict[str, Any] = {k: settings[k] for k in CLIENT_SETTINGS if k in settings}
        if isinstance(settings.get("retry"), dict):
            changes["retry"] = RetryPolicy(**settings["retry"])
        explicit = frozenset(k for k in ("max_buffered_bytes",) if k in settings)
        if explicit:
            changes["max_buffered_bytes"] = int(settings["max_buffered_bytes"])
        cap = self.node_connections
        if isinstance(settings.get("max_connections"), int):  # the client's own ceiling on its readers
            cap = max(1, min(cap, settings["max_connections"]))
        config = self.config.replace(**changes, connection_cap=cap, min_connections=min(2, cap))
        processes = max(1, int(settings.get("processes") or 1))
        shared, _ = share_config(config, node_connections=self.node_connections,
                                 node_buffered_bytes=self.node_buffered_bytes, processes=processes,
                                 explicit=explicit)
        # The client's ring is part of its share: engine budget + ring = what one per-process engine may hold.
        return config.replace(max_buffered_bytes=max(8 << 20, shared.max_buffered_bytes - self.ring_bytes))

    def backends_for(self, options: dict[str, Any] | None) -> BackendSet:
        """The backend set (one connection pool per scheme) for these options, shared by every session."""
        options = options if options is not None else self.backend_options
        key = json.dumps(options, sort_keys=True)
        found = self._backends.get(key)
        if found is None:
            found = self._backends[key] = BackendSet(self.config, None, options)
        return found

    def cache_for(self, spec: dict[str, Any] | None) -> ShardCache | None:
        """The client's shard cache (``{"dir", "max_bytes", "validate"}``), else the service's own."""
        if not spec:
            return self.default_cache
        key = json.dumps(spec, sort_keys=True)
        if key not in self._caches:
            self._caches[key] = ShardCache(spec["dir"], spec.get("max_bytes"), validate=bool(spec.get("validate", True)))
        return self._caches[key]

    def status(self) -> dict[str, Any]:
        """What a ``status`` request answers: the client sessions and the service-wide counters."""
        clients = [s for s in self.sessions if s.ring is not None]
        return {"pid": os.getpid(), "socket": self.socket_path, "sessions": len(clients),
                "sessions_served": self.sessions_served,
                "clients": sorted(s.pid for s in clients), "connections": self.limiter.total,
                "in_flight": self.limiter.borrowed, "stats": self.stats.snapshot()}

    async def _aggregate(self) -> None:
        """Sum the sessions' counters into the service-wide ones the autotuner reads, every tick."""
        names = ("bytes_read", "throttled", "requests", "retries", "samples_read", "samples_delivered",
                 "shards_done", "shards_skipped", "cache_hits", "cache_fills")
        while True:
            live = list(self.sessions)
            stats = self.stats
            for name in names:
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
        for name in ("bytes_read", "throttled", "requests", "retries", "samples_read", "samples_delivered",
                     "shards_done", "shards_skipped", "cache_hits", "cache_fills", "wait_seconds"):
            setattr(self._retired, name, getattr(self._retired, name) + getattr(session.stats, name))

    # -- listening ---------------------------------------------------------------------------------------
    def _bind(self) -> tuple[socket.socket, int]:
        """The listening socket (mode 0600) and the held lock file; ServiceError if a service is alive."""
        path = self.socket_path
        prepare_directory(path)
        lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            raise ServiceError("a wds-async service is already running on this socket; stop it first or choose "
                               "another --socket (each job needs its own)", url=path) from None
        try:
            if os.path.exists(path):
                if _answers(path):
                    raise ServiceError("a wds-async service already answers on this socket; stop it first or "
                                       "choose another --socket", url=path)
                os.unlink(path)  # stale: its service died without removing it
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old = os.umask(0o177)  # the socket is born 0600: no moment where others may connect
            try:
                listener.bind(path)
            finally:
                os.umask(old)
            os.chmod(path, 0o600)
            listener.listen(128)
            listener.setblocking(False)
        except BaseException:
            os.close(lock)
            raise
        return listener, lock

    async def run(self, on_ready: Callable[[], None] | None = None) -> None:
        """Serve until :meth:`stop` (or SIGTERM/SIGINT when installed by :func:`serve`)."""
        self._stop = asyncio.Event()
        listener, lock = self._bind()
        log.info("wds-async service listening on %s (pid %d)", self.socket_path, os.getpid())
        try:
            async with TaskGroup() as group:
                helpers = [group.create_task(self._aggregate())]
                if self.max_connections == "auto":
                    tuner = Autotuner(self.limiter, self.stats, self.budget, minimum=1, cap=self.node_connections,
                                      has_work=lambda: bool(self.sessions))
                    helpers.append(group.create_task(tuner.run()))
                helpers.append(group.create_task(self._accept(listener, group)))
                if on_ready is not None:
                    on_ready()
                await self._stop.wait()
                for task in helpers:
                    task.cancel()
                for task in list(self._tasks.values()):
                    task.cancel()
        finally:
            listener.close()
            for path in (self.socket_path, self.socket_path + ".lock"):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            os.close(lock)
            for backends in self._backends.values():
                await backends.aclose()
            log.info("wds-async service on %s stopped", self.socket_path)

    def stop(self) -> None:
        """Ask :meth:`run` to end (from the loop's thread)."""
        if self._stop is not None:
            self._stop.set()

    async def _accept(self, listener: socket.socket, group: Any) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(listener)
            conn.setblocking(False)
            if peer_uid(conn) != os.getuid():
                log.warning("wds-async service: refused a connection from another user")
                conn.close()
                continue
            self._count += 1
            session = Session(self, conn, self._count)
            self.sessions.add(session)
            self._tasks[session] = group.create_task(self._session(session))

    async def _session(self, session: Session) -> None:
        try:
            await session.run()
        finally:
            self._retire(session)


def _answers(path: str) -> bool:
    """True when something accepts connections on the Unix socket at ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def serve(socket_path: str | None = None, *, on_ready: Callable[[], None] | None = None,
          metrics_port: int | None = None, **options: Any) -> None:
    """Run a node service on ``socket_path`` (default: :func:`~wds_async.service.paths.default_socket_path`)
    until SIGTERM or SIGINT. ``options``: :class:`Service`'s keywords (``config``, ``max_connections``,
    ``backend_options``, ``cache_dir``, ``cache_size``, ``node_connections``, ``node_buffered_bytes``,
    ``ring_bytes``). ``metrics_port``: also serve the service-wide counters in Prometheus' format on
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
