"""``asyncio.TaskGroup`` on Python 3.11+, and a minimal equivalent for 3.10.

The fallback keeps the two properties the engine relies on: every task created through the group is
awaited before the ``async with`` block exits, and the first failure cancels the siblings and is
re-raised (as the exception itself rather than an ``ExceptionGroup``, which 3.10 lacks).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from typing_extensions import Self

T = TypeVar("T")

__all__ = ["TaskGroup"]


class _TaskGroup310:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._error: BaseException | None = None
        self._parent: asyncio.Task[Any] | None = None

    async def __aenter__(self) -> Self:
        self._parent = asyncio.current_task()
        return self

    def create_task(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._on_done)
        return task

    def _on_done(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        if self._error is None:
            self._error = task.exception()
            for other in self._tasks:
                if not other.done():
                    other.cancel()
            if self._parent is not None and not self._parent.done():
                self._parent.cancel()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None:
            for task in self._tasks:
                task.cancel()
        pending = [t for t in self._tasks if not t.done()]
        while pending:
            try:
                await asyncio.gather(*pending, return_exceptions=True)
            except asyncio.CancelledError:
                for task in pending:
                    task.cancel()
            pending = [t for t in self._tasks if not t.done()]
        if self._error is not None:
            raise self._error


if sys.version_info >= (3, 11):
    TaskGroup = asyncio.TaskGroup
else:  # pragma: no cover - exercised on 3.10 only
    TaskGroup = _TaskGroup310
