"""Where the engine gets the bytes of one work item: the store, or something wrapped around it.

The engine reads every item through an :class:`ItemSource` and never asks what is behind it. The plain source,
:class:`StoreSource`, reads the store through the item's backend and does nothing else. The shard cache
(:class:`wds_async.cache.source.CachingSource`) wraps the same backends, as fsspec's caching filesystems wrap a
filesystem: it may answer with a local copy's backend instead, and it may watch the bytes go by to keep a copy.

For each item the engine enters ``source.open(url, whole=..., backend=...)`` and reads what it yields, an
:class:`OpenedItem`:

* ``backend``: read the item through this one (the store's, or one that reads a local copy of the object and
  reports the store's identity, so identity checks still hold);
* ``on_chunk(chunk, size)``: awaited with every chunk, in order, before it is parsed (``size``: the object's
  size as the store announced it, or None);
* ``reserve``: bytes the engine counts in its byte budget while the item is open (buffers the source holds);
* ``done(identity)``: awaited once the whole item was read and parsed without error;
* ``local``: the bytes come from a local copy, so a format error may be the copy's own damage: the engine
  calls ``discard()`` (the source forgets that copy) and reads the rest of the item from the store once.

:meth:`ItemSource.ahead` is called for items about to be handed out, so a source can start work that would
otherwise cost a round trip on the item's path (the cache's identity checks); :meth:`ItemSource.start` gives it
the engine's TaskGroup for such tasks and :meth:`ItemSource.close` ends them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from .backend import Backend, ObjectIdentity

__all__ = ["ItemSource", "OpenedItem", "StoreSource"]


async def _nothing(identity: ObjectIdentity | None) -> None:
    return None


async def _keep(url: str) -> None:
    return None


@dataclass
class OpenedItem:
    """One item's bytes, open (see the module docstring)."""

    backend: Backend
    on_chunk: Callable[[bytes, int | None], Awaitable[None]] | None = None
    reserve: int = 0
    done: Callable[[ObjectIdentity | None], Awaitable[None]] = _nothing
    local: bool = False
    discard: Callable[[str], Awaitable[None]] = _keep


class ItemSource(Protocol):
    """What the engine reads work items through (see the module docstring)."""

    #: How many items ahead of the readers :meth:`ahead` wants to hear of (0: none).
    lookahead: int

    def start(self, group: object) -> None:
        """Tasks started ahead of items go into ``group`` (the engine's TaskGroup) from now on."""

    def ahead(self, url: str, backend: Backend) -> None:
        """An item of ``url`` will be opened soon."""

    def open(self, url: str, *, whole: bool, backend: Backend) -> AbstractAsyncContextManager[OpenedItem]:
        """The bytes of an item of ``url`` (``whole``: the item is the whole object, from byte 0 to its end)."""
        ...

    def close(self) -> None:
        """Cancel whatever :meth:`ahead` started for items that never came."""


class StoreSource:
    """Every item straight from the store, through its own backend."""

    lookahead = 0

    def start(self, group: object) -> None:
        return None

    def ahead(self, url: str, backend: Backend) -> None:
        return None

    def open(self, url: str, *, whole: bool, backend: Backend) -> AbstractAsyncContextManager[OpenedItem]:
        # Nothing to set up or tear down, so no asynccontextmanager generator: one is entered per item, and a
        # random-access read is an item per sample
        return contextlib.nullcontext(OpenedItem(backend))

    def close(self) -> None:
        return None
