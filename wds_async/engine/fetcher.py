"""Batches of work items in, their samples out, on one long-lived engine: what a map-style dataset reads through.

:class:`Requests` is a :class:`~wds_async.engine.bridge.Bridge` over an :class:`~wds_async.engine.feed.ItemFeed`:
:meth:`Requests.fetch` submits a batch of items and returns their samples by item id once every item's
:class:`~wds_async.engine.work.ItemDone` arrived. Calls are serialized (one batch at a time per object). An error
raised by an item (the default handler raises: ``ObjectChanged``, ``NotFound``, a format error) ends the channel as
it ends a stream; the object then closes its bridge and raises the error, and the next :meth:`~Requests.fetch`
starts a fresh bridge. Use one per process: the bridge's loop thread does not survive ``fork`` and a forked copy
refuses to run (the owner rebuilds one when its pid changed). An object dropped without :meth:`~Requests.close`
(a dataset that went out of scope) stops its engine when it is garbage collected: the loop thread, its sockets
and its buffered bytes do not outlive it.

Reading ahead: :meth:`Requests.submit` starts items now and :meth:`Requests.collect` returns them later, so a
caller that knows its next batches keeps them in flight while it uses the current one; samples of items it did not
ask for yet are kept (by item id) until it does, and :meth:`Requests.discard` drops items it no longer wants.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
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
        self._found: dict[int, list[Sample]] = {}  # item id -> its samples so far, for every item in flight
        self._ended: set[int] = set()  # items in flight whose ItemDone arrived
        self._stop: weakref.finalize[Any, Any] | None = None  # stops the running bridge, at close() or collection

    def _start(self) -> None:
        feed = ItemFeed()
        bridge = Bridge(feed, self.spec, self.stats)
        bridge.start()
        self._feed, self._bridge, self._batches = feed, bridge, bridge.batches()
        # The bridge's thread holds the bridge, not this object, so a Requests that is dropped unclosed would leave
        # an idle loop thread (and its connection pool) for the rest of the process.
        self._stop = weakref.finalize(self, _stop_bridge, os.getpid(), feed, self._batches, bridge)
        self._stop.atexit = False  # at exit the daemon thread ends with the process

    def fetch(self, items: Sequence[WorkItem]) -> dict[int, list[Sample]]:
        """Read ``items`` (ids unique among the items in flight) and return each one's samples, in the order
        the item delivered them, by item id. An error of any item is raised here (the others are dropped)."""
        with self._lock:
            self._submit_locked(items)
            return self._collect_locked([item.id for item in items])

    def submit(self, items: Sequence[WorkItem]) -> None:
        """Start reading ``items`` now (ids unique among the items in flight); :meth:`collect` returns them."""
        with self._lock:
            self._submit_locked(items)

    def collect(self, ids: Sequence[int]) -> dict[int, list[Sample]]:
        """The samples of the submitted items ``ids``, by id, once each one ended; samples of other submitted items
        that arrive meanwhile are kept for their own :meth:`collect`. An error of any item in flight is raised here
        and ends every read in flight (the next call starts a fresh engine)."""
        with self._lock:
            return self._collect_locked(ids)

    def discard(self, ids: Iterable[int]) -> None:
        """Forget submitted items: what they delivered or will deliver is dropped."""
        with self._lock:
            for item_id in ids:
                self._found.pop(item_id, None)
                self._ended.discard(item_id)

    def _submit_locked(self, items: Sequence[WorkItem]) -> None:
        ids = {item.id for item in items}
        if len(ids) != len(items) or not ids.isdisjoint(self._found):
            raise ValueError("work items in flight need distinct ids")
        if not items:
            return
        if self._bridge is None:
            self._start()
        assert self._feed is not None
        for item_id in ids:
            self._found[item_id] = []
        self._feed.submit(items)

    def _collect_locked(self, ids: Sequence[int]) -> dict[int, list[Sample]]:
        found, ended = self._found, self._ended
        unknown = [item_id for item_id in ids if item_id not in found]
        if unknown:
            raise ValueError(f"items {unknown[:5]} were not submitted (or were discarded)")
        try:
            while not ended.issuperset(ids):
                assert self._batches is not None
                batch = next(self._batches, None)
                if batch is None:
                    raise EngineError("the engine ended while a batch of reads was in flight")
                for got in batch:
                    kind = type(got)
                    if kind is Sample:
                        samples = found.get(got.item)
                        if samples is not None:  # else: a discarded item's
                            samples.append(got)
                    elif kind is ItemDone:
                        if got.id in found:
                            ended.add(got.id)
                    elif isinstance(got, BaseException):
                        raise got
        except BaseException:
            self._close_locked()  # the channel ended (or the caller gave up): the next fetch starts afresh
            raise
        ended.difference_update(ids)
        return {item_id: found.pop(item_id) for item_id in ids}

    def _close_locked(self) -> None:
        stop, self._stop = self._stop, None
        self._bridge = self._batches = self._feed = None
        self._found.clear()
        self._ended.clear()
        if stop is not None:
            stop()  # runs once: a later collection of this object does nothing

    def close(self) -> None:
        """Stop the engine and its loop thread. Idempotent; ``fetch`` afterwards starts a new one."""
        with self._lock:
            self._close_locked()


def _stop_bridge(pid: int, feed: ItemFeed, batches: Iterator[list[Any]], bridge: Bridge) -> None:
    """Close a :class:`Requests`' engine: its feed, its hand-off generator (so that it ends here, not at its own
    collection) and its bridge. Nothing in a forked child, where the loop thread is the parent's."""
    if os.getpid() != pid:
        return
    feed.close()
    close = getattr(batches, "close", None)
    if close is not None:
        close()
    bridge.close()
