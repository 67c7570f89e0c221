"""``run_private``: one coroutine to completion from sync code, from a plain thread or a thread that runs a
loop, leaving nothing behind, and cancelled (its cleanup run) when the caller is interrupted."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from wds_async._loop import run_private
from wds_async.errors import NotFound


async def _where() -> tuple[str, str]:
    return threading.current_thread().name, type(asyncio.get_running_loop()).__module__


def test_runs_here_on_the_bridge_loop() -> None:
    name, module = run_private(_where)
    assert name == threading.current_thread().name
    try:
        import uvloop  # noqa: F401
    except ImportError:
        assert module.startswith("asyncio")
    else:
        assert module.startswith("uvloop")
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()  # nothing of the private loop is left set in this thread


def test_from_inside_a_running_loop_it_uses_a_helper_thread() -> None:
    async def caller() -> tuple[str, str]:
        return run_private(_where)  # a sync call, as a notebook cell makes one

    name, _ = asyncio.run(caller())
    assert name == "wds-async-private-loop"


def test_errors_come_back_as_they_were_raised() -> None:
    async def fail() -> None:
        raise NotFound("no such file", url="/x.tar")

    with pytest.raises(NotFound) as info:
        run_private(fail)
    assert info.value.url == "/x.tar"

    async def caller() -> None:
        run_private(fail)

    with pytest.raises(NotFound):
        asyncio.run(caller())


def test_leftover_tasks_are_cancelled_and_awaited() -> None:
    cleaned = []

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned.append(True)

    async def leave_one_behind() -> int:
        asyncio.get_running_loop().create_task(forever())
        await asyncio.sleep(0)
        return 7

    assert run_private(leave_one_behind) == 7
    assert cleaned == [True]


_INTERRUPTED = """
import asyncio, signal, sys
from wds_async._loop import run_private

signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even where our parent ignores it

async def work():
    try:
        print("ready", flush=True)
        await asyncio.sleep(60)
    finally:
        print("cleaned", flush=True)

def call():
    try:
        run_private(work)
    except KeyboardInterrupt:
        print("interrupted", flush=True)

if sys.argv[1] == "plain":
    call()
else:  # a thread that runs a loop (no asyncio.Runner, so SIGINT raises KeyboardInterrupt, as in a notebook)
    async def outer():
        call()
    asyncio.new_event_loop().run_until_complete(outer())
"""


@pytest.mark.parametrize("where", ["plain", "in-loop"])
def test_an_interrupt_cancels_the_coroutine_and_runs_its_cleanup(where: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_INTERRUPTED), where], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert out.splitlines() == ["cleaned", "interrupted"], (out, err)
    assert proc.returncode == 0, err


_INTERRUPTED_IN_START = """
import asyncio, sys, threading
import wds_async._loop as private

started = threading.Event()
original = threading.Thread.start

def start(self):  # the interrupt, as the signal handler would raise it inside Thread.start()
    if self.name != "wds-async-private-loop":
        return original(self)
    if sys.argv[1] == "after":  # the helper thread exists and its work has begun
        original(self)
        started.wait()
    raise KeyboardInterrupt

threading.Thread.start = start
private.START_WAIT = 0.2

async def work():
    try:
        started.set()
        print("working", flush=True)
        await asyncio.sleep(60)
    finally:
        print("cleaned", flush=True)

async def outer():  # a thread that runs a loop: run_private uses its helper thread
    try:
        private.run_private(work)
    except KeyboardInterrupt:
        print("interrupted", flush=True)

asyncio.new_event_loop().run_until_complete(outer())
"""


@pytest.mark.parametrize("when,expected", [("after", ["working", "cleaned", "interrupted"]),
                                           ("before", ["interrupted"])])
def test_an_interrupt_inside_the_helper_thread_s_start(when: str, expected: list[str]) -> None:
    """An interrupt while ``Thread.start()`` waits for the new thread: the work that began is cancelled and cleaned
    up before the interrupt propagates; one that came before the thread existed propagates at once."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_INTERRUPTED_IN_START), when], capture_output=True,
                          text=True, timeout=60)
    assert proc.stdout.splitlines() == expected, (proc.stdout, proc.stderr)
    assert proc.returncode == 0, proc.stderr
