from __future__ import annotations

import asyncio
from typing import Any

import pytest

from wds_async.engine.channel import ChannelClosed, SampleChannel
from wds_async.io.budget import ByteBudget


@pytest.mark.asyncio
async def test_budget_blocks_until_release() -> None:
    budget = ByteBudget(100)
    channel = SampleChannel(budget, ordered=False)
    reader = object()
    channel.open_shard(reader)
    budget.add(60)
    channel.put(reader, "a", 60)
    budget.add(50)  # used 110 >= limit and the channel has a sample: the reader must wait
    waiter = asyncio.ensure_future(budget.wait_for_room(reader, channel))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    items, done = await channel.get_many(10, 1 << 20)
    assert items == ["a"] and not done
    await asyncio.wait_for(waiter, 1)
    assert budget.used == 50


@pytest.mark.asyncio
async def test_starving_consumer_lets_one_reader_overdraft() -> None:
    """Partial samples fill the budget and nothing is deliverable: one reader proceeds, not all."""
    budget = ByteBudget(100)
    channel = SampleChannel(budget, ordered=False)
    a, b = object(), object()
    channel.open_shard(a)
    channel.open_shard(b)
    budget.add(150)  # held in partial samples
    first = asyncio.ensure_future(budget.wait_for_room(a, channel))
    second = asyncio.ensure_future(budget.wait_for_room(b, channel))
    await asyncio.sleep(0.01)
    assert first.done() and not second.done()
    budget.forget(a)  # a finished its shard: b may overdraft now
    await asyncio.wait_for(second, 1)


@pytest.mark.asyncio
async def test_ordered_channel_delivers_shard_by_shard() -> None:
    budget = ByteBudget(1 << 20)
    channel = SampleChannel(budget, ordered=True)
    s0, s1 = object(), object()
    channel.open_shard(s0)
    channel.open_shard(s1)
    channel.put(s1, "b1", 1)
    channel.put(s0, "a1", 1)
    channel.put(s1, "b2", 1)
    got = await asyncio.wait_for(channel.get_many(10, 100), 1)
    assert got == (["a1"], False)
    channel.close_shard(s1)
    getter = asyncio.ensure_future(channel.get_many(10, 100))
    await asyncio.sleep(0.01)
    assert not getter.done()  # s0 is still open: s1's samples must wait
    channel.put(s0, "a2", 1)
    channel.close_shard(s0)
    channel.finish()
    assert await getter == (["a2", "b1", "b2"], True)


@pytest.mark.asyncio
async def test_error_item_ends_the_channel_at_its_position() -> None:
    budget = ByteBudget(1 << 20)
    channel = SampleChannel(budget, ordered=False)
    t = object()
    channel.open_shard(t)
    channel.put(t, "x", 1)
    err = ValueError("boom")
    channel.put_error(t, err)
    channel.put(t, "never", 1)
    items, done = await channel.get_many(10, 100)
    assert items == ["x", err] and done


@pytest.mark.asyncio
async def test_handoff_respects_byte_limit_but_always_moves_one() -> None:
    budget = ByteBudget(1 << 20)
    channel = SampleChannel(budget, ordered=False)
    t = object()
    channel.open_shard(t)
    for i in range(5):
        budget.add(40)
        channel.put(t, i, 40)
    assert (await channel.get_many(10, 100))[0] == [0, 1]
    assert (await channel.get_many(10, 10))[0] == [2]  # one item even when larger than max_bytes
    assert budget.used == 80


@pytest.mark.asyncio
async def test_abandon_releases_bytes_and_refuses_puts() -> None:
    budget = ByteBudget(100)
    channel = SampleChannel(budget, ordered=True)
    t = object()
    channel.open_shard(t)
    budget.add(30)
    channel.put(t, "x", 30)
    channel.abandon()
    assert budget.used == 0
    with pytest.raises(ChannelClosed):
        channel.put(t, "y", 1)
    assert await channel.get_many(1, 1) == ([], True)


@pytest.mark.parametrize("ordered", [False, True])
def test_a_queued_sample_adds_no_object_for_the_garbage_collector(ordered: bool) -> None:
    """A full buffer of small samples is tens of thousands of them; an object per queued sample that the collector
    tracks (a ``(sample, size)`` pair) reaches its oldest generation and triggers full collections of the whole
    heap. Queueing must add none: only the samples themselves are tracked."""
    import gc

    from wds_async.engine.grouping import Sample

    budget = ByteBudget(1 << 30)
    channel = SampleChannel(budget, ordered=ordered)
    reader = object()
    channel.open_shard(reader)
    samples = [Sample(__key__=f"k{i}", bin=b"x") for i in range(2000)]
    was_enabled = gc.isenabled()
    gc.disable()  # no collection between the two counts
    try:
        before = len(gc.get_objects())
        for sample in samples:
            channel.put(reader, sample, 1)
        added = len(gc.get_objects()) - before
    finally:
        if was_enabled:
            gc.enable()
    # A pair per sample would be 2,000; other threads of the test session may allocate a few meanwhile.
    assert added < len(samples) // 10, f"{added} tracked objects for {len(samples)} queued samples"
    items, _ = channel.take(len(samples), 1 << 30, 0.0, lambda n: None, lambda: None)
    assert items == samples


class _Reference:
    """The channel's take, item by item (what the channel did before its queues took slices): the model the
    channel is checked against."""

    def __init__(self, ordered: bool) -> None:
        self.ordered = ordered
        self.slots: list[list[Any]] = []  # [token, entries, closed]
        self.ready: list[tuple[Any, int]] = []
        self.stopped = False

    def queue(self, token: object) -> list[tuple[Any, int]]:
        if not self.ordered:
            return self.ready
        return next(slot[1] for slot in self.slots if slot[0] is token)

    def head(self) -> list[tuple[Any, int]] | None:
        if not self.ordered:
            return self.ready
        while self.slots and self.slots[0][2] and not self.slots[0][1]:
            self.slots.pop(0)
        return self.slots[0][1] if self.slots else None

    def take(self, max_items: int, max_bytes: int) -> tuple[list[Any], int]:
        items: list[Any] = []
        taken = 0
        head = self.head()
        while head and len(items) < max_items and (not items or taken + head[0][1] <= max_bytes):
            item, nbytes = head.pop(0)
            taken += nbytes
            if item == "END":
                self.stopped = True
                break
            items.append(item)
            if isinstance(item, BaseException):
                self.stopped = True
                break
            if self.ordered and not head:
                head = self.head()
        return items, taken


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_takes_match_an_item_by_item_model(ordered: bool, seed: int) -> None:
    """Random puts, errors, stops, shard ends and takes with random bounds (a byte bound that fits none, one or
    many; item bounds of 1 to many), and enough items that the queues compact several times: every take returns
    what taking item by item returns, with the same bytes, and the channel stops where the model does."""
    import random

    rng = random.Random(seed)
    channel, model, tokens, puts = SampleChannel(ByteBudget(1 << 40), ordered=ordered), _Reference(ordered), [], 0
    n = stops = 0
    for _step in range(30_000):
        if channel.stopped:  # an error or a stop ended this channel: go on with a fresh one
            stops += 1
            channel, model, tokens, puts = SampleChannel(ByteBudget(1 << 40), ordered=ordered), _Reference(ordered), [], 0
        roll = rng.random()
        ending = puts > 3000 and roll < 0.002  # errors and stops only after some fill, so queues grow long
        if ending and tokens:
            token = rng.choice(tokens)
            if roll < 0.001:
                error = ValueError(n)
                channel.put_error(token, error)
                model.queue(token).append((error, 0))
            else:
                channel.put_stop(token)
                model.queue(token).append(("END", 0))
        elif roll < 0.02 or not tokens:
            token = object()
            tokens.append(token)
            channel.open_shard(token)
            model.slots.append([token, [], False])
        elif roll < 0.7:
            token = rng.choice(tokens)
            size = rng.choice([0, 1, 5, 100, 1000])
            channel.put(token, n, size)
            model.queue(token).append((n, size))
            n += 1
            puts += 1
        elif roll < 0.72 and ordered:
            token = tokens.pop(rng.randrange(len(tokens)))
            channel.close_shard(token)
            next(slot for slot in model.slots if slot[0] is token)[2] = True
        else:
            max_items = rng.choice([1, 2, 7, 64, 4096])
            max_bytes = rng.choice([0, 1, 50, 1000, 20_000, 1 << 30])
            released: list[int] = []
            got = channel.take(max_items, max_bytes, 0.0, released.append, lambda: None)[0]
            want, nbytes = model.take(max_items, max_bytes)
            assert (got, sum(released)) == (want, nbytes)
            assert channel.stopped == model.stopped
    assert n > 15_000 and stops >= 1
    for _ in range(100):  # drain what is left: the same again
        got = channel.take(4096, 1 << 30, 0.0, lambda nbytes: None, lambda: None)[0]
        assert got == model.take(4096, 1 << 30)[0]


def test_a_long_queue_compacts_and_keeps_its_order() -> None:
    """Items taken in small bites while more arrive: the taken part is dropped from the lists now and then, and the
    items and the stop after them come out in the order they went in."""
    from wds_async.engine.itemline import ItemLine

    queue = ItemLine()
    out: list[Any] = []
    compacted = False
    for i in range(20_000):
        queue.append(i, 1)
        if i % 3 == 0:
            items, taken, stopped = queue.take(2, 1 << 30, True)
            assert taken == len(items) and not stopped
            out += items
            compacted = compacted or (0 < queue.head < 4096 and out[-1] > 4096)
    queue.append_stop("stop")
    while True:
        items, taken, stopped = queue.take(500, 300, True)
        out += items
        if stopped:
            break
    assert compacted
    assert out == [*range(20_000), "stop"] and len(queue) == 0
