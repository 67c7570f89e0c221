"""``pipe:CMD``: the standard output of a shell command.

This runs ``CMD`` through ``/bin/sh`` exactly as written: treat ``pipe:`` URLs like code. Setting
``WDS_ASYNC_NO_PIPE=1`` (or ``allow_pipe=False``) forbids them.

EOF is not success: the stream ends cleanly only when the command exited with status 0; otherwise it
raises :class:`~wds_async.errors.PipeError` with the status and the tail of the command's stderr.
The command runs in its own process group; when the consumer stops early the whole group gets SIGTERM
and, after a short grace, SIGKILL, and is reaped: we never wait for a command to finish on its own.
A pipe cannot seek, so ``open(start=N)`` re-runs the command and discards the first ``N`` bytes.
An open cancelled while the command starts lets the start finish and then stops the command (Python
3.11's ``create_subprocess_shell`` hangs when cancelled mid-start).

Commands start one at a time in a process (:data:`_STARTING`, queued per loop), whatever loop starts
them: uvloop refuses a spawn while another loop of the process is forking (``RuntimeError: Racing with
another loop to spawn a process``), and every dataset that does not share an engine runs its own loop: a
training set and an evaluation set iterated together, a mix's sources with other options, a shuffle
buffer refilled on resume.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import threading
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import IO

from wds_async._aio import in_thread_or_undo
from wds_async.errors import BackendError, NotFound, PipeError, UrlError
from wds_async.io.backend import ByteStream, Capabilities

__all__ = ["PipeBackend", "pipe_command", "pipes_allowed"]

STDERR_TAIL_BYTES = 2048


def pipes_allowed(allow_pipe: bool | None = None) -> bool:
    if allow_pipe is not None:
        return allow_pipe
    return os.environ.get("WDS_ASYNC_NO_PIPE", "").strip().lower() not in ("1", "true", "yes", "on")


def pipe_command(url: str) -> str:
    """The shell command of a ``pipe:`` URL; UrlError when there is none."""
    cmd = url[len("pipe:"):].strip()
    if not cmd:
        raise UrlError("pipe: URL has no command after 'pipe:'", url=url)
    return cmd


def _tail(fh: IO[bytes]) -> str:
    with suppress(OSError):
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, size - STDERR_TAIL_BYTES))
        return fh.read().decode("utf-8", "replace").strip()
    return ""


def _describe(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return f"killed by signal {name}"
    return f"exited with status {returncode}"


#: Held while a command starts (a fork and an exec: milliseconds), by whichever loop of the process starts one.
_STARTING = threading.Lock()
#: Each loop's own queue for that lock: starts of one loop wait their turn on the loop, not in threads.
_LOOP_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


def _new_lock_in_child() -> None:
    global _STARTING
    _STARTING = threading.Lock()  # a fork copies the lock as it was; a start in another thread never ends here


os.register_at_fork(after_in_child=_new_lock_in_child)


async def _take_turn() -> Callable[[], None]:
    """This start's turn, taken; returns what gives it back. The loop's queue first (a start of the same loop
    waits on the loop), then the process's lock: at once when free, else waited for in a thread (and, for a
    caller cancelled meanwhile, released once that thread gets it)."""
    loop = asyncio.get_running_loop()
    queue = _LOOP_TURNS.get(loop)
    if queue is None:
        queue = _LOOP_TURNS[loop] = asyncio.Lock()
    await queue.acquire()
    lock = _STARTING
    try:
        if not lock.acquire(blocking=False):
            await in_thread_or_undo(lock.acquire, lambda _: lock.release())
    except BaseException:
        queue.release()
        raise

    def give_back() -> None:
        lock.release()
        queue.release()

    return give_back


class PipeBackend:
    """Runs each ``pipe:`` command as an asyncio subprocess and streams its stdout."""

    #: A command's output has no ranges: a start offset is reached by reading and discarding, so a shard
    #: is never split into concurrent parts.
    capabilities: Capabilities

    def __init__(self, *, chunk_bytes: int = 1 << 20, kill_grace: float = 1.0, allow_pipe: bool | None = None,
                 cwd: str | None = None, env: dict[str, str] | None = None) -> None:
        self.chunk_bytes = chunk_bytes
        # One read in flight per command, counted in the byte budget.
        self.capabilities = Capabilities(ranged_reads=False, buffer_allowance=chunk_bytes)
        self.kill_grace = kill_grace
        self.allow_pipe = allow_pipe
        self.cwd, self.env = cwd, env  # where commands run, with what environment (None: this process's)

    @asynccontextmanager
    async def open(self, url: str, *, start: int = 0, end: int | None = None) -> AsyncIterator[ByteStream]:
        if not pipes_allowed(self.allow_pipe):
            raise UrlError("pipe: URLs are disabled (WDS_ASYNC_NO_PIPE is set or allow_pipe=False)", url=url)
        cmd = pipe_command(url)
        with tempfile.TemporaryFile() as errfile:
            proc = await self._spawn(cmd, errfile, url)
            stream = ByteStream(self._chunks(proc, errfile, url, start, end), start=start)
            try:
                yield stream
            finally:
                await stream.aclose()
                await self._stop(proc)

    async def _chunks(
        self, proc: asyncio.subprocess.Process, errfile: IO[bytes], url: str, start: int, end: int | None
    ) -> AsyncIterator[bytes]:
        assert proc.stdout is not None
        pos, skip = 0, start  # pos: bytes yielded so far, from ``start``
        while end is None or pos < end - start:
            chunk = await proc.stdout.read(self.chunk_bytes)
            if not chunk:
                break
            if skip:
                if len(chunk) <= skip:
                    skip -= len(chunk)
                    continue
                chunk, skip = chunk[skip:], 0
            if end is not None and pos + len(chunk) > end - start:
                chunk = chunk[: end - start - pos]
            pos += len(chunk)
            yield chunk
        if end is not None and pos >= end - start:
            return
        returncode = await proc.wait()
        if returncode != 0:
            tail = _tail(errfile)
            what = "command not found" if returncode == 127 else _describe(returncode)
            message = f"pipe: command {what} after {start + pos} bytes"
            if tail:
                message += f"; stderr: {tail}"
            if returncode == 127:
                raise NotFound(message, url=url, offset=start + pos)
            raise PipeError(message, url=url, offset=start + pos, returncode=returncode, stderr_tail=tail)
        if skip:
            raise BackendError(f"pipe: output ended after {start - skip} bytes, before the resume offset {start}",
                               url=url, offset=start - skip)

    async def _spawn(self, cmd: str, errfile: IO[bytes], url: str) -> asyncio.subprocess.Process:
        """Start ``cmd`` in its own process group, its stdout piped to us and its stderr into ``errfile``.

        Python 3.11 hangs for good when ``create_subprocess_shell`` is cancelled after the fork (its cleanup
        waits for pipes that were never connected; 3.12 fixed it), and a consumer that stops early cancels
        exactly there. So the start runs in a task of its own, which a cancellation of the caller does not
        reach: the caller waits for it (a fork and an exec: milliseconds), stops the command, then propagates. Starts are one at a time in the process
        (see the module docstring)."""
        give_back = await _take_turn()
        start = asyncio.ensure_future(asyncio.create_subprocess_shell(
            cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=errfile,
            start_new_session=True, cwd=self.cwd, env=self.env,
        ))
        cancelled: asyncio.CancelledError | None = None
        try:
            while not start.done():  # the start runs to its end, also for a caller cancelled meanwhile
                try:
                    await asyncio.wait([start])
                except asyncio.CancelledError as exc:
                    cancelled = exc
        finally:
            give_back()  # started: the next start need not wait for this command to be stopped
        if cancelled is not None:
            if not start.cancelled() and start.exception() is None:
                await self._stop(start.result())
            raise cancelled
        try:
            return start.result()
        except OSError as exc:
            raise BackendError(f"cannot start the shell for the pipe: command: {exc}", url=url) from None

    async def _stop(self, proc: asyncio.subprocess.Process) -> None:
        """Terminate the command's process group if it still runs; always reap it."""
        if proc.returncode is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
                try:
                    await asyncio.wait_for(proc.wait(), self.kill_grace)
                    break
                except TimeoutError:
                    continue
        with suppress(ProcessLookupError):
            await proc.wait()
        # A reaped process can still hold its stdout pipe transport open (unread data, no EOF yet); the
        # loop cannot close with it (uvloop: EBUSY) and its fd would leak. asyncio's Process offers no
        # public close, so close its transport, which closes the pipes (both asyncio and uvloop).
        transport = getattr(proc, "_transport", None)
        if transport is not None:
            transport.close()

    async def size(self, url: str) -> int | None:
        return None

    async def list(self, pattern: str) -> list[str]:
        raise BackendError("pipe: URLs cannot be listed", url=pattern)

    async def aclose(self) -> None:
        return None
