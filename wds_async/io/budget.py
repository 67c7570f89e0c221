"""The engine's byte budget: bytes read from the stores and not yet handed to the consumer.

:class:`ByteBudget`
    Counts bytes read from a source and not yet handed to the consumer: bytes held in tar parsers, in
    partially grouped samples, in the reorder window of a shard read as ranged parts, and in the channel;
    plus *reservations*, the buffer allowance of each open stream (:meth:`ByteBudget.reserve`), which
    readers wait on like data but which are not reported as data (``peak`` counts data only). Readers call
    :meth:`ByteBudget.wait_for_room` before every read. **Invariant:** ``used <= limit + (one chunk per
    reader)``, except that while the consumer is starving (nothing deliverable), exactly one designated
    reader may keep reading (the *overdraft*) so a sample larger than the free budget can complete (up to
    ``EngineConfig.max_sample_bytes``). Without that exception a budget smaller than the partial samples of
    all readers would deadlock. Where the consumer starves on several queues in turn (a mix's routes), the
    overdraft passes to the reader it starves for now, and each route's reader it passed from keeps its partial
    sample: at most one sample over the limit per route. Loop thread only.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

__all__ = ["ByteBudget", "Starving"]


class Starving(Protocol):
    """What the budget asks of the place samples wait in (the engine's channel) before it lets a reader overdraw."""

    def starving_for(self, owner: object) -> bool:
        """True when the consumer waits and ``owner``'s sample is the one it waits for."""
        ...


class ByteBudget:
    """A byte counter with a soft limit that readers wait on (see module docstring for the invariant)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("ByteBudget limit must be >= 1")
        self.limit = limit
        self.used = 0
        self.peak = 0            # the most bytes of data held at once (reservations not included)
        self.reserved = 0        # part of ``used`` that is transport buffer allowances, not data
        self._waiters: list[asyncio.Future[None]] = []
        self._overdraft_holder: object | None = None

    def add(self, n: int) -> None:
        """Account ``n`` more bytes held (negative ``n`` releases)."""
        self.used += n
        if self.used - self.reserved > self.peak:
            self.peak = self.used - self.reserved
        if n < 0:
            self.wake()

    def reserve(self, n: int) -> None:
        """Count ``n`` bytes a source may buffer outside our counters (an open stream's allowance):
        readers wait on them like on data, but they are not reported as buffered data."""
        self.reserved += n
        self.add(n)

    def unreserve(self, n: int) -> None:
        self.reserved -= n
        self.add(-n)

    @property
    def data(self) -> int:
        """Bytes of data held (``used`` less the reservations)."""
        return self.used - self.reserved

    def release(self, n: int) -> None:
        """Bytes left the engine (handed to the consumer or dropped)."""
        self.add(-n)

    def wake(self) -> None:
        """Let every waiter re-check its condition (called on release and when the consumer starves)."""
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def clear_overdraft(self) -> None:
        """Something deliverable exists again: the overdraft exception ends."""
        self._overdraft_holder = None

    def forget(self, owner: object) -> None:
        """``owner`` stopped reading; if it held the overdraft, hand the chance to another reader."""
        if self._overdraft_holder is owner:
            self._overdraft_holder = None
            self.wake()

    async def wait_for_room(self, owner: object, channel: Starving) -> None:
        """Return once ``owner`` may read another chunk."""
        while self.used >= self.limit:
            if channel.starving_for(owner) and self._may_overdraw(owner, channel):
                self._overdraft_holder = owner
                return
            await self.changed()

    def _may_overdraw(self, owner: object, channel: Starving) -> bool:
        """The overdraft is ``owner``'s to take: nobody holds it, ``owner`` does, or its holder is no longer a
        reader the consumer starves for. The last happens where the consumer takes from several queues in turn
        (a mix's routes): it starved on one route, whose reader took the overdraft and then waits for room again,
        and now starves on another. Kept by the first holder until a sample is put, the overdraft would wait
        for a put that no reader can make once every other reader waits for room: the engine hung."""
        holder = self._overdraft_holder
        return holder is None or holder is owner or not channel.starving_for(holder)

    async def changed(self) -> None:
        """Wait for the next :meth:`wake` (a release, or the consumer starving): callers re-check their
        own condition in a loop."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        finally:
            if not fut.done():
                fut.cancel()

    def statistics(self) -> dict[str, int]:
        return {"used": self.used, "reserved": self.reserved, "limit": self.limit, "peak": self.peak,
                "waiting": len(self._waiters)}
