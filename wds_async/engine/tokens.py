"""What a reader does with its concurrency token while it cannot read.

Every open request holds a token of the engine's :class:`~wds_async.engine.limiter.Limiter`. A reader can be
held up twice with one in hand: waiting for room in the byte budget, and before the retry of a throttled
request (429/503). Three rules keep those waits from costing throughput or hanging the engine:

* **Room.** With ``yield_tokens`` (a mix's routes, the node service's sessions) a reader that must wait for room
  gives its token back meanwhile, so readers stalled by their own consumer never hold tokens that another route
  or session could use. A single dataset's readers keep theirs: each token there stands for an item in the
  shard-list order, and giving it away would only start more items behind a full budget.
* **Throttled retries** keep their token unless the limit was lowered below the tokens taken; then they give it
  back and queue for one, so a retry never exceeds the lowered limit. (Giving it back on every 503 let a new item
  start each time: against a store that answers 503 above 24 requests, 72 of 96 items of 16 MiB were open at once,
  the budget full of the later ones' bytes, and the engine hung.)
* **Queueing again** (after either) goes ahead of readers waiting to start new items: an item already open is
  nearer the consumer than any item not started. And the item the consumer starves for takes a token over the
  limit rather than wait at all, as the byte budget lets that item overdraw it: readers waiting for room may hold
  every token, and they wait for the consumer, which waits for that item.
* **The first token** of a mix's item (:meth:`Tokens.first`) is queued for in submission order, and taken over
  the limit as soon as the consumer starves for that item. Tokens can be held while their holders wait on the
  consumer (the helpers reading a large shard's ranged parts ahead of its parser keep theirs while they wait for
  room); a mix whose consumer waited for a source's next item, queued behind them, hung for good (one token, five
  sources, ranged parts).
"""

from __future__ import annotations

import functools

from ..io.budget import ByteBudget
from .channel import SampleChannel
from .limiter import Limiter

__all__ = ["REQUEUE_CHECK", "Tokens"]

#: Seconds between a queued reader's looks at whether the consumer starves for its item.
REQUEUE_CHECK = 0.05


class Tokens:
    """The rules of the module docstring for the readers of one engine (``limiter``, ``channel``)."""

    def __init__(self, limiter: Limiter, channel: SampleChannel, *, yield_tokens: bool) -> None:
        self.limiter = limiter
        self.channel = channel
        self.budget: ByteBudget = channel.budget
        self.yield_tokens = yield_tokens

    async def wait_for_room(self, token: object) -> None:
        """Wait until the reader of ``token`` may read another chunk."""
        budget, channel = self.budget, self.channel
        if not self.yield_tokens or budget.used < budget.limit or channel.starving_for(token):
            await budget.wait_for_room(token, channel)
            return
        self.limiter.release()
        try:
            await budget.wait_for_room(token, channel)
            await self._queue(token, front=True)
        except BaseException:
            self.limiter.overdraw()  # cancelled without a token: the reader's ``finally`` gives one back
            raise

    async def first(self, token: object) -> None:
        """Take the first token for the item of ``token`` (a routed item, opened in its route already): in turn, or
        over the limit once the consumer starves for it (see the module docstring)."""
        if self.channel.starving_for(token):
            self.limiter.overdraw()
        else:
            await self._queue(token, front=False)

    async def requeue(self, token: object) -> None:
        """Before a throttled request of the item of ``token`` retries."""
        if self.limiter.borrowed <= self.limiter.total:
            return  # within the limit: keep the token, so that a retry never lets another item start
        self.limiter.release()
        try:
            await self._queue(token, front=True)
        except BaseException:
            self.limiter.overdraw()  # cancelled without a token: the reader's ``finally`` gives one back
            raise

    async def _queue(self, token: object, *, front: bool) -> None:
        """Queue for a token for the item of ``token`` (``front``: ahead of items not started); once the consumer
        starves for that item, it takes one over the limit instead."""
        starved = functools.partial(self.channel.starving_for, token)
        if not await self.limiter.acquire_unless(starved, REQUEUE_CHECK, first=front):
            self.limiter.overdraw()
