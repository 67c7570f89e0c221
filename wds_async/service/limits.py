"""What one client can make the node service hold, and for how long: the bounds and the helpers that keep them.

Every resource a connection takes in the service is bounded per connection and counted for the node:

* **connections**: at most :data:`MAX_CONNECTIONS_PER_USER` per uid (only the service's own user passes the
  ``SO_PEERCRED`` check, so in practice per service), and never more than the descriptor limit leaves room
  for (:func:`connection_cap`). One over the cap is accepted, told why in an ``error`` frame, and closed;
  so is one that arrives when the process is out of descriptors (:class:`SpareDescriptor`).
* **time**: a new connection must complete its first frame (``hello`` or ``status``) within
  :data:`HANDSHAKE_TIMEOUT`, and any frame must complete within :data:`FRAME_TIMEOUT` of its first byte.
  An established session may then stay idle as long as it likes: it is a loader process between epochs,
  and it counts against the connection cap.
* **request bytes**: a connection holds at most one frame under assembly, of at most
  :data:`~wds_async.service.protocol.MAX_REQUEST_FRAME` bytes, and at most two ``open`` frames (one running,
  one queued). Frames larger than :data:`SMALL_FRAME` and the ``open`` frames they carry take their size from
  the node's :class:`RequestPool` before their body is read, and give it back when the frame is done with
  (an ``open``: once its items are served). The pool is part of the node byte budget.
* **engine bytes and rings**: see ``Service.session_config``: a session's engine budget is its share of what
  the node budget has left, never below a floor that keeps it making progress.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import time

from ..errors import ServiceError
from ..io.budget import ByteBudget

__all__ = ["FD_RESERVE", "FRAME_TIMEOUT", "HANDSHAKE_TIMEOUT", "MAX_BACKEND_SETS", "MAX_CONNECTIONS_PER_USER",
           "REQUEST_POOL_BYTES", "SMALL_FRAME", "RefusalLog", "RequestPool", "SpareDescriptor", "connection_cap",
           "raise_fd_limit"]

log = logging.getLogger("wds_async")

#: Connections one uid may hold open at once, handshaking or established. A node runs tens to a couple of
#: hundred loader processes (8 ranks x 16 DataLoader workers = 128 sessions) plus short ``status`` probes;
#: 1024 admits the 800 idle connections the hardening probe held, with room left for those, while each
#: connection costs the service at most two descriptors (its socket and, once established, its ring).
MAX_CONNECTIONS_PER_USER = 1024
#: Seconds a new connection has to deliver its first frame. A client sends ``hello`` right after connecting,
#: so this only needs to outlast a loaded node's scheduling delays; a connection that sends nothing stops
#: holding a descriptor and a slot of the cap after it.
HANDSHAKE_TIMEOUT = 10.0
#: Seconds a frame may take to arrive from its first byte (a client writes each frame in one ``sendall`` of
#: at most 4 MiB over a local socket: milliseconds). A connection that dribbles a frame is dropped after it.
FRAME_TIMEOUT = 60.0
#: Bytes of client frames the service holds at once, all connections together: frames under assembly
#: larger than :data:`SMALL_FRAME` and ``open`` frames not yet served. 64 MiB holds 256 sessions' opens of
#: the 256 KiB a client packs (more than a node's loader processes), and takes 3% of the default 2 GiB node
#: budget; the sessions share the rest. A frame that finds no room waits up to :data:`FRAME_TIMEOUT`, then
#: its client is told the service is busy.
REQUEST_POOL_BYTES = 64 << 20
#: Frames up to this size are read without taking room in the pool: one socket read holds them anyway.
SMALL_FRAME = 64 << 10
#: Descriptors kept out of the connection cap for the service's own work: engine connections (up to
#: ``node_connections``) come on top; this covers files of the cache and of ``file:`` shards, ``pipe:``
#: commands' pipes, logging, and the spare one kept for refusals.
FD_RESERVE = 128
#: Distinct engine-and-backend settings (``backend_options``, timeouts, chunk size) the service keeps a
#: connection pool for at once; each is one set of pools. Clients of one job share one; 16 leaves room for
#: a few jobs' variations while a client cycling through settings cannot make the service open pools
#: without end (an unused set is closed to make room; a 17th set in use is refused).
MAX_BACKEND_SETS = 16
#: Seconds between two log lines about refused connections (the count of those in between is reported).
REFUSAL_LOG_SECONDS = 10.0
#: The soft descriptor limit is raised towards the hard one, but not past this.
FD_LIMIT_CEILING = 1 << 20


def raise_fd_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit (at most :data:`FD_LIMIT_CEILING`);
    return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = FD_LIMIT_CEILING if hard == resource.RLIM_INFINITY else min(hard, FD_LIMIT_CEILING)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return FD_LIMIT_CEILING if soft == resource.RLIM_INFINITY else int(soft)


def connection_cap(fd_limit: int, node_connections: int) -> int:
    """Connections per user the service admits with ``fd_limit`` descriptors: :data:`MAX_CONNECTIONS_PER_USER`,
    or fewer when two descriptors per connection would not fit beside the engine's own."""
    return max(1, min(MAX_CONNECTIONS_PER_USER, (fd_limit - FD_RESERVE - node_connections) // 2))


class RequestPool:
    """The node's bytes of client frames (see :data:`REQUEST_POOL_BYTES`): taken before a large frame's body
    is read, given back when it is done with."""

    def __init__(self, limit: int) -> None:
        self.budget = ByteBudget(limit)

    @property
    def used(self) -> int:
        return self.budget.used

    async def take(self, nbytes: int, patience: float, socket_path: str) -> int:
        """Wait until ``nbytes`` fit and take them (ServiceError after ``patience`` seconds); return ``nbytes``."""
        budget = self.budget
        if nbytes > budget.limit:
            raise ServiceError(f"a frame of {nbytes} bytes is larger than the service's request pool "
                               f"({budget.limit} bytes); send smaller frames", url=socket_path)
        try:
            async with asyncio.timeout(patience):
                while budget.used + nbytes > budget.limit:
                    await budget.changed()
        except TimeoutError:
            raise ServiceError(f"the wds-async service at {socket_path} is busy: its request pool of "
                               f"{budget.limit} bytes stayed full for {patience:.0f} s (other clients' work "
                               "lists); retry later, or run fewer clients per service", url=socket_path) from None
        budget.add(nbytes)
        return nbytes

    def give(self, nbytes: int) -> None:
        if nbytes:
            self.budget.add(-nbytes)


class SpareDescriptor:
    """One descriptor held in reserve, so that a connection arriving when the process has none left can
    still be accepted, told why it is refused, and closed (instead of the accept failing over and over)."""

    def __init__(self) -> None:
        self.fd = self._open()

    @staticmethod
    def _open() -> int:
        try:
            return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return -1

    def release(self) -> bool:
        """Free the spare descriptor for one use; False when there was none."""
        if self.fd < 0:
            return False
        os.close(self.fd)
        self.fd = -1
        return True

    def restore(self) -> None:
        if self.fd < 0:
            self.fd = self._open()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class RefusalLog:
    """Warnings about refused connections, at most one line every :data:`REFUSAL_LOG_SECONDS` per reason,
    with the number refused since the last line (a client retrying in a loop must not flood the log)."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._count: dict[str, int] = {}

    def refused(self, reason: str, message: str) -> None:
        now = time.monotonic()
        self._count[reason] = self._count.get(reason, 0) + 1
        if now - self._last.get(reason, -REFUSAL_LOG_SECONDS) >= REFUSAL_LOG_SECONDS:
            count, self._count[reason] = self._count[reason], 0
            self._last[reason] = now
            log.warning("wds-async service: refused %d connection(s): %s", count, message)
