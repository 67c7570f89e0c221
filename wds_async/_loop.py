"""Running one coroutine to completion on a private event loop, from synchronous code.

For one-shot work outside the streaming bridge (building or loading an index). The loop is the
bridge's choice (uvloop when importable). When the calling thread already runs a loop (a notebook),
the private loop runs in a helper thread instead and the caller waits for it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .bridge import new_event_loop

__all__ = ["run_private"]

T = TypeVar("T")


def run_private(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Return the result of ``make()`` run on a fresh event loop (the coroutine is created in the
    thread that runs it), closing the loop and everything left on it before returning."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass  # (not run in here: its errors would carry this one as their context)
    else:
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="wds-async-private-loop") as pool:
            return pool.submit(_run, make).result()
    return _run(make)


def _run(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    loop = new_event_loop()
    try:
        return loop.run_until_complete(make())
    finally:
        try:  # as asyncio.run: an interrupt leaves tasks behind; cancel them so their streams close
            pending = asyncio.all_tasks(loop)
            if pending:
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()
