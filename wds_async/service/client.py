"""The client side of the node service: the same samples and callbacks as the in-process engine.

:func:`service_batches` is what the bridge's ``batches()`` is in-process: lists of samples (``url``, ``offset``,
``end`` and ``item`` set as the engine sets them), end-of-item markers and errors, which
:func:`~wds_async.data.pipeline.stream_samples` consumes with the same loop either way, so a dataset's planning,
callbacks and checkpoints do not change with the service. The work
items are planned here, by the client, and sent in ``open`` frames (a lazy stream in chunks of
``LAZY_CHUNK``); a batch's fields are copied out of the ring into ``bytes``, the ring space acknowledged,
then its samples yielded. Errors the service hands back in band meet this process's ``handler``.

Socket I/O is blocking, in the consumer's thread, with a stall guard: the service says ``alive`` every two
seconds when it has nothing to send, so ``stall_timeout`` seconds of silence, or the socket closing, mean it
is gone: :class:`~wds_async.errors.ServiceError` naming the socket, never a hang.

Connecting retries while the service's listen backlog is full (``EAGAIN``), for up to ``CONNECT_TIMEOUT``
seconds. A service that refuses a connection (another user, over its connection limit, out of descriptors)
says why in an ``error`` frame before closing; the client raises that, not "stopped while serving", even
when the refusal makes its own ``hello`` fail to send.

What is sent: work items with local paths made absolute against this process's working directory (``~``
expanded), packed into ``open`` frames of about ``OPEN_FRAME_BYTES``; when a frame holds ``pipe:`` items,
this process's working directory and environment go with it (``context``), and the service runs the
commands there (:mod:`wds_async.service.validate`).
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

from ..engine.grouping import Sample
from ..engine.spec import StreamSpec
from ..engine.work import ItemDone, WorkItem
from ..errors import ServiceError
from ..stats import Stats
from ..urls import redact_url, scheme_of
from .protocol import OPEN_FRAME_BYTES, VERSION, FrameDecoder, encode, error_from_json, item_to_json
from .ring import RingReader

__all__ = ["connect", "service_answers", "service_batches", "service_status"]

#: Items per ``open`` frame for a list, and for a lazy (possibly endless) stream.
LIST_CHUNK = 65536
LAZY_CHUNK = 1024
#: Seconds to get a connection accepted, retrying while the service's backlog is full.
CONNECT_TIMEOUT = 10.0
#: The longest pause between two connection attempts (they start at 10 ms and double).
CONNECT_RETRY_MAX = 0.25


def _gone(path: str, why: str) -> ServiceError:
    return ServiceError(f"the wds-async service at {path} stopped while serving ({why}); restart it "
                        f"(`wds-async serve --socket {path}`) and resume from the last checkpoint "
                        "(load_state_dict)", url=path)


class Connection:
    """One blocking connection to a service: frames out, frames (and passed descriptors) in."""

    def __init__(self, path: str, stall_timeout: float = 30.0) -> None:
        self.path = path
        self.stall_timeout = stall_timeout
        #: True once the service answered the first request: a close before that is not "stopped while serving".
        self.answered = False
        self.sock = _connect(path)
        self.sock.settimeout(stall_timeout)
        self._decoder = FrameDecoder(f"the service at {path}")
        self._frames: deque[dict[str, Any]] = deque()
        self._fds: deque[int] = deque()

    def send(self, message: dict[str, Any]) -> None:
        self.send_frame(encode(message))

    def send_frame(self, frame: bytes) -> None:
        try:
            self.sock.sendall(frame)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise self._pending_error() or self._closed(type(exc).__name__) from None
        except TimeoutError:
            raise _gone(self.path, f"it took nothing for {self.stall_timeout:.0f} s") from None

    def _closed(self, why: str) -> ServiceError:
        if self.answered:
            return _gone(self.path, why)
        return ServiceError(f"the wds-async service at {self.path} closed the connection without answering ({why}): "
                            "it may have refused this process (it serves only its own user, up to its connection "
                            "limit; see its log) or stopped; check it with `wds-async serve --socket "
                            f"{self.path}`", url=self.path)

    def _pending_error(self) -> BaseException | None:
        """An ``error`` frame the service sent before closing, if one can still be read (a refused connection
        finds its hello rejected by a closed socket, the reason waiting unread)."""
        try:
            self.sock.settimeout(1.0)
            while True:
                for message in self._frames:
                    if message.get("type") == "error":
                        return error_from_json(message.get("error") or {})
                self._frames.clear()
                data, fds, _flags, _addr = socket.recv_fds(self.sock, 1 << 18, 4)
                self._fds.extend(fds)
                if not data:
                    return None
                self._frames.extend(self._decoder.feed(data))
        except (OSError, ServiceError):
            return None

    def recv(self) -> tuple[dict[str, Any], list[int]]:
        """The next frame and the descriptors passed with it."""
        while not self._frames:
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.sock, 1 << 18, 4)
            except TimeoutError:
                raise _gone(self.path, f"no word from it for {self.stall_timeout:.0f} s") from None
            except ConnectionResetError:
                raise self._closed("connection reset") from None
            self._fds.extend(fds)
            if not data:
                raise self._closed("connection closed")
            self._frames.extend(self._decoder.feed(data))
            self.answered = True
        message = self._frames.popleft()
        count = int(message.get("fds", 0))
        if len(self._fds) < count:
            raise ServiceError(f"the service at {self.path} announced {count} descriptors but passed "
                               f"{len(self._fds)}", url=self.path)
        return message, [self._fds.popleft() for _ in range(count)]

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        try:
            self.sock.close()
        except OSError:
            pass


def _connect(path: str) -> socket.socket:
    """A socket connected to ``path``, retrying while the service's backlog is full (see the module docstring)."""
    deadline = time.monotonic() + CONNECT_TIMEOUT
    pause = 0.01
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
            sock.close()
            raise ServiceError(f"no wds-async service at {path}; start one with `wds-async serve --socket {path}`, "
                               "or pass service='auto'", url=path) from None
        except OSError as exc:
            sock.close()
            if exc.errno not in (errno.EAGAIN, errno.EINTR):
                raise ServiceError(f"cannot reach the wds-async service at {path}: {exc}", url=path) from exc
            if time.monotonic() + pause > deadline:
                raise ServiceError(f"the wds-async service at {path} accepted no connection for {CONNECT_TIMEOUT:.0f} "
                                   "s (its listen backlog stayed full: overloaded, or stopped); check it, or "
                                   "start fewer clients at once", url=path) from None
            time.sleep(pause)
            pause = min(CONNECT_RETRY_MAX, pause * 2)


def connect(path: str, stall_timeout: float = 30.0) -> Connection:
    """A connection to the service at ``path`` (ServiceError naming it when none answers)."""
    return Connection(path, stall_timeout)


def service_answers(path: str) -> bool:
    """True when a service answers a ``status`` request at ``path``."""
    try:
        service_status(path, timeout=5.0)
        return True
    except ServiceError:
        return False


def service_status(path: str, timeout: float = 10.0) -> dict[str, Any]:
    """The service's ``status``: ``sessions`` (connected clients), ``clients`` (their pids), ``connections``
    (the node limiter's total), ``in_flight`` and ``stats`` (service-wide counters)."""
    conn = Connection(path, timeout)
    try:
        conn.send({"type": "status", "version": VERSION})
        message, _ = conn.recv()
        if message.get("type") == "error":
            raise error_from_json(message.get("error") or {})
        if message.get("type") != "status":
            raise ServiceError(f"the service at {path} answered {message.get('type')!r} to a status request",
                               url=path)
        return message
    finally:
        conn.close()


def _as_item(n: int, entry: Any) -> WorkItem:
    if isinstance(entry, WorkItem):
        return entry
    url = entry["url"] if isinstance(entry, dict) else entry
    return WorkItem(id=n, shard=n, url=str(url))


def _absolute(item: WorkItem) -> WorkItem:
    """A relative local path (``~`` expanded, as in-process) made absolute: the service's working directory
    is not this process's, and it refuses relative paths."""
    url = item.url
    if scheme_of(url) != "file" or url.startswith("file://"):
        return item
    path = os.path.expanduser(url.removeprefix("file:"))
    if not os.path.isabs(path):
        path = os.path.join(os.getcwd(), path)  # joined, not normalised: "link/.." means what it means here
    return item if path == url else dataclasses.replace(item, url=path)


def _context() -> dict[str, Any] | None:
    """This process's working directory and environment, where the service runs its ``pipe:`` commands."""
    try:
        return {"cwd": os.getcwd(), "env": dict(os.environ)}
    except OSError:  # the working directory was removed: the service refuses the pipe: items, saying why
        return None


def _open_frames(chunk: list[WorkItem], fields: dict[str, Any]) -> Iterator[tuple[list[WorkItem], bytes]]:
    """``(items, frame)``: ``open`` frames covering ``chunk`` in order, each about ``OPEN_FRAME_BYTES`` at
    most (a single larger item goes alone), with this process's context when they hold ``pipe:`` items."""
    pending = deque([chunk])
    context = None
    while pending:
        part = pending.popleft()
        message = {"type": "open", "items": [item_to_json(_absolute(i)) for i in part], **fields}
        if any(scheme_of(i.url) == "pipe" for i in part):
            context = context or _context()
            message["context"] = context
        frame = encode(message)
        if len(frame) > OPEN_FRAME_BYTES and len(part) > 1:
            size = max(1, min(len(part) // 2, int(len(part) * OPEN_FRAME_BYTES / len(frame) * 0.9)))
            pending.extendleft(reversed([part[i:i + size] for i in range(0, len(part), size)]))
            continue
        yield part, frame


def _chunks(items: Iterable[Any]) -> Iterator[list[WorkItem]]:
    size = LIST_CHUNK if isinstance(items, list) else LAZY_CHUNK
    numbered = itertools.starmap(_as_item, enumerate(items))
    while chunk := list(itertools.islice(numbered, size)):
        yield chunk


def service_batches(items: Iterable[Any], spec: StreamSpec, stats: Stats,
                    stall_timeout: float = 30.0) -> Generator[list[Any], None, None]:
    """Lists of what the service at ``spec.service`` read for ``items`` (work items, URLs or ``{"url": ...}``):
    :class:`~wds_async.engine.grouping.Sample` objects (``url``, ``offset``, ``end`` and ``item`` set as the engine
    sets them), :class:`~wds_async.engine.work.ItemDone` markers and exceptions to raise, in order: what the bridge
    hands over in-process, consumed by the same loop (:func:`wds_async.data.pipeline.stream_samples`). Errors the
    service sends back in band meet ``spec.handler`` here; a handler's "stop" ends the lists."""
    path = spec.service
    if path is None:
        raise ValueError("service_batches needs spec.service, the service's socket")
    if isinstance(items, list):
        stats.shards_total = len(items)
    cache = None if spec.cache is None else {"dir": spec.cache.directory, "max_bytes": spec.cache.max_bytes,
                                             "validate": spec.cache.validate}
    fields = {"settings": dict(spec.service_settings or {}), "backend_options": spec.backend_options or None,
              "cache": cache}
    conn = Connection(path, stall_timeout)
    ring: RingReader | None = None
    try:
        conn.send({"type": "hello", "version": VERSION, "pid": os.getpid(), "socket": path})
        ready, fds = conn.recv()
        if ready.get("type") == "error":
            raise error_from_json(ready.get("error") or {})
        if ready.get("type") != "ready" or len(fds) != 1:
            raise ServiceError(f"the service at {path} answered {ready.get('type')!r} to hello", url=path)
        ring = RingReader(fds[0], int(ready["ring_bytes"]))
        for chunk in _chunks(items):
            for part, frame in _open_frames(chunk, fields):
                conn.send_frame(frame)
                shown = {item.id: redact_url(item.url) for item in part}  # as the engine names them in-process
                stop = yield from _receive(conn, ring, spec.handler, stats, shown)
                if stop:
                    return
    finally:
        try:
            if ring is not None:
                conn.sock.settimeout(1.0)
                conn.send({"type": "close"})
        except (ServiceError, OSError):
            pass
        conn.close()
        if ring is not None:
            ring.close()


def _receive(conn: Connection, ring: RingReader, handler: Callable[[BaseException], bool], stats: Stats,
             shown: dict[int, str]) -> Generator[list[Any], None, bool]:
    """Deliver one ``open``'s batches until its ``end``; True when the handler asked to stop."""
    while True:
        started = time.perf_counter()
        message, fds = conn.recv()
        stats.wait_seconds += time.perf_counter() - started
        kind = message["type"]
        if kind == "end":
            return False
        if kind == "alive":
            continue
        if kind == "error":
            raise error_from_json(message.get("error") or {})
        if kind != "batch":
            raise ServiceError(f"unexpected {kind!r} frame from the service at {conn.path}", url=conn.path)
        entries = _copy_out(message["entries"], ring, fds, stats, shown)
        if message.get("span"):
            conn.send({"type": "ack", "bytes": message["span"]})
        batch: list[Any] = []
        for entry in entries:
            if type(entry) is Sample:
                batch.append(entry)
            elif isinstance(entry, int):
                stats.shards_done += 1
                batch.append(ItemDone(entry))
            else:
                error, level = entry
                if level == "fatal" or not handler(error):
                    if level == "fatal":
                        batch.append(error)
                        yield batch
                        return True
                    yield batch
                    return True
                if level == "sample":
                    stats.samples_skipped += 1
                else:
                    stats.shards_skipped += 1
        if batch:
            yield batch


def _copy_out(entries: list[Any], ring: RingReader, fds: list[int], stats: Stats, shown: dict[int, str]) -> list[Any]:
    """Samples (fields copied into ``bytes``), item ids done, and ``(error, level)`` pairs, in order."""
    out: list[Any] = []
    try:
        for entry in entries:
            tag = entry[0]
            if tag == "s":
                _, key, url, offset, end, item, fields = entry
                url = shown.get(item, url)
                sample = Sample(__key__=key, __url__=url)
                sample.url, sample.offset, sample.end, sample.item = url, offset, end, item
                for name, at, length in fields:
                    sample[name] = os.pread(fds[0], length, at) if fds else ring.read(at, length)
                    stats.bytes_read += length
                stats.samples_read += 1
                stats.delivered(1)  # stamps first_sample_s, as the bridge does in-process
                out.append(sample)
            elif tag == "d":
                out.append(int(entry[1]))
            else:
                out.append((error_from_json(entry[1]), entry[2]))
    finally:
        for fd in fds:
            os.close(fd)
    return out
