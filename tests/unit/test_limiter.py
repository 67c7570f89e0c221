"""The engine's limiter: tokens whose total changes at run time, FIFO, safe under cancellation."""

from __future__ import annotations

import asyncio

import pytest

from wds_async.engine.limiter import Limiter

pytestmark = pytest.mark.asyncio


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_tokens_are_handed_out_up_to_the_total_then_in_arrival_order() -> None:
    limiter = Limiter(2)
    order: list[int] = []

    async def take(n: int) -> None:
        await limiter.acquire()
        order.append(n)

    tasks = [asyncio.create_task(take(n)) for n in range(5)]
    await _settle()
    assert order == [0, 1] and limiter.borrowed == 2 and limiter.waiting == 3
    limiter.release()
    await _settle()
    assert order == [0, 1, 2]
    limiter.total = 4  # raising hands the new tokens to waiters at once
    await _settle()
    assert order == [0, 1, 2, 3, 4] and limiter.borrowed == 4 and limiter.waiting == 0
    await asyncio.gather(*tasks)


async def test_lowering_the_total_takes_nothing_back_but_stops_handing_on() -> None:
    limiter = Limiter(3)
    for _ in range(3):
        await limiter.acquire()
    waiter = asyncio.create_task(limiter.acquire())
    limiter.total = 1
    limiter.release()
    limiter.release()
    await _settle()
    assert limiter.borrowed == 1 and not waiter.done()  # still one over the new total's worth
    limiter.release()
    await _settle()
    assert waiter.done() and limiter.borrowed == 1
    assert not limiter.try_acquire()


async def test_cancelled_waiters_take_no_token_and_a_token_handed_as_they_are_cancelled_comes_back() -> None:
    limiter = Limiter(1)
    await limiter.acquire()
    first = asyncio.create_task(limiter.acquire())
    second = asyncio.create_task(limiter.acquire())
    await _settle()
    first.cancel()
    await _settle()
    assert first.cancelled() and limiter.waiting == 1
    limiter.release()  # goes to ``second``
    second.cancel()    # cancelled after the hand-over, before it ran: the token must come back
    await _settle()
    assert second.cancelled() and limiter.borrowed == 0
    assert limiter.try_acquire()


async def test_bad_totals_and_unbalanced_release_are_errors() -> None:
    with pytest.raises(ValueError):
        Limiter(0)
    limiter = Limiter(1)
    with pytest.raises(ValueError):
        limiter.total = True  # type: ignore[assignment]
    with pytest.raises(RuntimeError):
        limiter.release()
    async with limiter:
        assert limiter.borrowed == 1
    assert limiter.borrowed == 0


async def test_acquire_unless_keeps_its_fifo_place_and_gives_up_without_a_token_when_told() -> None:
    limiter = Limiter(1)
    await limiter.acquire()
    stop = False
    got: list[object] = []

    async def first() -> None:
        got.append(await limiter.acquire_unless(lambda: stop, 0.01))

    async def second() -> None:
        await limiter.acquire()
        got.append("second")

    a = asyncio.create_task(first())
    await _settle()
    b = asyncio.create_task(second())
    await asyncio.sleep(0.05)  # several looks at stop(): still queued, still first in line
    assert limiter.waiting == 2 and not got
    limiter.release()
    await _settle()
    assert got == [True] and limiter.borrowed == 1  # first in line, as acquire() would be
    limiter.release()
    await asyncio.gather(a, b)
    assert got == [True, "second"] and limiter.borrowed == 1

    limiter.release()
    await first()  # a free token is taken at once
    assert got[-1] is True and limiter.borrowed == 1
    d = asyncio.create_task(first())
    await asyncio.sleep(0.03)
    stop = True
    await d
    assert got[-1] is False and limiter.borrowed == 1 and limiter.waiting == 0  # gave up, took nothing
    limiter.overdraw()  # one over the total, given back like any token
    assert limiter.borrowed == 2
    limiter.release()
    limiter.release()
    assert limiter.borrowed == 0


async def test_acquire_unless_cancelled_takes_no_token() -> None:
    limiter = Limiter(1)
    await limiter.acquire()
    task = asyncio.create_task(limiter.acquire_unless(lambda: False, 0.01))
    await asyncio.sleep(0.03)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert limiter.borrowed == 1 and limiter.waiting == 0
    limiter.release()
    assert limiter.borrowed == 0


async def test_acquire_unless_first_goes_ahead_of_the_queue() -> None:
    limiter = Limiter(1)
    await limiter.acquire()
    order: list[str] = []

    async def new_work() -> None:
        await limiter.acquire()
        order.append("new")
        limiter.release()

    async def started_work() -> None:
        assert await limiter.acquire_unless(lambda: False, 0.01, first=True)
        order.append("started")
        limiter.release()

    new = asyncio.create_task(new_work())
    await _settle()
    started = asyncio.create_task(started_work())
    await _settle()
    limiter.release()
    await asyncio.gather(new, started)
    assert order == ["started", "new"]


async def _live_between_cancelled() -> tuple[Limiter, asyncio.Task[None]]:
    """A limiter of one token, taken, whose queue is: a cancelled waiter, a live one, a cancelled one."""
    limiter = Limiter(1)
    await limiter.acquire()
    tasks = []
    for _ in range(3):  # one at a time, so the queue holds them in this order
        tasks.append(asyncio.create_task(limiter.acquire()))
        await _settle()
    head, live, tail = tasks
    head.cancel()
    tail.cancel()
    await _settle()
    assert limiter.waiting == 1
    return limiter, live


async def test_a_waiter_between_cancelled_ones_keeps_its_place_and_cancelled_ones_alone_hold_none() -> None:
    limiter, live = await _live_between_cancelled()
    limiter.total = 2  # a free token goes to the live waiter between the cancelled ones, not to a newcomer
    await _settle()
    assert live.done() and not live.cancelled() and limiter.borrowed == 2
    limiter.total = 3
    await _settle()
    assert limiter.borrowed == 2 and limiter.waiting == 0
    assert limiter.try_acquire()  # only cancelled futures were left in the queue: they hold no place


async def test_a_newcomer_does_not_jump_a_live_waiter_queued_behind_a_cancelled_one() -> None:
    limiter, live = await _live_between_cancelled()
    # A token comes free without being handed on yet (between two looks of the loop): the queue still holds
    # the live waiter, so try_acquire must refuse.
    limiter._total = 2
    assert not limiter.try_acquire()
    limiter._hand_on()
    await _settle()
    assert live.done() and limiter.borrowed == 2
