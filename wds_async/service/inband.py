"""Errors in band: the engine of a service session asks its handler, the client's handler decides.

In-process, the engine calls the user's handler when an item or a sample fails, and the answer (skip,
stop, raise) takes effect at that item's position. In the service the handler lives in the client. So a
session's engine gets :meth:`InBandChannel.handler`, which keeps the error and answers "skip"; the engine
then always puts something for the same reader right away (the item's ``ItemDone`` marker, or the
next sample), and :meth:`InBandChannel.put` puts the kept errors in front of it, in that reader's slot.
The pump sends them as ``["e", error, level]`` entries, where the client applies its own handler.
Readers are told apart by their task: the handler and the put that follows run in the same one.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..engine.channel import SampleChannel
from ..io.budget import ByteBudget

__all__ = ["InBand", "InBandChannel"]


class InBand:
    """An error a handler was asked about, travelling to the client at its position."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class InBandChannel(SampleChannel):
    """A channel whose :meth:`handler` queues errors in band, in front of the same reader's next put."""

    def __init__(self, budget: ByteBudget, *, ordered: bool) -> None:
        super().__init__(budget, ordered=ordered)
        self._pending: dict[object, list[BaseException]] = {}

    def handler(self, exc: BaseException) -> bool:
        """The engine's handler: keep ``exc`` for the client and go on (a put by this reader follows)."""
        self._pending.setdefault(asyncio.current_task(), []).append(exc)
        return True

    def put(self, token: object, sample: Any, nbytes: int) -> None:
        errors = self._pending.pop(asyncio.current_task(), None)
        for error in errors or ():
            super().put(token, InBand(error), 0)
        super().put(token, sample, nbytes)
