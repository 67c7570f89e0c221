"""One ``open``'s samples into the client's ring: the pump of a node-service session.

The pump takes the samples of the session's engine from its channel, in order, copies each sample's fields into the
shared-memory ring (:mod:`~wds_async.service.ring`) and sends their offsets to the client in ``batch`` frames, with
the end-of-item markers and the errors for the client's handler (:mod:`~wds_async.service.inband`) in between. When
the ring is full it sends what is pending and waits for the client's ``ack``, so a slow client fills only its own
ring. A sample larger than the whole ring goes alone, in a file of its own. With nothing to send for
:data:`ALIVE_SECONDS` it sends ``alive``: the client's stall guard tells a quiet service from a dead one.

The session (:mod:`~wds_async.service.session`) owns the socket, the ring and the acks; the pump is given the means
to send a frame and the event the session sets on each ``ack``.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Protocol

from ..engine.channel import SampleChannel
from ..engine.grouping import Sample
from ..engine.work import ItemDone
from ..errors import SampleError
from ..stats import Stats
from .inband import InBand
from .protocol import error_to_json
from .ring import Ring, one_shot

__all__ = ["ALIVE_SECONDS", "Pump"]

#: Seconds without anything to send after which the pump sends ``alive`` (the client's stall guard).
ALIVE_SECONDS = 2.0
_META = ("__key__", "__url__")


class Send(Protocol):
    """How the pump sends a frame: the session's ``_send`` (one sender at a time; ``fds`` pass along)."""

    async def __call__(self, message: dict[str, Any], fds: list[int] | None = None) -> None: ...


class Pump:
    """Moves one ``open``'s samples into ``ring`` and their offsets to the client through ``send(message, fds)``;
    ``acked`` is set by the session on each ``ack`` (see the module docstring)."""

    def __init__(self, ring: Ring, send: Send, acked: asyncio.Event, stats: Stats) -> None:
        self.ring = ring
        self.send = send
        self.acked = acked
        self.stats = stats

    async def run(self, channel: SampleChannel, max_items: int, max_bytes: int) -> None:
        """Move the channel's items into the ring and their offsets to the client, in order."""
        while True:
            started = time.perf_counter()
            try:
                items, done = await asyncio.wait_for(channel.get_many(max_items, max_bytes), ALIVE_SECONDS)
            except TimeoutError:
                await self.send({"type": "alive"})
                continue
            finally:
                self.stats.wait_seconds += time.perf_counter() - started
            entries: list[Any] = []
            span = 0
            for item in items:
                kind = type(item)
                if kind is Sample:
                    span = await self._put_sample(item, entries, span)
                    self.stats.samples_delivered += 1
                elif kind is ItemDone:
                    entries.append(["d", item.id])
                elif kind is InBand:
                    level = "sample" if type(item.error) is SampleError else "item"
                    entries.append(["e", error_to_json(item.error), level])
                else:  # an error the engine raised outside any item: it ends the data
                    entries.append(["e", error_to_json(item), "fatal"])
            if entries:
                await self.send({"type": "batch", "entries": entries, "span": span})
            if done:
                return

    async def _put_sample(self, sample: Sample, entries: list[Any], span: int) -> int:
        """Copy one sample's fields into the ring (waiting for acks, after sending what is pending, when it
        is full) and add its entry; return the batch's span so far."""
        ring = self.ring
        names = [k for k in sample if k not in _META]
        blocks: list[bytes] = [sample[k] for k in names]
        total = sum(len(b) for b in blocks)
        if not ring.fits(total):  # alone, in a file of its own (see ring.py)
            if entries:
                await self.send({"type": "batch", "entries": list(entries), "span": span})
                entries.clear()
            fd, offsets = one_shot(blocks)
            try:
                fields = [[n, o, len(b)] for n, o, b in zip(names, offsets, blocks)]
                await self.send({"type": "batch", "entries": [_entry(sample, fields)], "span": 0}, [fd])
            finally:
                os.close(fd)
            return 0
        while True:
            self.acked.clear()  # before any await: an ack that arrives while we send below is not lost
            got = ring.allocate(total)
            if got is not None:
                break
            if entries:  # the client can only ack what it has been told about
                await self.send({"type": "batch", "entries": list(entries), "span": span})
                entries.clear()
                span = 0
            await self.acked.wait()
        at, consumed = got
        fields = []
        for name, block in zip(names, blocks):
            ring.write(at, block)
            fields.append([name, at, len(block)])
            at += len(block)
        entries.append(_entry(sample, fields))
        return span + consumed


def _entry(sample: Sample, fields: list[list[Any]]) -> list[Any]:
    return ["s", sample["__key__"], sample.url, sample.offset, sample.end, sample.item, fields]
