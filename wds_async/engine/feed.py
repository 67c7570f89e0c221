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

Windows per route
    A feed made with ``windows`` (a mix's shared engine: ``windows(route)`` is how many of a route's items may
    be read at once) holds each routed item back until its route has fewer than that many items being read.
    The engine tells the feed when a routed read ends (:meth:`~ItemFeed.ended`), in the loop thread, and the
    route's next item is released at once. So a route's consumer may submit items ahead of its window, and a
    read that ends between two of its consumer's visits is followed by the next without waiting for it. Items
    without a route, or a feed without ``windows``, are handed out in submission order as they come.

See :class:`~wds_async.engine.fetcher.Requests` for the consumer side.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from collections.abc import Callable, Sequence

from ..errors import EngineError
from .work import WorkItem

__all__ = ["ItemFeed"]


class ItemFeed:
    """Work items submitted from any thread, taken by the engine's readers in the loop thread."""

    def __init__(self, windows: Callable[[int], int] | None = None) -> None:
        #: Submitted, not yet looked at by the loop (any thread appends, the loop pops).
        self._submitted: collections.deque[WorkItem] = collections.deque()
        #: Released to the engine's readers, in order (loop thread only).
        self._items: collections.deque[WorkItem] = collections.deque()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Readers waiting for an item, oldest first; a submit wakes as many as it brings items (not all of them).
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._windows = windows
        #: Per route (windows only): items held back, and items released whose read has not ended.
        self._held: dict[int, collections.deque[WorkItem]] = {}
        self._reading: collections.Counter[int] = collections.Counter()

    # -- any thread ---------------------------------------------------------------------------------
    def submit(self, items: Sequence[WorkItem]) -> None:
        """Queue ``items`` (in this order) for the engine."""
        if self._closed:
            raise EngineError("submit() on a closed item feed")
        self._submitted.extend(items)
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
    def _intake(self) -> None:
        """Move submitted items to the released queue, or hold them back behind their route's window."""
        submitted, windows = self._submitted, self._windows
        while submitted:
            item = submitted.popleft()
            if windows is None or item.route is None:
                self._items.append(item)
            else:
                self._held.setdefault(item.route, collections.deque()).append(item)
                self._release(item.route)

    def _release(self, route: int) -> None:
        held = self._held.get(route)
        if not held:
            return
        assert self._windows is not None
        window = self._windows(route)
        while held and self._reading[route] < window:
            self._reading[route] += 1
            self._items.append(held.popleft())

    def ended(self, item: WorkItem) -> None:
        """The read of ``item`` (taken from this feed) ended: its route's next held item may start."""
        if self._windows is None or item.route is None:
            return
        self._reading[item.route] -= 1
        self._release(item.route)
        self._notify()

    def _notify(self) -> None:
        """Wake one waiting reader per queued item (every reader once the feed is closed)."""
        self._intake()
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
            self._intake()
            if not self._items:  # windows grow with the concurrency: held items may fit now
                for route in self._held:
                    self._release(route)
            if self._items:
                return self._items.popleft()
            if self._closed and not any(self._held.values()):
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
        """The next ``n`` items queued, not taken (released ones first, then those submitted since)."""
        return list(itertools.islice(itertools.chain(self._items, self._submitted), n))
