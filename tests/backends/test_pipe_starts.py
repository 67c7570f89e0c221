"""``pipe:`` commands start one at a time in a process, whichever loop starts them.

uvloop refuses a spawn while another loop of the process is forking (``RuntimeError: Racing with another loop to
spawn a process``), and every dataset that does not share an engine has a loop of its own: found by the resume
soak (tests/soak.py), where a shuffle buffer refilled on resume read its shards beside the pass's own engine.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from pathlib import Path
from typing import Any

import wds_async as wds
from benchmarks.make_shards import make_shards
from wds_async._loop import new_event_loop
from wds_async.backends import pipe
from wds_async.backends.pipe import PipeBackend


def _in_threads(target: Any, count: int, timeout: float) -> list[BaseException]:
    """Run ``target()`` in ``count`` threads at once; what they raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:  # reported to the caller
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return errors


def test_datasets_in_threads_read_pipe_shards_together(tmp_path: Path) -> None:
    """Three datasets over many small ``pipe:`` shards, each iterated in its own thread (each its own engine and
    loop), as a training and an evaluation set read together: every sample of each, no error. (Before, one or
    two of the three failed in most runs with uvloop's ``Racing with another loop to spawn a process``.)"""
    make_shards(tmp_path, n_shards=40, shard_bytes=32 << 10, sample_bytes=4 << 10, seed=1)
    urls = [f"pipe:cat {tmp_path}/shard-{i:06d}.tar" for i in range(40)]
    expected = len(list(wds.WebDataset([u.removeprefix("pipe:cat ") for u in urls])))
    counts: list[int] = []

    def read() -> None:
        for _ in range(2):
            counts.append(sum(1 for _ in wds.WebDataset(urls, max_connections=8)))

    assert _in_threads(read, 3, 120) == []
    assert counts == [expected] * 6


def test_starts_from_two_loops_never_overlap(tmp_path: Path, monkeypatch: Any) -> None:
    """Two loops (two threads) open 15 commands each at once; the starts, held open 5 ms each with the GIL
    released (as uvloop's fork is), are never two at a time."""
    real = asyncio.create_subprocess_shell
    state = {"now": 0, "peak": 0}
    guard = threading.Lock()

    async def spawn(*args: Any, **kwargs: Any) -> Any:
        with guard:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        time.sleep(0.005)  # noqa: ASYNC251 - on purpose: the window in which no other loop may start one
        try:
            return await real(*args, **kwargs)
        finally:
            with guard:
                state["now"] -= 1

    monkeypatch.setattr(asyncio, "create_subprocess_shell", spawn)
    target = tmp_path / "x"
    target.write_bytes(b"x" * 1000)
    barrier = threading.Barrier(2)

    async def opens() -> None:
        backend = PipeBackend()

        async def one() -> bytes:
            async with backend.open(f"pipe:cat {target}") as stream:
                return b"".join([chunk async for chunk in stream])

        got = await asyncio.gather(*(one() for _ in range(15)))
        assert all(g == b"x" * 1000 for g in got)

    def run() -> None:
        loop = new_event_loop()
        try:
            barrier.wait()
            loop.run_until_complete(opens())
        finally:
            loop.close()

    assert _in_threads(run, 2, 60) == []
    assert state["peak"] == 1


def test_a_start_cancelled_while_it_waits_for_its_turn_leaves_the_lock_free() -> None:
    """Cancelled while it waits (in a thread) for another start to end: the lock, once that thread gets it, is
    released, never held for a caller that is gone."""
    held = pipe._STARTING
    assert held.acquire(blocking=False)

    async def scenario() -> None:
        waiting = asyncio.ensure_future(pipe._take_turn())
        await asyncio.sleep(0.05)  # in its thread, waiting
        waiting.cancel()
        held.release()  # the other start ends; the waiting thread takes the lock for a caller that is gone
        for _ in range(200):
            await asyncio.sleep(0.01)
            if not held.locked():
                return

    asyncio.run(scenario())
    assert held.acquire(timeout=1), "the lock is still held for the cancelled start"
    held.release()


def _child_can_start(out: Any) -> None:
    out.put(pipe._STARTING.acquire(blocking=False))


def test_a_forked_process_gets_a_free_lock() -> None:
    """A fork while a thread of the parent starts a command (a DataLoader worker forked beside a running engine)
    copies the lock held; the child gets a free one, or its first ``pipe:`` shard would wait forever."""
    assert pipe._STARTING.acquire(blocking=False)
    try:
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        child = ctx.Process(target=_child_can_start, args=(out,))
        child.start()
        child.join(30)
        assert out.get(timeout=5) is True
    finally:
        pipe._STARTING.release()
