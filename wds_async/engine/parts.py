"""One large object read as concurrent ranged parts, delivered in order.

:class:`PartedRead` yields the bytes ``[start, end)`` of one object exactly as a single
:class:`~wds_async.io.reader.RangeReader` would, but once the first answer shows the object is larger than
``part_bytes`` it fetches what follows as ranged parts in parallel:

* The first request is the ordinary one (no ``end``, so a small object costs exactly what it did). Its
  answer gives the size; when more than ``part_bytes`` remains, the first request is read up to
  ``start + part_bytes`` and dropped (the connection closes), and the rest is split into parts of
  ``part_bytes``.
* A *helper* task per part, at most ``window`` parts ahead of the one being parsed, waits for a token
  of the engine's :class:`~wds_async.engine.limiter.Limiter` (so parts count against the concurrency like any
  request), then streams its part into a small queue of chunks. Every buffered byte is counted in the
  engine's :class:`~wds_async.io.budget.ByteBudget`: a part ahead of the parser waits while the budget is
  full, so a slow consumer stops the downloads and memory stays bounded (this queue is the reorder
  window). The part being parsed waits like any reader, overdraft rule included, so a full budget can
  never block the bytes the consumer is waiting for.
* The parser side takes the parts in order. A part whose helper has not got a token yet is taken over:
  the helper is cancelled and the part read directly, with the token the item already holds. So the
  item never waits on tokens it cannot get, whatever the concurrency.
* Each part is a :class:`RangeReader` of its own: retried and resumed at its own offset, and pinned
  to the identity (size, ETag, generation) of the first answer, so that parts of two versions of an
  object are never spliced (:class:`~wds_async.errors.ObjectChanged`). Every answer carries the
  version it came from, which makes this check as strong as ``If-Match`` for what is delivered; the
  only cost of not sending ``If-Match`` is that the bytes of a changed object are downloaded before
  the mismatch is seen.

``pipe:`` sources cannot be read by range and are always read in one stream (``ranged_reads = False``
on the backend); neither is an http object whose server neither answered 206 nor announced
``Accept-Ranges: bytes``, since every part would then download the object from its start. A ``.tar.gz`` is split like any object: the parts are compressed bytes, inflated in
order by the one parser.

The owner runs :meth:`chunks` inside a TaskGroup it passes in (none for a read that can never split: a known range
of at most ``part_bytes``), and must call :meth:`close` when it stops reading, which cancels the helpers and gives
their buffered bytes back to the budget.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from ..io.backend import Backend, ObjectIdentity, capabilities_of
from ..io.budget import ByteBudget
from ..io.reader import RangeReader, ReadContext
from ..stats import Stats
from .channel import SampleChannel
from .limiter import Limiter

__all__ = ["PartedRead"]

MAX_WINDOW = 64


@dataclass(eq=False)
class _Part:
    start: int
    end: int
    chunks: collections.deque[bytes] = field(default_factory=collections.deque)
    buffered: int = 0               # bytes in ``chunks``, counted in the budget
    started: bool = False           # the helper holds a token and has begun
    done: bool = False
    error: BaseException | None = None
    task: asyncio.Task[None] | None = None
    arrived: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class Lanes:
    """What the parts of one item share with the engine reading it: the limiter whose tokens helpers take, the
    channel whose consumer they feed, the reader's owner token (its place in the channel and the budget), the
    part size, and the item's TaskGroup that owns the helpers (None for a read that is never split: a known range
    of at most ``part_bytes``, or ``part_bytes`` 0)."""

    limiter: Limiter
    channel: SampleChannel
    owner: object
    part_bytes: int
    group: Any


class PartedRead:
    """``[start, end)`` of ``url``, in order, from concurrent ranged parts (see the module docstring).
    ``context`` must carry the engine's stats and byte budget."""

    def __init__(self, backend: Backend, url: str, *, start: int, end: int | None, expect: ObjectIdentity | None,
                 context: ReadContext, lanes: Lanes) -> None:
        if context.stats is None or context.budget is None:
            raise ValueError("a PartedRead needs the engine's stats and byte budget in its ReadContext")
        self.backend = backend
        self.url = url
        self.start, self.end = start, end
        self.context, self.expect = context, expect
        self.stats: Stats = context.stats
        self.budget: ByteBudget = context.budget
        self.limiter, self.channel, self.owner = lanes.limiter, lanes.channel, lanes.owner
        self.part_bytes = part_bytes = lanes.part_bytes
        self.group = lanes.group
        self.first = RangeReader(backend, url, start=start, end=end, expect=expect, context=context)
        self.shown = self.first.shown
        self._parts: list[_Part] = []
        self._current = -1            # index of the part being parsed (-1: the first request)
        self._launched = 0            # helpers created so far
        self.window = max(1, min(MAX_WINDOW, self.budget.limit // max(1, part_bytes)))

    @property
    def pos(self) -> int:
        return self.first.pos

    # -- the parser side -------------------------------------------------------------------------
    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """The range's bytes in order."""
        cut: int | None = None
        async with aclosing(self.first.chunks()) as first:
            async for chunk in first:
                if cut is None and not self._parts:
                    cut = self._plan()
                if cut is not None and self.first.pos >= cut:
                    over = self.first.pos - cut
                    if len(chunk) > over:
                        yield chunk[:len(chunk) - over] if over else chunk
                    break
                yield chunk
        for index, part in enumerate(self._parts):
            self._current = index
            self._launch()
            self.budget.wake()  # a helper waiting for room may now be the current part
            async for chunk in self._take(part):
                yield chunk

    def _plan(self) -> int | None:
        """After the first answer: split the rest into parts when it is large enough."""
        identity = self.first.identity
        stop = self.end if self.end is not None else (identity.size if identity is not None else None)
        if (not self.part_bytes or stop is None or not capabilities_of(self.backend).ranged_reads
                or stop - self.start <= self.part_bytes or self._ranges_ignored()):
            return None  # small, unsized, or from a server that ignores Range (each part would start at 0)
        cut = self.start + self.part_bytes
        self.expect = identity
        self._parts = [_Part(a, min(a + self.part_bytes, stop)) for a in range(cut, stop, self.part_bytes)]
        self._launch()
        return cut

    def _ranges_ignored(self) -> bool:
        """A plain http server whose first answer neither was a 206 nor announced ``Accept-Ranges: bytes``
        (cloud stores serve ranges on every object, ``ranges_guaranteed``)."""
        if capabilities_of(self.backend).ranges_guaranteed:
            return False
        return (self.first.info or {}).get("accept_ranges") is False

    def _launch(self) -> None:
        """Start helpers for the parts within the window ahead of the one being parsed."""
        limit = min(len(self._parts), self._current + 1 + self.window)
        while self._launched < limit:
            part = self._parts[self._launched]
            if self.group is None:
                raise RuntimeError("a PartedRead that splits into parts needs a TaskGroup in its Lanes")
            part.task = self.group.create_task(self._fetch(part))
            self._launched += 1

    async def _take(self, part: _Part) -> AsyncGenerator[bytes, None]:
        if not part.started:  # no token yet: read it ourselves rather than wait for one
            if part.task is not None:
                part.task.cancel()
            reader = self._reader(part)
            async with aclosing(reader.chunks()) as chunks:
                async for chunk in chunks:
                    yield chunk
            return
        while True:
            if part.chunks:
                chunk = part.chunks.popleft()
                part.buffered -= len(chunk)
                self.budget.release(len(chunk))  # the parser accounts for it from here
                yield chunk
                continue
            if part.error is not None:
                raise part.error
            if part.done:
                return
            part.arrived.clear()
            await part.arrived.wait()

    # -- the helpers -------------------------------------------------------------------------------
    def _reader(self, part: _Part) -> RangeReader:
        return RangeReader(self.backend, self.url, start=part.start, end=part.end, expect=self.expect,
                           context=self.context, what="the first request for this shard")

    async def _room(self, part: _Part) -> None:
        """Wait until ``part`` may read another chunk: strictly below the budget when it is ahead of the
        parser, like any reader (overdraft included) when it is the part being parsed."""
        while self.budget.used >= self.budget.limit:
            if self._current >= 0 and part is self._parts[self._current]:
                await self.budget.wait_for_room(self.owner, self.channel)
                return
            await self.budget.changed()

    async def _fetch(self, part: _Part) -> None:
        await self.limiter.acquire()
        part.started = True
        self.stats.parts += 1
        try:
            reader = self._reader(part)
            async with aclosing(reader.chunks()) as chunks:
                iterator = chunks.__aiter__()
                while True:
                    await self._room(part)
                    try:
                        chunk = await iterator.__anext__()
                    except StopAsyncIteration:
                        break
                    part.chunks.append(chunk)
                    part.buffered += len(chunk)
                    self.budget.add(len(chunk))
                    part.arrived.set()
            part.done = True
        except Exception as exc:  # raised by the parser side when it reaches this part
            part.error = exc
        finally:
            self.limiter.release()
            part.arrived.set()

    def close(self) -> None:
        """Cancel every helper and give the bytes they buffered back to the budget."""
        for part in self._parts:
            if part.task is not None and not part.task.done():
                part.task.cancel()
            if part.buffered:
                self.budget.release(part.buffered)
                part.buffered = 0
                part.chunks.clear()
