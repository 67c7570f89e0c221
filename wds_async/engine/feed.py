"""Work that arrives while the engine runs: the item feed.

An :class:`~wds_async.engine.engine.Engine` normally reads a list (or lazy iterator) of items that exists
before it starts. A map-style dataset instead learns what to read one ``__getitems__`` call at a time, on a
long-lived engine that must wait for the next call rather than end.

:class:`ItemFeed`
    Given to the engine in place of its item list. Any thread may :meth:`~ItemFeed.submit` items and
    :meth:`~ItemFeed.close` the feed; the engine's readers :meth:`~ItemFeed.get` them in the loop thread,
    waiting while the feed is empty and open. A submit appends to a deque (thread-safe) and then wakes the
    loop with ``call_soon_threadsafe``; the loop side binds itself (:meth:`~ItemFeed.bind`) before it first
    looks at the deque, so an item submitted before the loop bound is seen by that look and never lost.
    ``peek(n)`` shows the engine the next items so the shard cache's identity checks start early, as the
    engine's lookahead does for an item list.

See :class:`~wds_async.engine.fetcher.Requests` for the consumer side.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence

from ..errors import EngineError
from .work import WorkItem

__all__ = ["ItemFeed"]


class ItemFeed:
    """Work items submitted from any thread, taken by the engine's readers in the loop thread."""

    def __init__(self) -> None:
        self._items: collections.deque[WorkItem] = collections.deque()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Readers waiting for an item, oldest first; a submit wakes as many as it brings items (not all of them).
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    # -- any thread ---------------------------------------------------------------------------------
    def submit(self, items: Sequence[WorkItem]) -> None:
        """Queue ``items`` (in this order) for the engine."""
        if self._closed:
            raise EngineError("submit() on a closed item feed")
        self._items.extend(items)
        self._wake()

    def close(self) -> None:
        """No more items: readers return once the queued ones are taken, and the engine finishes."""
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return  # not bound yet: the loop looks at the deque after binding
        try:
            loop.call_soon_threadsafe(self._notify)
        except RuntimeError:  # the loop closed in between
            pass

    # -- loop thread --------------------------------------------------------------------------------
    def _notify(self) -> None:
        """Wake one waiting reader per queued item (every reader once the feed is closed)."""
        wake = len(self._waiters) if self._closed else min(len(self._items), len(self._waiters))
        for _ in range(wake):
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def bind(self) -> None:
        """Called by the engine in its loop before it takes items."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()

    async def get(self) -> WorkItem | None:
        """The next item, waiting while the feed is empty and open; None once it is closed and drained.
        A reader that is woken but finds the item taken (by a reader that did not have to wait) waits again."""
        self.bind()
        loop = self._loop
        assert loop is not None
        while True:
            if self._items:
                return self._items.popleft()
            if self._closed:
                return None
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                raise

    def peek(self, n: int) -> list[WorkItem]:
        """The next ``n`` items queued, not taken."""
        return [item for _, item in zip(range(n), self._items)]
