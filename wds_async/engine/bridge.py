"""The one seam between the asyncio engine and the synchronous consumer.

A :class:`Bridge` owns a daemon thread running an event loop (uvloop when importable, see
:func:`wds_async._loop.new_event_loop`), the engine's task inside it, and shutdown. The consumer pulls *lists* of items with
:meth:`Bridge.batches`: it takes them straight from the :class:`~wds_async.engine.channel.SampleChannel` under the
channel's lock, in its own thread, at most ``handoff_max_samples`` items and ``EngineConfig.handoff_bytes``
bytes at a time; the loop thread is only notified (``call_soon_threadsafe``) to release the bytes taken from
the budget, or to wake starved readers, so a busy loop never delays the consumer. Items are samples,
:class:`~wds_async.engine.work.ItemDone` markers and exceptions: errors travel as values in position and are
raised in the consumer's thread by the caller (:func:`~wds_async.data.pipeline.stream_samples`).

Invariants:

* Everything asyncio lives in the loop thread; the consumer only reads the channel and schedules callbacks.
* :meth:`close` is idempotent and safe from any thread: it sets the stop event, on which the loop cancels
  the engine (which closes sockets, files and child processes through their context managers), abandons
  the channel and closes the backends; then it joins the thread, for at most ``_JOIN_TIMEOUT`` seconds (a
  daemon thread that does not stop is logged, not waited on forever). A bridge created in another process
  (a forked DataLoader worker inherited it) is never touched, and ``batches()`` refuses to run there.
* A consumer never blocks forever: it waits in slices of ``_POLL`` seconds and checks the loop thread is
  alive; a dead one is reported as :class:`~wds_async.errors.EngineError` (or the ``MemoryError`` that
  killed it), never as a bare ``RuntimeError`` or an ``ExceptionGroup``.
* What reaches the consumer is one exception of our tree (:mod:`wds_async.engine.failures`): a startup error is
  translated the same way.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from asyncio import TaskGroup
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .._loop import new_event_loop, stopped_if_interrupted
from ..cache.source import source_for
from ..errors import EngineError
from ..io import BackendSet
from ..io.budget import ByteBudget
from ..stats import Stats
from .channel import RoutedChannel, SampleChannel
from .engine import Engine
from .failures import translate
from .feed import ItemFeed
from .spec import StreamSpec
from .work import ItemDone

if TYPE_CHECKING:
    from typing import Self

__all__ = ["Bridge"]

log = logging.getLogger("wds_async")

#: Seconds a consumer waits in one slice before checking that the loop thread is still alive.
_POLL = 0.5
#: Seconds close() waits for the loop thread before giving up on it (it is a daemon thread).
_JOIN_TIMEOUT = 10.0


class Bridge:
    """Runs an :class:`Engine` over ``urls`` in a loop thread and hands its samples to the caller. ``urls`` may be
    an :class:`~wds_async.engine.feed.ItemFeed` that other threads submit items to while the engine runs.
    ``routes`` > 0 gives the engine a :class:`~wds_async.engine.channel.RoutedChannel` with that many routes,
    each taken with ``batches(route)`` (the items then name their route)."""

    def __init__(self, urls: Iterable[str] | ItemFeed, spec: StreamSpec, stats: Stats, *, routes: int = 0) -> None:
        self._urls = urls
        self._routes = routes
        self._spec = spec
        self._config = spec.config
        self._stats = stats
        self._pid = os.getpid()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._channel: SampleChannel | None = None
        self._stop_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._closed = False

    # -- loop thread ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="wds-async-engine", daemon=True)
        with stopped_if_interrupted(self._ready, self.close):  # an interrupt here: not a loop thread left running
            self._thread.start()
            self._ready.wait()
        if self._startup_error is not None:
            raise translate(self._startup_error)

    def _run(self) -> None:
        loop = new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:  # reported to the consumer via _startup_error
            self._startup_error = self._startup_error or exc
            log.debug("wds-async engine loop ended with an error", exc_info=True)
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            except BaseException:  # never let shutdown kill the thread noisily
                log.debug("wds-async engine loop shutdown error", exc_info=True)
            finally:
                try:
                    loop.close()
                except OSError:  # a handle still open; logged so a leak is visible, not fatal to the thread
                    log.warning("wds-async engine loop closed with resources still open", exc_info=True)
                self._ready.set()

    async def _main(self) -> None:
        try:
            self._stop_event = asyncio.Event()
            budget = ByteBudget(self._config.max_buffered_bytes)
            ordered = self._config.deterministic
            channel = (RoutedChannel(budget, ordered=ordered, routes=self._routes) if self._routes else
                       SampleChannel(budget, ordered=ordered))
            spec = self._spec
            backends = BackendSet(self._config, spec.backends, spec.backend_options, engine_capped=True)
            # Routes (a mix's sources) wait for their own consumers: a reader waiting for room gives its token
            # back meanwhile, so that the route the consumer waits on can always read (see Engine.run).
            engine = Engine(self._urls, spec, backends=backends, channel=channel, stats=self._stats,
                            source=source_for(spec.cache, self._config.retry, self._stats),
                            yield_tokens=bool(self._routes))
            self._channel = channel
        except BaseException as exc:
            self._startup_error = exc
            self._ready.set()
            raise
        self._ready.set()
        try:
            async with TaskGroup() as group:
                engine_task = group.create_task(engine.run())
                await self._stop_event.wait()
                engine_task.cancel()
        finally:
            channel.abandon()
            await backends.aclose()

    @property
    def channel(self) -> SampleChannel | None:
        """The engine's channel, once started."""
        return self._channel

    # -- consumer thread -----------------------------------------------------------------------
    def batches(self, route: int | None = None, max_bytes: int | None = None, *,
                hold: bool = False) -> Iterator[list[Any]]:
        """Yield lists of items (samples, or exceptions to raise) until the engine is done; with ``routes``,
        those of ``route`` until it ended. ``max_bytes``: the most bytes in one list (default: the config's
        hand-off size). ``hold``: a list's bytes stay counted in the budget until the consumer asks for the next
        list (or stops), rather than leaving it when the list is taken, so lists held by many consumers (the
        routes of a mix) are bounded by the budget, not beside it.

        Items are taken straight from the channel under its lock; the loop thread is only *notified*
        (bytes released, waiters woken), so a busy loop never delays the consumer.
        """
        if self._channel is None or self._loop is None or self._thread is None:
            raise EngineError("Bridge.batches() before start()")
        channel, stats, thread = self._channel, self._stats, self._thread
        budget = channel.budget
        take = channel.take
        if route is not None:
            if not isinstance(channel, RoutedChannel):
                raise EngineError("Bridge.batches(route) on a bridge started without routes")
            take = functools.partial(channel.take_route, route)
        max_items = self._config.handoff_max_samples
        max_bytes = self._config.handoff_bytes if max_bytes is None else max(1, max_bytes)

        def release(nbytes: int) -> None:
            self._call_soon(budget.release, nbytes)

        def starving() -> None:
            self._call_soon(budget.wake)

        held = [0]  # with hold: the bytes of the list handed over last, released when the next one is asked for

        def keep(nbytes: int) -> None:
            held[0] += nbytes

        give = keep if hold else release
        try:
            while True:
                if held[0]:
                    release(held[0])  # the list handed over last has been used
                    held[0] = 0
                if os.getpid() != self._pid:
                    raise EngineError("a wds-async iterator cannot be used across fork(); create it in the child")
                started = time.perf_counter()
                items, done = take(max_items, max_bytes, _POLL, give, starving)
                if not items and not done and not thread.is_alive():
                    raise self._thread_died()
                stats.wait_seconds += time.perf_counter() - started
                stats.delivered(len(items) - list(map(type, items)).count(ItemDone))  # stamps first_sample_s
                if items:
                    yield items
                if done:
                    return
        finally:
            if held[0] and os.getpid() == self._pid:
                release(held[0])

    def _thread_died(self) -> BaseException:
        """The error for a loop thread that ended without finishing the channel: what killed it when that
        was a MemoryError, else an :class:`EngineError` chained to it."""
        cause = translate(self._startup_error) if self._startup_error is not None else None
        if isinstance(cause, MemoryError):
            return cause
        error = EngineError("the wds-async engine thread stopped unexpectedly")
        error.__cause__ = cause
        return error

    def _call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # closed between the check and the call
                pass

    def close(self) -> None:
        """Stop the engine, release every resource and join the loop thread. Idempotent."""
        if self._closed or os.getpid() != self._pid:
            return
        self._closed = True
        loop, thread = self._loop, self._thread
        if loop is not None and self._stop_event is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._stop_event.set)
            except RuntimeError:  # the loop closed in between
                pass
        if thread is not None and thread is not threading.current_thread():
            thread.join(_JOIN_TIMEOUT)
            if thread.is_alive():
                log.warning("wds-async engine thread did not stop within %.0f s", _JOIN_TIMEOUT)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
