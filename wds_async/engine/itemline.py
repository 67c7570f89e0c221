"""A line of items waiting for one consumer, with their sizes in bytes: what each queue of a
:class:`~wds_async.engine.channel.SampleChannel` is.

* **No object per item.** Items and sizes are two lists read from a head index. A deque of ``(item, size)`` pairs
  made one tuple per waiting sample, and one the garbage collector tracks (it holds a sample): with a buffer of small
  samples, tens of thousands of them reached the collector's oldest generation per refill, and each time a quarter of
  the process's objects got there that way, Python ran a full collection over the whole heap (one pass over 210k
  samples of 1 KiB: 10-11 full collections taking 0.9-1.1 s, against 6-7 taking 0.5-0.6 s without the pairs).
* **A take is a few C calls, not a loop.** The consumer takes up to a hand-off at once: one slice of each list, the
  byte bound found by bisecting the running sum of the sizes. Item by item in Python, that loop was the largest share
  of the consumer's bytecodes per sample (about 65 of 230 for a plain dataset).
* **Stops** (in the channel: errors and the end marker) end a take: a take never reaches past one.
* The lists are compacted once the taken part is most of them, and cleared when all of it is, so each item is moved
  a bounded number of times.

Not thread-safe: the channel calls it under its lock.
"""

from __future__ import annotations

import bisect
import collections
import itertools
from typing import Any

__all__ = ["ItemLine"]

#: Compact the lists once at least this many items were taken and they are at least half of the lists.
COMPACT_AFTER = 4096


class ItemLine:
    """Items in line with their sizes in bytes, and where its stops are (see the module docstring)."""

    __slots__ = ("head", "items", "sizes", "stops")

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.sizes: list[int] = []
        self.head = 0  # items[:head] were taken
        self.stops: collections.deque[int] = collections.deque()  # indices of the stops not yet taken

    def __len__(self) -> int:
        return len(self.items) - self.head

    def append(self, item: Any, nbytes: int) -> None:
        self.items.append(item)
        self.sizes.append(nbytes)

    def append_stop(self, item: Any) -> None:
        """An item of no bytes that ends the take that reaches it (it is the take's last item)."""
        self.stops.append(len(self.items))
        self.append(item, 0)

    def take(self, max_items: int, max_bytes: int, at_least_one: bool) -> tuple[list[Any], int, bool]:
        """``(items, bytes, stopped)``: up to ``max_items`` from the head, as many as fit in ``max_bytes`` (one that
        does not with ``at_least_one``, when the first does not), through the first stop; ``stopped``: the last item
        is a stop."""
        head = self.head
        end = min(len(self.items), head + max_items)
        stops = self.stops
        stopped = bool(stops) and stops[0] < end
        if stopped:
            end = stops[0] + 1
        if end <= head:
            return [], 0, False
        sizes = self.sizes[head:end]
        taken = sum(sizes)
        if taken > max_bytes:
            fits = list(itertools.accumulate(sizes))
            count = bisect.bisect_right(fits, max_bytes)
            if count == 0:
                if not at_least_one:
                    return [], 0, False
                count = 1
            if count < end - head:
                stopped = False
                end = head + count
            taken = fits[count - 1]
        items = self.items[head:end]
        if stopped:
            stops.popleft()
        self.head = end
        if end == len(self.items):
            self.clear()
        elif end >= COMPACT_AFTER and 2 * end >= len(self.items):
            del self.items[:end], self.sizes[:end]
            self.stops = collections.deque(i - end for i in stops)
            self.head = 0
        return items, taken, stopped

    def nbytes(self) -> int:
        """The bytes of the items not yet taken."""
        return sum(self.sizes[self.head :])

    def clear(self) -> None:
        self.items.clear()
        self.sizes.clear()
        self.stops.clear()
        self.head = 0
