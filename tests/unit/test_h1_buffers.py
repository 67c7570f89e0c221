"""The builtin HTTP/1.1 client's receive buffers (``backends/_h1wire.py``): reused between answers, bounded as
spares, sized for a range, and within the allowance the engine counts per stream."""

from __future__ import annotations

import pytest

from tests.unit.h1_servers import BODY, answering, new_pool, scripted
from wds_async.backends._h1 import HEAD_ROOM, PAUSE_BYTES, READ_BYTES
from wds_async.backends._h1wire import MIN_READ_BYTES, SPARE_BUFFERS
from wds_async.backends.http import HttpBackend


def test_an_answer_holds_no_more_than_the_allowance_the_engine_counts() -> None:
    from wds_async.engine.engine import STREAM_ALLOWANCE

    # the receive buffer (or the piece that crossed the pause line), what waits, and the piece a reader holds
    assert READ_BYTES + PAUSE_BYTES + READ_BYTES <= HttpBackend.capabilities.buffer_allowance == STREAM_ALLOWANCE


@pytest.mark.asyncio
async def test_receive_buffers_are_reused_between_answers_and_the_spares_are_bounded() -> None:
    reply = answering(lambda path: BODY[:70_000])

    async with scripted(reply) as server:
        pool = new_pool()
        try:
            first = await pool.get(server.url("/a"), {})
            assert await first.read() == BODY[:70_000]
            buffer = first._wire.buf
            first.release()
            assert pool._spare == [buffer]  # kept for the next answer, not dropped with the idle connection
            second = await pool.get(server.url("/a"), {})
            assert await second.read() == BODY[:70_000] and second._wire.buf is buffer and not pool._spare
            second.release()
            many = [await pool.get(server.url("/a"), {}) for _ in range(12)]  # 12 connections at once
            for one in many:
                assert await one.read() == BODY[:70_000]
                one.release()
            assert len(pool._spare) == SPARE_BUFFERS
        finally:
            await pool.aclose()


@pytest.mark.asyncio
async def test_a_ranged_get_without_a_spare_buffer_gets_one_of_its_size() -> None:
    """A fresh receive buffer is zeroed: a 64 KiB range does not pay for READ_BYTES. Small buffers are not kept as
    spares (a later large answer would read through them 16 KiB at a time); a larger answer than its Range said
    still reads whole."""
    reply = answering(lambda path: BODY[:70_000] if path == "/big" else BODY[:1000])

    async with scripted(reply) as server:
        pool = new_pool()
        try:
            small = await pool.get(server.url("/a"), {"Range": "bytes=0-999"})
            assert await small.read() == BODY[:1000]
            assert len(small._wire.buf or b"") == MIN_READ_BYTES
            small.release()
            assert pool._spare == []
            ranged = await pool.get(server.url("/big"), {"Range": "bytes=0-69999"})
            assert await ranged.read() == BODY[:70_000] and len(ranged._wire.buf or b"") == 70_000 + HEAD_ROOM
            ranged.release()
            wrong = await pool.get(server.url("/big"), {"Range": "bytes=0-9"})  # the server sends more than asked
            assert await wrong.read() == BODY[:70_000]
            wrong.release()
            whole = await pool.get(server.url("/big"), {})
            assert await whole.read() == BODY[:70_000] and len(whole._wire.buf or b"") == READ_BYTES
            whole.release()
            assert len(pool._spare) == 1
        finally:
            await pool.aclose()
