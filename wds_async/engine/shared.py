"""One engine for several streams of work items: the sources of a mix.

A mix of datasets (:class:`~wds_async.RandomMix`, :class:`~wds_async.RoundRobin`) reads all its sources on one
engine, so that it holds one byte budget, one limiter and autotuner, and one connection pool per store, whatever
the number of sources. :class:`SharedEngine` is that engine: a :class:`~wds_async.engine.bridge.Bridge` over an
:class:`~wds_async.engine.feed.ItemFeed`, whose channel has one route per source
(:class:`~wds_async.engine.channel.RoutedChannel`). Each source reads its own items through :meth:`SharedEngine.batches`
and gets exactly the lists a bridge of its own would hand it, in its own order.

How much each source prefetches
    A source keeps ``1 + ceil(share * level)`` of its work items submitted and still being read (``share``: its
    part of what the mix consumes, from the weights; ``level``: the engine's current concurrency, as the autotuner
    moves it). It submits more whenever its consumer takes a hand-off, so submissions follow consumption: a source
    drawn 30% of the time keeps about 30% of the readers busy, and a source drawn 0.5% of the time keeps its
    current item and the next, so it never starves the consumer. Together the sources keep about ``level`` plus one
    item each being read, what a single dataset's engine keeps (its readers) plus one item per source, so the
    autotuner sees work waiting for its tokens as it does for one dataset.

    While the buffer has room, items whose read ended and that wait in it for their turn do not count: they hold
    bytes, which the budget bounds, and no reader. Counting them (as a first version did) left readers idle
    whenever items finished ahead of the consumer: at 64 connections a 20-source mix kept 41 requests streaming,
    the autotuner saw no work waiting and stopped ramping, and a network-bound pass ran 1.2x longer than one
    dataset's. Once the buffer is three quarters full they count again: more reads would only wait for room, and
    a slow consumer's mix would fill its whole budget with read-ahead on top of its routes' hand-offs.

Hand-off
    A route's consumer takes its samples in lists, as a single dataset's does, and holds each list until it has used
    it. Those bytes stay counted in the byte budget until the consumer asks for the route's next list, so however
    many routes hold a list, they hold it inside the one budget. All routes' lists together take at most a quarter
    of the budget (``max_buffered_bytes / 4``), shared in proportion to the square root of each route's share, and
    no list is larger than the hand-off size (``handoff_bytes``) or smaller than 64 KiB.

    Why square roots: each take costs the consumer thread a fixed 100-300 us (the channel's lock, waking the loop,
    the route's and the recorder's bookkeeping, on caches its training step left cold), so the consumer's cost is the
    number of lists, ``sum(share_i / list_i)`` per sample, and what the lists pin in the budget is ``sum(list_i)``.
    For a fixed ``sum(list_i)`` the first is smallest with ``list_i`` in proportion to ``sqrt(share_i)``. With the
    twenty weights of ``benchmarks.mix`` (0.30 down to 0.005) that is 3.1 lists per single dataset's list, where
    lists in proportion to the shares with a floor of a quarter of the hand-off (a first rule, pinning as much)
    took 4.5. (A first version took 1 MiB lists, held outside the budget: five times as many lists as one dataset,
    about 3 us more per sample.)

Priming
    A source's iterator starts at its first draw, which for a rare source may come thousands of samples into the
    epoch; its first item would then start only when it is already needed. :meth:`SharedEngine.prime` submits a
    source's first items at the start, from its planned work; when the source starts, each primed item that is
    the item it asks for is adopted, and primed items it does not ask for (a plan that changed) are read and
    dropped, never delivered. A mix primes all its sources at once (:meth:`SharedEngine.prime_all`): every
    source's first item, in the order of their first draws, then the rest of every window in the order the draws
    will need them, source ``i``'s ``k``-th item at about ``k / share_i`` draws (:func:`due_order`). Items queue for
    their first tokens in that order. Priming each source's whole window in turn (as a first version did) queued the
    second shard of the second source behind ten of the first's and five of the third's; at the start level it got
    its token only when a first item ended, and a fast consumer of a 20-source mix waited for it: 0.34 s to its
    200th sample where one dataset of the same shards took 0.18 (``benchmarks.mix``'s store).

Start level
    Each source keeps one item beyond its share of the level, and every source's first item is read at the start,
    most of them for sources drawn rarely; at one dataset's start level those took the tokens the first draws
    needed. So a mix's engine starts ``sources - 1`` above one dataset's default start, at most twice it (an
    autotuned start the user left alone; see :func:`~wds_async.engine.engine.start_level`), after the same probe
    (8 requests for 10 ms); :meth:`SharedEngine.prime_all` sizes the windows at the level after the probe.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
import threading
from collections.abc import Generator, Iterable, Iterator, Sequence
from typing import Any

from ..errors import EngineError
from ..stats import Stats
from .bridge import Bridge
from .channel import RoutedChannel
from .engine import start_level
from .feed import ItemFeed
from .grouping import Sample
from .spec import StreamSpec
from .work import ItemDone, WorkItem

__all__ = ["SharedEngine", "due_order"]

#: The smallest hand-off list of a route, in bytes (a budget too small for the rule in the module docstring).
MIN_HANDOFF = 64 << 10

#: The buffer's fill above which a route counts its items waiting in the buffer against its window again.
ROOM_FULL = 0.75


def _same_work(a: WorkItem, b: WorkItem) -> bool:
    return (a.shard, a.url, a.start, a.end) == (b.shard, b.url, b.start, b.end)


def due_order(shares: Sequence[float], counts: Sequence[int]) -> list[int]:
    """Each index ``n`` of ``shares`` ``counts[n]`` times, in the order a mix drawing source ``n`` at rate
    ``shares[n]`` needs its next items: the ``k``-th (from 1) at ``k / shares[n]`` draws, ties to the lower index.
    Sources of share 0 are never due."""
    heap = [(1.0 / share, n, 1) for n, share in enumerate(shares) if share > 0 and counts[n] > 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, n, k = heapq.heappop(heap)
        order.append(n)
        if k < counts[n]:
            heapq.heappush(heap, ((k + 1) / shares[n], n, k + 1))
    return order


class SharedEngine:
    """One engine, one route per source (see the module docstring). ``shares`` are the sources' parts of the
    consumption (normalised here); ``spec.routes`` carries each source's handler and member rules."""

    def __init__(self, spec: StreamSpec, stats: Stats, shares: Sequence[float]) -> None:
        if not shares:
            raise ValueError("a shared engine needs at least one source")
        total = float(sum(shares))
        self.shares = [float(s) / total if total > 0 else 1.0 / len(shares) for s in shares]
        self.spec = spec
        self.stats = stats
        self._bridge: Bridge | None = None
        self._feed: ItemFeed | None = None
        self._lock = threading.Lock()
        self._primed: dict[int, collections.deque[tuple[int, WorkItem]]] = {}  # route -> (primed id, item)
        self._next_primed_id = -1
        self._ended_before: dict[int, int] = {}  # route -> its reads ended before its first item of a pass was primed

    def _started(self) -> tuple[Bridge, ItemFeed]:
        with self._lock:
            if self._bridge is None or self._feed is None:
                feed = ItemFeed()
                bridge = Bridge(feed, self.spec, self.stats, routes=len(self.shares))
                bridge.start()
                self._bridge, self._feed = bridge, feed
            return self._bridge, self._feed

    def start_level(self) -> int:
        """The level this engine starts at (after its probe, if it makes one)."""
        config = self.spec.config
        return start_level(config, config.max_buffered_bytes, routes=len(self.shares))

    def window(self, route: int, level: int | None = None) -> int:
        """How many of ``route``'s items to keep submitted at ``level`` (default: the engine's concurrency now; see
        the module docstring)."""
        if level is None:
            level = self.stats.concurrency or self.start_level()
        return 1 + math.ceil(self.shares[route] * level - 1e-9)  # 0.3 * 40 is 12.000000000000002

    def handoff(self, route: int) -> int:
        """The most bytes in one of ``route``'s hand-off lists: a quarter of the budget shared by the routes in
        proportion to the square roots of their shares, at most the hand-off size (see the module docstring)."""
        config = self.spec.config
        roots = [math.sqrt(s) for s in self.shares]
        pool = config.max_buffered_bytes // 4
        return max(MIN_HANDOFF, min(config.handoff_bytes, int(pool * roots[route] / sum(roots))))

    def prime(self, route: int, items: Iterator[WorkItem], count: int | None = None) -> None:
        """Submit ``route``'s first items now, ahead of its first draw (see the module docstring): ``count`` more
        of them, or as many as fill its window."""
        batch = self._primed_items(route, items, count)
        if batch:
            self._started()[1].submit(batch)

    def prime_all(self, plans: Sequence[tuple[int, Iterator[WorkItem]]]) -> None:
        """Prime the routes of ``plans`` (``(route, its planned items)``, in the order of their first draws) in the
        order the mix will need their items: every route's first item, in that order, then the rest of each window
        by when it is due (:func:`due_order`; see the module docstring). One submission for all."""
        batch = []
        for route, plan in plans:
            batch += self._primed_items(route, plan, 1)
        level = self.start_level()  # not the probe's level, which the engine may be at now
        rest = [self.window(route, level) - 1 if self.shares[route] > 0 else 0 for route, _ in plans]
        for n in due_order([self.shares[route] for route, _ in plans], rest):
            batch += self._primed_items(plans[n][0], plans[n][1], 1)  # nothing once that plan ran out
        if batch:
            self._started()[1].submit(batch)

    def _primed_items(self, route: int, items: Iterator[WorkItem], count: int | None) -> list[WorkItem]:
        """``route``'s next ``count`` planned items (None: as many as fill its window), recorded as primed and
        routed, to submit."""
        if self.shares[route] <= 0:
            return []  # drawn only once every other source ran out: nothing to gain from reading it early
        bridge, _ = self._started()
        if route not in self._primed:  # reads of this route ended before its pass: what batches() counts from
            assert isinstance(bridge.channel, RoutedChannel)
            self._ended_before[route] = bridge.channel.ended[route]
        primed = self._primed.setdefault(route, collections.deque())
        wanted = self.window(route) - len(primed) if count is None else count
        batch = []
        for item in itertools.islice(items, max(0, wanted)):  # not zip(items, range(n)): it would take one more
            batch.append(item.routed(route, self._next_primed_id))
            primed.append((self._next_primed_id, item))
            self._next_primed_id -= 1
        return batch

    def batches(self, items: Iterable[WorkItem], route: int) -> Generator[list[Any], None, None]:
        """The lists a bridge over ``items`` alone would hand over (samples, end-of-item markers, errors to
        raise), read on the shared engine as route ``route``."""
        bridge, feed = self._started()
        primed = self._primed.pop(route, collections.deque())
        adopted: dict[int, int] = {}  # primed id -> the item id it stands for
        junk: set[int] = set()  # primed items nobody asked for: read, then dropped
        source = iter(items)
        channel = bridge.channel
        assert isinstance(channel, RoutedChannel)
        # in_flight: submitted and not yet consumed; of those, the ones whose read ended wait in the buffer and
        # hold no reader, so the window counts only the rest (see the module docstring). ended0 and seen tell
        # them apart: reads ended since this call began, less the ends the consumer has taken.
        state = {"in_flight": 0, "exhausted": False, "seen": 0}
        ended0 = self._ended_before.pop(route, channel.ended[route])

        budget = channel.budget

        def reading() -> int:
            if budget.used >= ROOM_FULL * budget.limit:  # more reads would wait for room: count every item
                return state["in_flight"]
            return state["in_flight"] - max(0, channel.ended[route] - ended0 - state["seen"])

        def top_up() -> None:
            window = self.window(route)
            while not state["exhausted"] and reading() < window:
                item = next(source, None)
                if item is None:
                    state["exhausted"] = True
                    drop_primed()
                    return
                state["in_flight"] += 1
                if primed and _same_work(primed[0][1], item):
                    adopted[primed.popleft()[0]] = item.id
                    continue
                drop_primed()
                feed.submit([item.routed(route)])

        def drop_primed() -> None:
            junk.update(primed_id for primed_id, _ in primed)
            primed.clear()

        complete = False
        try:
            top_up()
            for batch in bridge.batches(route, self.handoff(route), hold=True):
                out: list[Any]
                if not (adopted or junk or primed):  # no primed item left: only the ends need counting (at C speed)
                    ends = list(map(type, batch)).count(ItemDone)
                    state["seen"] += ends
                    state["in_flight"] -= ends
                    out = batch
                else:
                    out = []
                    for got in batch:
                        kind = type(got)
                        if kind is Sample:
                            if got.item < 0:
                                if got.item in junk:
                                    continue
                                got.item = adopted[got.item]
                        elif kind is ItemDone:
                            state["seen"] += 1
                            if got.id < 0:
                                if got.id in junk:
                                    junk.discard(got.id)
                                    continue
                                got = ItemDone(adopted.pop(got.id))
                            state["in_flight"] -= 1
                            top_up()
                        out.append(got)
                top_up()  # the window grows with the concurrency: new tokens find this route's items waiting
                if out:
                    yield out
                if state["exhausted"] and not state["in_flight"] and not junk:
                    complete = True  # the route is empty and clean: a repeat of the source may use it again
                    return
            if not channel.routes[route].stopped:
                error = EngineError("the shared engine of a mix stopped before this source's items were read "
                                    "(another source failed: its error is raised where it is drawn)")
                error.__cause__ = channel.failure
                yield [error]
        finally:
            if not complete and not channel.abandoned:
                channel.abandon_route(route)  # its readers stop; its queued bytes return to the budget

    def close(self) -> None:
        """Stop the engine and its loop thread. Idempotent."""
        with self._lock:
            bridge, feed = self._bridge, self._feed
            self._bridge = self._feed = None
        if feed is not None:
            feed.close()
        if bridge is not None:
            bridge.close()
