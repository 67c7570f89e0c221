"""Running one coroutine to completion on a private event loop, from synchronous code: the one way the
library and the CLI do so outside the streaming bridge (glob listing, building and loading an index,
``tune``, ``bench``'s raw phase, ``ls -l``, ``cat``, ``verify``).

The loop is :func:`new_event_loop` (uvloop when importable; the bridge's loop thread uses it too), driven by
:class:`asyncio.Runner`. On the way out every task still left on the loop is cancelled
and waited for (so their streams, sockets and child processes close), then async generators and the
default executor are finalized, and the loop is closed.

* From a thread that runs no loop (a script, the CLI), the coroutine runs right there. In the main
  thread Ctrl-C cancels it (its ``finally`` blocks and context managers run) and then raises
  :class:`KeyboardInterrupt`, as :func:`asyncio.run` does.
* From a thread that already runs a loop (a notebook cell, an async web handler), a loop cannot be
  nested, so the private loop runs in a helper thread and the caller blocks until it is done. If the
  wait is interrupted, the coroutine is cancelled and waited for before the interrupt propagates.

The coroutine is created by ``make()`` in the thread that runs it, so it never exists unawaited in
another thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ["new_event_loop", "run_private"]

T = TypeVar("T")

#: Seconds an interrupted caller waits for a thread it was starting to signal that it runs, where the interrupt came
#: inside ``Thread.start()``: a thread that exists does within milliseconds; one the interrupt kept from existing never.
START_WAIT = 5.0


@contextlib.contextmanager
def stopped_if_interrupted(running: threading.Event, stop: Callable[[], None]) -> Iterator[None]:
    """Around the start of a thread (``Thread.start()`` and any wait for it): where an interrupt (or any exception)
    comes, ``stop()`` what the thread started before it propagates. ``Thread.start()`` itself waits for the new
    thread's handshake, so the thread may already be at work when the interrupt comes there, or, earlier, never
    exist: ``running`` (set by the thread) is waited for at most :data:`START_WAIT` seconds, and ``stop()`` runs
    only where it was set."""
    try:
        yield
    except BaseException:
        if running.wait(START_WAIT):
            stop()
        raise


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed (faster sockets and subprocesses), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()  # type: ignore[no-any-return]


def run_private(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Return the result of ``make()`` run on a fresh event loop, or raise its exception (see the module
    docstring); nothing of the loop outlives the call."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass  # (not run in here: its errors would carry this RuntimeError as their context)
    else:
        return _Helper(make).wait()  # type: ignore[no-any-return]
    return _run_here(make())


def _run_here(coro: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)


class _Helper:
    """``make()`` on a private loop in a helper thread, for a caller whose own thread runs a loop."""

    def __init__(self, make: Callable[[], Coroutine[Any, Any, T]]) -> None:
        self._make = make
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._started = threading.Event()
        self._done = threading.Event()
        self._outcome: tuple[bool, Any] = (False, RuntimeError("the private loop thread ended without a result"))
        self._thread = threading.Thread(target=self._main, name="wds-async-private-loop", daemon=True)

    def wait(self) -> Any:
        # An Event, not Thread.join(): on Python 3.11 a join() that an interrupt cut short marks the thread as
        # finished, and the second join() would return at once, before the cancelled work has cleaned up.
        # KeyboardInterrupt or SystemExit in the caller, inside start() too: stop the work, then re-raise.
        with stopped_if_interrupted(self._started, self._cancel):
            self._thread.start()
            self._done.wait()
        ok, value = self._outcome
        if ok:
            return value
        raise value

    def _cancel(self) -> None:
        """Cancel the work and wait until it has cleaned up."""
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop has just closed: nothing left to cancel
                pass
        self._done.wait()

    async def _run(self) -> Any:
        self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        self._started.set()
        return await self._make()

    def _main(self) -> None:
        try:
            self._outcome = (True, _run_here(self._run()))
        except BaseException as exc:  # handed to the caller's thread, raised there
            self._outcome = (False, exc)
        finally:
            self._loop = self._task = None
            self._started.set()
            self._done.set()
