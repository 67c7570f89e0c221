"""Batches of work items in, their samples out, on one long-lived engine: what a map-style dataset reads through.

:class:`Requests` is a :class:`~wds_async.engine.bridge.Bridge` over an :class:`~wds_async.engine.feed.ItemFeed`:
:meth:`Requests.fetch` submits a batch of items and returns their samples by item id once every item's
:class:`~wds_async.engine.work.ItemDone` arrived. Calls are serialized (one batch at a time per object). An error
raised by an item (the default handler raises: ``ObjectChanged``, ``NotFound``, a format error) ends the channel as
it ends a stream; the object then closes its bridge and raises the error, and the next :meth:`~Requests.fetch`
starts a fresh bridge. Use one per process: the bridge's loop thread does not survive ``fork`` and a forked copy
refuses to run (the owner rebuilds one when its pid changed).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import EngineError
from ..stats import Stats
from .bridge import Bridge
from .feed import ItemFeed
from .grouping import Sample
from .spec import StreamSpec
from .work import ItemDone, WorkItem

__all__ = ["Requests"]


class Requests:
    """Batches of work items in, their samples out, on one long-lived engine (see the module docstring)."""

    def __init__(self, spec: StreamSpec, stats: Stats | None = None) -> None:
        self.spec = spec
        self.stats = stats if stats is not None else Stats()
        self._bridge: Bridge | None = None
        self._feed: ItemFeed | None = None
        self._batches: Iterator[list[Any]] | None = None
        self._lock = threading.Lock()

    def _start(self) -> None:
        feed = ItemFeed()
        bridge = Bridge(feed, self.spec, self.stats)
        bridge.start()
        self._feed, self._bridge, self._batches = feed, bridge, bridge.batches()

    def fetch(self, items: Sequence[WorkItem]) -> dict[int, list[Sample]]:
        """Read ``items`` (ids unique among the items in flight) and return each one's samples, in the order
        the item delivered them, by item id. An error of any item is raised here (the others are dropped)."""
        wanted = {item.id for item in items}
        if len(wanted) != len(items):
            raise ValueError("work items of one fetch need distinct ids")
        found: dict[int, list[Sample]] = {item.id: [] for item in items}
        if not items:
            return found
        with self._lock:
            if self._bridge is None:
                self._start()
            assert self._feed is not None and self._batches is not None
            self._feed.submit(items)
            try:
                while wanted:
                    batch = next(self._batches, None)
                    if batch is None:
                        raise EngineError("the engine ended while a batch of reads was in flight")
                    for got in batch:
                        kind = type(got)
                        if kind is Sample:
                            found[got.item].append(got)
                        elif kind is ItemDone:
                            wanted.discard(got.id)
                        elif isinstance(got, BaseException):
                            raise got
            except BaseException:
                self._close_locked()  # the channel ended (or the caller gave up): the next fetch starts afresh
                raise
        return found

    def _close_locked(self) -> None:
        bridge, batches, feed = self._bridge, self._batches, self._feed
        self._bridge = self._batches = self._feed = None
        if feed is not None:
            feed.close()
        close = getattr(batches, "close", None)  # a generator: closed so that it ends here, not at collection
        if close is not None:
            close()
        if bridge is not None:
            bridge.close()

    def close(self) -> None:
        """Stop the engine and its loop thread. Idempotent; ``fetch`` afterwards starts a new one."""
        with self._lock:
            self._close_locked()
