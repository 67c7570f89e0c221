"""Local file I/O from the event loop, through ``aiofiles``: what the file backend, cache fills and local
writers share.

aiofiles runs each blocking call (open, read, write, fsync, rename) in the loop's default executor. Two
things it leaves to its caller are done here once:

* **Cancellation.** A cancelled ``await`` does not stop a call already running in a thread. An open that
  completes after its caller was cancelled would leak the file (and, for a writer, leave its temporary
  file behind); a close that runs while a read or write of the same file is still in its thread could let
  that call reach a descriptor number the kernel has handed to another file. :func:`open_file` closes
  what an abandoned open returns (and :func:`in_thread_or_undo` undoes what any other abandoned call
  returns: the shard cache's copies opened and locks taken), :class:`Inflight` runs calls so that
  :func:`close_file` can wait for the ones still in their threads first, and a close is never lost to a
  second cancellation.
* **Closing a reader.** Closing a descriptor opened only for reading writes nothing back, so
  :func:`close_reader` closes it on the loop, as the file backend's page-cached reads run there: a thread hop
  for it cost a random-access read of a 64 KiB range about a fifth of its CPU. A read still running in its
  thread is waited for first, through :func:`close_file`.
* **Atomic files.** :class:`AsyncFileWriter` writes under a temporary name next to its target and makes
  the target appear only complete (flush, fsync, ``os.replace``): the rule of :mod:`wds_async._atomic`, from
  the loop (``wds-async cp`` writes its local destinations with it).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import aiofiles
import aiofiles.os
from aiofiles.threadpool.binary import AsyncFileIO

from ._atomic import PARTIAL_SUFFIX, is_partial, partial_path
from .errors import BackendError, PermissionDenied

if TYPE_CHECKING:
    from typing import Self

__all__ = ["PARTIAL_SUFFIX", "AsyncFileWriter", "Inflight", "close_file", "close_reader", "in_thread_or_undo", "is_partial",
           "open_file"]

T = TypeVar("T")
OpenMode = Literal["rb", "wb", "xb", "ab", "r+b"]


_fsync = aiofiles.os.wrap(os.fsync)
_pwrite = aiofiles.os.wrap(os.pwrite)

#: Cleanups (closes, discards) still running after their caller was cancelled; held so that they finish.
_cleanups: set[asyncio.Future[None]] = set()


def _close_now(f: AsyncFileIO) -> None:
    """Close an unbuffered file on the calling thread (releasing a descriptor never waits on the disk)
    where no executor hop can be trusted to run: aiofiles keeps the wrapped file as ``_file``."""
    raw = getattr(f, "_file", None)
    if raw is not None:
        raw.close()


def _drop(f: AsyncFileIO, path: str, remove: bool) -> None:
    _close_now(f)
    if remove:
        try:
            os.unlink(path)
        except OSError:
            pass


def _abandon(f: AsyncFileIO, path: str, remove: bool, loop: asyncio.AbstractEventLoop) -> None:
    """Close (and with ``remove``, delete) the file an open returned after its caller had gone."""
    try:  # a thread, not the loop, for the unlink (a metadata write); _drop swallows its errors
        loop.run_in_executor(None, _drop, f, path, remove)
    except RuntimeError:  # the executor is shut down already
        _drop(f, path, remove)


async def _finish(cleanup: Awaitable[None]) -> None:
    """Await ``cleanup``; a cancellation of the caller propagates but does not stop it."""
    future = asyncio.ensure_future(cleanup)
    _cleanups.add(future)
    future.add_done_callback(_cleanups.discard)
    await asyncio.shield(future)


async def open_file(path: str, mode: OpenMode, *, remove_if_abandoned: bool = False,
                    opener: Callable[[str, int], int] | None = None) -> AsyncFileIO:
    """``aiofiles.open(path, mode)`` unbuffered (each read or write is one system call at the file's
    offset). If the caller is cancelled while the open runs, the file it returns is closed on arrival
    (and deleted with ``remove_if_abandoned``, for a file the open created). ``opener`` is ``open()``'s (the
    descriptor comes from it, made in the same thread as the file that owns it). OSError propagates for the
    caller to translate."""
    loop = asyncio.get_running_loop()
    return await _or_undo(aiofiles.open(path, mode, buffering=0, opener=opener),
                          lambda f: _abandon(f, path, remove_if_abandoned, loop))


async def _or_undo(call: Awaitable[T], undo: Callable[[T], None]) -> T:
    """The result of ``call``, which a cancellation of the caller does not stop; if the caller is cancelled,
    ``undo(result)`` runs in the loop once ``call`` returns. ``undo`` must not raise."""
    running: asyncio.Future[T] = asyncio.ensure_future(call)
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        def _undone(done: asyncio.Future[T]) -> None:
            if not done.cancelled() and done.exception() is None:
                undo(done.result())

        running.add_done_callback(_undone)
        raise


async def in_thread_or_undo(call: Callable[[], T], undo: Callable[[T], None]) -> T:
    """``call()`` in the loop's default executor; if the caller is cancelled while it runs, ``undo(result)``
    runs in the loop once it returns (a descriptor opened, a lock taken: released, never leaked). ``undo``
    must not raise."""
    return await _or_undo(asyncio.to_thread(call), undo)


class Inflight:
    """Runs a file's executor calls so that none is left running unseen: after a cancelled ``run`` the call
    still finishes in its thread, and :meth:`settle` waits for it. Invariant: every call started through
    ``run`` is in ``pending`` until it has returned."""

    def __init__(self) -> None:
        self.pending: set[asyncio.Future[Any]] = set()

    async def run(self, call: Awaitable[T]) -> T:
        """The result of ``call``; cancelling the caller does not cancel the call."""
        future = asyncio.ensure_future(call)
        self.pending.add(future)
        future.add_done_callback(self.pending.discard)
        return await asyncio.shield(future)

    async def settle(self) -> None:
        """Wait until no call is running; their errors were the callers' to see and are dropped here."""
        while self.pending:
            await asyncio.gather(*self.pending, return_exceptions=True)


async def _settle_and_close(f: AsyncFileIO, calls: Iterable[Inflight]) -> None:
    for inflight in calls:
        await inflight.settle()
    try:
        await f.close()
    except asyncio.CancelledError:  # the hop never ran (loop shutting down): close right here
        _close_now(f)
        raise


async def close_file(f: AsyncFileIO, *calls: Inflight) -> None:
    """Close ``f`` after the calls of ``calls`` still in their threads have returned. A cancellation does
    not stop the close: it finishes in the background and the cancellation propagates. OSError from the
    close propagates."""
    await _finish(_settle_and_close(f, calls))


async def close_reader(f: AsyncFileIO, *calls: Inflight) -> None:
    """Close ``f``, a file opened for reading only: on the loop when none of ``calls`` is still in its thread
    (the close writes nothing back), else (or if aiofiles no longer exposes the wrapped file) as
    :func:`close_file` does. OSError from the close propagates."""
    raw = getattr(f, "_file", None)  # the wrapped file (see _close_now)
    if raw is None or any(inflight.pending for inflight in calls):
        await close_file(f, *calls)
        return
    raw.close()


def _write_error(exc: OSError, path: str, doing: str) -> BackendError:
    if isinstance(exc, PermissionError):
        return PermissionDenied(f"permission denied {doing}; check the directory's permissions", url=path)
    return BackendError(f"cannot {doing}: {exc.strerror or exc}; check free space and the path", url=path)


class AsyncFileWriter:
    """One file written from the event loop and published atomically: the bytes go to a temporary file
    next to ``target`` (same directory, so the final rename never crosses filesystems), and only
    :meth:`commit` makes a file appear under the final name, complete and on disk. :meth:`discard`, or
    leaving ``async with`` without a commit (an error, a cancellation), removes the temporary file; a
    crash leaves one named ``.<target name>.<random><PARTIAL_SUFFIX>``, which no reader mistakes for the
    target (see :func:`is_partial`).

    Used by the shard cache (fills written while the shard streams to the loader), ``wds-async cp`` and the
    local writers::

        async with AsyncFileWriter(path) as out:
            async for chunk in stream:
                await out.write(chunk)
            await out.commit()

    :meth:`write` appends at the writer's position and gathers small chunks into writes of up to
    ``buffer_bytes`` (one executor hop each); :meth:`pwrite` writes at an offset, straight through, and may
    run concurrently with other ``pwrite`` calls (for parts downloaded in parallel). Calls of ``write`` are
    made one at a time. Errors are :class:`~wds_async.errors.BackendError` naming the path.
    """

    def __init__(self, target: str | os.PathLike[str], *, buffer_bytes: int = 1 << 20) -> None:
        self.target = os.fspath(target)
        self.buffer_bytes = buffer_bytes
        #: The temporary file (the one rule, :func:`wds_async._atomic.partial_path`); it exists from :meth:`open`
        #: until :meth:`commit` or :meth:`discard`.
        self.path = partial_path(self.target)
        #: Bytes handed to ``write`` (buffered ones included); ``pwrite`` does not move it.
        self.position = 0
        self._file: AsyncFileIO | None = None
        self._buffer = bytearray()
        self._calls = Inflight()
        self._done = False

    async def open(self) -> Self:
        """Create the temporary file (exclusively: a name that exists is an error, never overwritten)."""
        try:
            self._file = await open_file(self.path, "xb", remove_if_abandoned=True)
        except asyncio.CancelledError:
            self._done = True  # open_file deletes the file if the open still creates it
            raise
        except OSError as exc:
            self._done = True
            raise _write_error(exc, self.path, "create a file next to the target") from None
        return self

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        if not self._done:
            await self.discard()

    def _opened(self) -> AsyncFileIO:
        if self._file is None or self._done:
            raise ValueError("AsyncFileWriter is not open (open() it first; commit() and discard() end it)")
        return self._file

    async def _write_all(self, data: memoryview, offset: int | None) -> None:
        f = self._opened()
        while data:
            try:
                if offset is None:
                    n = await self._calls.run(f.write(data))
                else:
                    n = await self._calls.run(_pwrite(f.fileno(), data, offset))
                    offset += n
            except OSError as exc:
                raise _write_error(exc, self.path, "write the file") from None
            data = data[n:]

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append ``data``; it reaches the file when ``buffer_bytes`` have gathered, or at :meth:`flush`."""
        self._opened()
        self.position += len(data)
        if not self._buffer and len(data) >= self.buffer_bytes:
            await self._write_all(memoryview(data), None)
            return
        self._buffer += data
        if len(self._buffer) >= self.buffer_bytes:
            await self.flush()

    async def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Write ``data`` at byte ``offset`` of the file, independent of :meth:`write`'s position."""
        await self._write_all(memoryview(data), offset)

    async def flush(self) -> None:
        """Write out what :meth:`write` has gathered."""
        if self._buffer:
            pending, self._buffer = self._buffer, bytearray()
            await self._write_all(memoryview(pending), None)

    async def commit(self, final_path: str | os.PathLike[str] | None = None) -> None:
        """Flush, fsync and rename the temporary file to ``final_path`` (default: ``target``), replacing
        what is there. On failure or cancellation the temporary file is removed and the error raised; the
        final path is then untouched. (The directory is not fsynced: after a power loss the rename may be
        undone, leaving the complete temporary file for a sweep, never a partial file under the name.)"""
        f = self._opened()
        final = os.fspath(final_path) if final_path is not None else self.target
        try:
            await self.flush()
            try:
                await self._calls.run(_fsync(f.fileno()))
                self._done = True
                await close_file(f, self._calls)
                await self._calls.run(aiofiles.os.replace(self.path, final))
            except BackendError:
                raise
            except OSError as exc:
                raise _write_error(exc, final, "publish the file") from None
        except BaseException:
            await self.discard()
            raise

    async def discard(self) -> None:
        """Close and remove the temporary file; never raises an OSError (the file may be gone already). A
        cancellation while discarding propagates, and the discard still finishes in the background."""
        self._done = True
        self._buffer = bytearray()
        f, self._file = self._file, None
        await _finish(self._remove(f))

    async def _remove(self, f: AsyncFileIO | None) -> None:
        try:
            if f is not None:
                await close_file(f, self._calls)
            await self._calls.settle()  # a rename under way finishes first; the unlink then finds it done
        except OSError:
            pass
        try:
            await aiofiles.os.unlink(self.path)
        except OSError:
            pass
