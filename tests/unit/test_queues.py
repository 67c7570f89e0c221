from __future__ import annotations

import asyncio

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
    assert added < 20, f"{added} tracked objects for {len(samples)} queued samples"
    items, _ = channel.take(len(samples), 1 << 30, 0.0, lambda n: None, lambda: None)
    assert items == samples
