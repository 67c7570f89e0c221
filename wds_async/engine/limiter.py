"""Requests in flight as tokens whose total can change while the engine runs.

The model is anyio's ``CapacityLimiter``: ``total`` tokens, ``borrowed`` of them taken; a task that finds
none free waits, first come first served. Changing :attr:`Limiter.total` takes effect at once:

* raising it hands the new tokens to waiters right away;
* lowering it takes nothing back from the tasks that hold one (a request is not cut mid-stream); the
  tokens they return are simply not handed on until ``borrowed`` is below the new total.

The engine takes a token for every request it keeps open (a whole shard, or one ranged part of a large
one), so ``total`` is the concurrency the autotuner (or a fixed ``max_connections``) asks for. Single
event loop; not thread-safe, like everything else in the loop thread.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from types import TracebackType

__all__ = ["Limiter"]


class Limiter:
    """``total`` tokens shared by the engine's requests (see the module docstring)."""

    def __init__(self, total: int) -> None:
        self._total = self._check(total)
        self.borrowed = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @staticmethod
    def _check(total: int) -> int:
        if not isinstance(total, int) or isinstance(total, bool) or total < 1:
            raise ValueError(f"a limiter needs a positive int total, got {total!r}")
        return total

    @property
    def total(self) -> int:
        return self._total

    @total.setter
    def total(self, value: int) -> None:
        self._total = self._check(value)
        self._hand_on()

    @property
    def waiting(self) -> int:
        """Tasks waiting for a token: work that more concurrency would start now."""
        return sum(1 for fut in self._waiters if not fut.done())

    def _queued(self) -> bool:
        """Whether a task waits for a token: asked once per request, so it stops at the first live waiter where
        :attr:`waiting` counts the whole queue (64 futures with a random-access batch queued). The only done futures
        in the queue are cancelled ones (a token is handed over as its future leaves the queue), so those at its
        head go."""
        waiters = self._waiters
        while waiters and waiters[0].done():
            waiters.popleft()
        return bool(waiters) and any(not fut.done() for fut in waiters)

    def try_acquire(self) -> bool:
        """Take a token if one is free and nobody is queued before us."""
        if self.borrowed < self._total and not self._queued():
            self.borrowed += 1
            return True
        return False

    async def acquire(self) -> None:
        """Wait for a token (FIFO). Cancelled while waiting, it takes none; cancelled just after one was
        handed over, it gives that one back."""
        if self.try_acquire():
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            self._forsake(fut)
            raise

    async def acquire_unless(self, stop: Callable[[], bool], every: float, *, first: bool = False) -> bool:
        """Wait for a token as :meth:`acquire` does, asking ``stop()`` every ``every`` seconds: True once a
        token was taken; False, without one, when ``stop()`` said True first. ``first``: queue at the front
        (work already started, which must not wait behind new work)."""
        if self.borrowed < self._total and (first or not self._queued()):
            self.borrowed += 1
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if first:
            self._waiters.appendleft(fut)
        else:
            self._waiters.append(fut)
        try:
            while True:
                done, _ = await asyncio.wait({fut}, timeout=every)  # a future, not a task: nothing to own
                if done:
                    return True
                if stop():
                    fut.cancel()
                    return False
        except asyncio.CancelledError:
            self._forsake(fut)
            raise

    def _forsake(self, fut: asyncio.Future[None]) -> None:
        """A waiter cancelled: it takes no token, and gives back one handed over as it was cancelled."""
        if fut.done() and not fut.cancelled():
            self.release()
        else:
            fut.cancel()

    def overdraw(self) -> None:
        """Take a token beyond ``total`` (see tokens.py); given back with :meth:`release`."""
        self.borrowed += 1

    def release(self) -> None:
        if self.borrowed <= 0:
            raise RuntimeError("Limiter.release() without a token")
        self.borrowed -= 1
        self._hand_on()

    def _hand_on(self) -> None:
        while self._waiters and self.borrowed < self._total:
            fut = self._waiters.popleft()
            if not fut.done():
                self.borrowed += 1
                fut.set_result(None)

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.release()
