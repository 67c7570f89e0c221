"""What the engine reads a cached shard through (:mod:`wds_async.cache.disk`): :class:`CacheHit` (a complete copy,
read by the file backend with the store's identity), :class:`CacheFill` (the lock and ``.part`` file a shard is
written to while it streams) and :class:`Prechecks` (copies' identity checks started ahead of the items).

Every file a fill writes (``.part``, then ``.json.tmp``) is created new, mode 0600, with ``O_EXCL | O_NOFOLLOW``
after its name is unlinked, and moved into place by ``rename``, which never follows a link (see "Security" in
:mod:`wds_async.cache.disk`). A write that fails because the directory cannot be written stops the fills of the
process with one warning (:meth:`~wds_async.cache.disk.ShardCache.cannot_fill`); any other failure abandons that
fill alone, and the shard goes on from the store."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

import aiofiles.os
from aiofiles.threadpool.binary import AsyncFileIO

from .._aio import Inflight, close_file, open_file
from ..backends.file import FileBackend
from ..config import RetryPolicy
from ..io import Backend, ByteStream, ObjectIdentity
from ..io.reader import RangeReader, ReadContext
from ..stats import Stats
from ..urls import redact_url
from .files import IDENTITY_FIELDS, META_VERSION, create_new, touch, unlink, unlock


class ShardCache(Protocol):
    """What hits, fills and prechecks need of the cache that made them (:class:`wds_async.cache.disk.ShardCache`
    is the one); declared here so that this module does not import the one that imports it."""

    validate: bool
    max_bytes: int | None

    def cacheable(self, url: str) -> bool: ...

    def path(self, url: str, suffix: str = "") -> str: ...

    def make_room(self, incoming: int, keep: str | None = None) -> bool: ...

    def cannot_fill(self, url: str, exc: OSError, doing: str) -> None: ...

__all__ = ["FILL_WRITE_BYTES", "CacheFill", "CacheHit", "Prechecks", "store_identity"]

log = logging.getLogger("wds_async")

#: The most bytes a fill gathers before writing them to its ``.part`` file.
FILL_WRITE_BYTES = 1 << 20
#: The longest a fill keeps bytes it received before writing them: the file's growth is what tells another
#: process waiting for the copy that this fill is alive (``ShardCache.stall_seconds``), also on a slow store.
FILL_WRITE_SECONDS = 0.5


async def store_identity(backend: Backend, url: str, policy: RetryPolicy, stats: Stats | None) -> ObjectIdentity:
    """The object's identity now, from a 1-byte ranged read (what every backend can do, retried as usual)."""
    reader = RangeReader(backend, url, start=0, end=1, context=ReadContext(policy))
    async with contextlib.aclosing(reader.chunks()) as chunks:
        async for _ in chunks:
            pass
    if stats is not None:
        stats.requests += 1
    return reader.identity or ObjectIdentity()


class Prechecks:
    """Identity checks started ahead of the items that need them, so a copy's validation costs no round trip
    on the item's path: the engine calls :meth:`ahead` for the items it will hand out next (those with a copy
    on disk get a check task in the engine's TaskGroup), and :meth:`identity` when an item reaches its copy.
    A check whose item never comes is cancelled by :meth:`close`."""

    def __init__(self, cache: ShardCache, policy: RetryPolicy, stats: Stats | None, group: Any) -> None:
        self.cache, self.policy, self.stats, self.group = cache, policy, stats, group
        self.tasks: dict[str, asyncio.Task[ObjectIdentity]] = {}

    def ahead(self, url: str, backend: Backend) -> None:
        if (not self.cache.validate or url in self.tasks or not self.cache.cacheable(url)
                or not os.path.exists(self.cache.path(url, ".json"))):
            return
        task = self.group.create_task(store_identity(backend, url, self.policy, self.stats))
        task.add_done_callback(_retrieve)  # an error is raised where the item awaits it, or dropped unneeded
        self.tasks[url] = task

    async def identity(self, url: str, backend: Backend) -> ObjectIdentity:
        task = self.tasks.pop(url, None)
        if task is None:
            return await store_identity(backend, url, self.policy, self.stats)
        return await task

    def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        self.tasks.clear()


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


class CacheHit:
    """A complete copy, open: :attr:`backend` reads it in place of the store."""

    def __init__(self, cache: ShardCache, fd: int, identity: ObjectIdentity, path: str) -> None:
        self.cache, self.fd, self.identity, self.path = cache, fd, identity, path
        self.backend = _CopyReader(self)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _CopyReader:
    """Reads the open copy through the file backend, answering with the store's identity.

    The copy is opened by its descriptor's ``/proc/self/fd`` (``/dev/fd``) name where the system has one, so a
    copy that another process evicts after the lookup stays readable; elsewhere by its path."""

    def __init__(self, hit: CacheHit) -> None:
        self.hit = hit
        self.files = FileBackend()
        self.capabilities = self.files.capabilities
        by_fd = next((d for d in ("/proc/self/fd", "/dev/fd") if os.path.isdir(d)), None)
        self.path = f"{by_fd}/{hit.fd}" if by_fd else hit.path

    @contextlib.asynccontextmanager
    async def open(self, url: str, *, start: int = 0, end: int | None = None) -> AsyncIterator[ByteStream]:
        async with self.files.open(self.path, start=start, end=end) as stream:
            stream.identity = self.hit.identity
            yield stream

    async def size(self, url: str) -> int | None:
        return self.hit.identity.size

    async def list(self, pattern: str) -> list[str]:
        raise NotImplementedError("a cached copy is one object; globs are listed by the store's backend")

    async def aclose(self) -> None:
        await self.files.aclose()


class CacheFill:
    """The lock on one shard and its ``.part`` file, written as the engine reads (see the module docstring).

    Chunks are gathered into writes of :data:`FILL_WRITE_BYTES`: one aiofiles call (a thread hop) per network
    chunk cost as much CPU as the download itself. The engine counts that buffer in its byte budget while
    the fill is open (``reserve``), so memory stays bounded."""

    def __init__(self, cache: ShardCache, url: str, lock_fd: int) -> None:
        self.cache, self.url, self.lock_fd = cache, url, lock_fd
        self.part = cache.path(url, ".part")
        self.written = 0
        self.failed = False  # abandoned (disk full, too large): the shard goes on from the store
        self._file: AsyncFileIO | None = None
        self._calls = Inflight()  # the file's writes, which its close waits for
        self._pending = bytearray()
        self._flushed_at = time.monotonic()

    async def write(self, chunk: bytes, size: int | None) -> None:
        """Append ``chunk``; ``size`` is the object's announced size (room is made for it first)."""
        if self.failed:
            return
        try:
            if self._file is None:
                if size is None or not await asyncio.to_thread(self.cache.make_room, size, None):
                    self._abandon("its size is unknown" if size is None else
                                  f"it is larger than the room cache_size={self.cache.max_bytes} leaves")
                    return
                self._file = await self._create_part()
            self._pending += chunk
            self.written += len(chunk)
            if (len(self._pending) >= FILL_WRITE_BYTES or
                    time.monotonic() - self._flushed_at >= FILL_WRITE_SECONDS):
                await self._flush()
        except OSError as exc:
            self.failed = True
            self.cache.cannot_fill(self.url, exc, "writing")

    async def _create_part(self) -> AsyncFileIO:
        """The new ``.part`` file, open. Whatever has its name (a crash's leftover, a planted link) is unlinked
        first, never written through: this process holds the shard's lock, so no fill of another owns it. The
        descriptor is made by the open that owns it (:func:`~wds_async._aio.open_file`): an open cancelled
        mid-way is closed and removed when it returns, never closed twice. (A descriptor made in one thread call
        and wrapped in the next, as before, was closed by the cancelled caller and again by the file object that
        wrapped it later: the second close could take another file's descriptor number, and another fill's writes
        then failed with EBADF.)"""
        await asyncio.to_thread(unlink, self.part)
        return await open_file(self.part, "wb", remove_if_abandoned=True, opener=_create_new)

    async def _flush(self) -> None:
        data, self._pending = self._pending, bytearray()
        self._flushed_at = time.monotonic()
        view = memoryview(data)
        file = self._file
        assert file is not None
        while view:  # an unbuffered write may take part of the data; a close waits for a write still running
            view = view[await self._calls.run(file.write(view)):]

    def _abandon(self, why: str) -> None:
        self.failed = True
        log.warning("cache: not caching %s: %s; it is read from the store", redact_url(self.url), why)

    async def commit(self, identity: ObjectIdentity | None, stats: Stats | None = None) -> bool:
        """Make the copy trusted if it is the whole object; True when it was."""
        if self.failed or self._file is None or identity is None or identity.size != self.written:
            return False
        try:
            await self._flush()
            file, self._file = self._file, None
            await close_file(file, self._calls)
            data = self.cache.path(self.url)
            await aiofiles.os.replace(self.part, data)  # a rename moves names, never follows a link
            meta = {"version": META_VERSION, "url": redact_url(self.url), "committed": time.time(),
                    **{k: getattr(identity, k) for k in IDENTITY_FIELDS}}
            await asyncio.to_thread(_write_meta, data + ".json", json.dumps(meta).encode())
        except OSError as exc:
            self.failed = True
            self.cache.cannot_fill(self.url, exc, "committing")
            return False
        if stats is not None:
            stats.cache_fills += 1
        await asyncio.to_thread(self.cache.make_room, 0, os.path.basename(data))
        return True

    async def close(self) -> None:
        """Release the lock; a file not committed is removed."""
        try:
            if self._file is not None:
                file, self._file = self._file, None
                with contextlib.suppress(OSError):
                    await close_file(file, self._calls)  # after any write of it still in its thread
                await asyncio.to_thread(unlink, self.part)
            elif self.failed:
                await asyncio.to_thread(unlink, self.part)
        finally:
            unlock(self.lock_fd)
            self.lock_fd = -1


def _create_new(path: str, flags: int) -> int:
    """``open()``'s opener for a ``.part`` file: :func:`~wds_async.cache.files.create_new`, whatever ``flags``."""
    return create_new(path)


def _write_meta(path: str, data: bytes) -> None:
    """Write a copy's metadata as ``path``: to a new ``.tmp`` file (whatever had that name is unlinked first, as
    for ``.part``), stamped as used now, then renamed into place."""
    tmp = path + ".tmp"
    unlink(tmp)
    fd = create_new(tmp)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        touch(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
