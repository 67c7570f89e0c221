"""The shard cache as an :class:`~wds_async.io.source.ItemSource` wrapped around the store's backends.

The engine reads every item through its source and has no idea a cache exists. For an item of a cacheable URL
(see :meth:`ShardCache.cacheable`) this source opens, through :meth:`ShardCache.open_item`:

* a complete, still current copy (:class:`~wds_async.cache.items.CacheHit`): the item is read through the
  copy's backend, which reports the store's identity; a format error met in it makes the engine call
  ``discard``, which forgets the copy (quietly keeping it where the directory is read-only), and read the rest
  from the store;
* a fill (:class:`~wds_async.cache.items.CacheFill`, only for a whole object): the item is read from the store
  and every chunk is written to the copy as it passes (``on_chunk``); the copy is committed by ``done`` once the
  whole object was read and parsed, and removed on any other way out;
* otherwise the store alone, as :class:`~wds_async.io.source.StoreSource` would.

Identity checks of copies run ahead of their items (:class:`~wds_async.cache.items.Prechecks`), in the engine's
TaskGroup, when the engine announces the items it will hand out next (:meth:`CachingSource.ahead`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from ..config import RetryPolicy
from ..io.backend import Backend, ObjectIdentity
from ..io.source import OpenedItem
from ..stats import Stats
from .disk import ShardCache
from .items import FILL_WRITE_BYTES, CacheFill, CacheHit, Prechecks

__all__ = ["PRECHECK_AHEAD", "CachingSource", "source_for"]

#: How many items ahead of the readers the copies' identity checks start.
PRECHECK_AHEAD = 32


class CachingSource:
    """Items through ``cache`` (see the module docstring); ``policy`` and ``stats`` are the engine's."""

    def __init__(self, cache: ShardCache, policy: RetryPolicy, stats: Stats | None) -> None:
        self.cache, self.policy, self.stats = cache, policy, stats
        self._prechecks: Prechecks | None = None
        self.lookahead = PRECHECK_AHEAD if cache.validate else 0

    def __repr__(self) -> str:
        return f"CachingSource({self.cache!r})"

    def start(self, group: object) -> None:
        if self.cache.validate:
            self._prechecks = Prechecks(self.cache, self.policy, self.stats, group)

    def ahead(self, url: str, backend: Backend) -> None:
        if self._prechecks is not None:
            self._prechecks.ahead(url, backend)

    def close(self) -> None:
        if self._prechecks is not None:
            self._prechecks.close()

    @contextlib.asynccontextmanager
    async def open(self, url: str, *, whole: bool, backend: Backend) -> AsyncIterator[OpenedItem]:
        if not self.cache.cacheable(url):
            yield OpenedItem(backend)
            return
        found = await self.cache.open_item(url, whole=whole, backend=backend, policy=self.policy, stats=self.stats,
                                           prechecks=self._prechecks)
        if found is None:
            yield OpenedItem(backend)
        elif isinstance(found, CacheHit):
            try:
                yield OpenedItem(found.backend, local=True, discard=self._discard)
            finally:
                found.close()
        else:
            try:
                yield OpenedItem(backend, on_chunk=found.write, reserve=FILL_WRITE_BYTES,
                                 done=lambda identity: self._commit(found, identity))
            finally:
                await found.close()

    async def _commit(self, fill: CacheFill, identity: ObjectIdentity | None) -> None:
        await fill.commit(identity, self.stats)

    async def _discard(self, url: str) -> None:
        await asyncio.to_thread(self.cache.drop, url)


def source_for(cache: ShardCache | None, policy: RetryPolicy, stats: Stats | None) -> CachingSource | None:
    """The engine's item source for ``cache`` (None: no cache, the engine reads the store)."""
    return None if cache is None else CachingSource(cache, policy, stats)
