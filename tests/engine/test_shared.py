"""One engine for several consumers: the routed channel and the shared engine a mix reads its sources on.

The routed channel keeps each route's items apart and in order under one byte budget; the shared engine
delivers to each route exactly what an engine of its own would, however small the budget and however skewed
the consumption (a consumer that waits on one route while the others' readers wait for room must not hang).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

import wds_async as wds
from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess
from tests.conftest import engine_threads, queued_in, sample_digest, wait_until
from wds_async.engine.channel import RoutedChannel
from wds_async.engine.engine import Engine
from wds_async.engine.feed import ItemFeed
from wds_async.engine.grouping import sample_nbytes
from wds_async.engine.limiter import Limiter
from wds_async.engine.shared import SharedEngine, due_order
from wds_async.engine.spec import StreamSpec
from wds_async.engine.work import ItemDone, WorkItem
from wds_async.io import BackendSet
from wds_async.io.budget import ByteBudget
from wds_async.stats import Stats

SOURCES = 8
SHARDS = 5


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    root = tmp_path_factory.mktemp("shared")
    for k in range(SOURCES):
        make_shards(root / f"s{k}", n_shards=SHARDS, shard_bytes=160 << 10, sample_bytes=6 << 10, seed=40 + k)
    with StoreProcess(root, Knobs(seed=3, ttfb=0.005)) as store:
        yield [store.base_url + f"s{k}/shard-{{000000..{SHARDS - 1:06d}}}.tar" for k in range(SOURCES)]


def _take(channel: RoutedChannel, route: int) -> list[object]:
    items, _done = channel.take_route(route, 100, 1 << 30, 0.01, lambda n: channel.budget.release(n), lambda: None)
    return items


def test_routes_keep_their_items_apart_and_in_order() -> None:
    budget = ByteBudget(1 << 20)
    channel = RoutedChannel(budget, ordered=True, routes=2)
    a1, a2, b1 = object(), object(), object()
    channel.open_shard(a1, 0)
    channel.open_shard(b1, 1)
    channel.open_shard(a2, 0)
    budget.add(30)
    channel.put(a2, "a2-sample", 10)  # the second item of route 0 is ready first: it waits for the first
    channel.put(b1, "b1-sample", 10)
    assert _take(channel, 0) == []
    assert _take(channel, 1) == ["b1-sample"]
    channel.put(a1, "a1-sample", 10)
    channel.close_shard(a1)
    assert _take(channel, 0) == ["a1-sample", "a2-sample"]
    assert budget.used == 0


def test_an_error_of_no_route_reaches_every_route_and_a_left_route_frees_its_bytes() -> None:
    budget = ByteBudget(1 << 20)
    channel = RoutedChannel(budget, ordered=True, routes=3)
    token = object()
    channel.open_shard(token, 2)
    budget.add(500)
    channel.put(token, "held", 500)
    channel.abandon_route(2)  # its consumer left: the bytes it held go back to the budget
    assert budget.used == 0 and not channel.abandoned
    failure = RuntimeError("engine failed")
    broken = object()
    channel.open_shard(broken)  # no route: the engine's own failure
    channel.put_error(broken, failure)
    channel.close_shard(broken)
    assert _take(channel, 0) == [failure] and _take(channel, 1) == [failure]
    assert channel.failure is failure


def test_only_the_route_the_consumer_waits_on_may_overdraw() -> None:
    budget = ByteBudget(100)
    channel = RoutedChannel(budget, ordered=True, routes=2)
    a, b = object(), object()
    channel.open_shard(a, 0)
    channel.open_shard(b, 1)
    assert _take(channel, 1) == []  # the consumer now waits on route 1
    assert channel.starving_for(b) and not channel.starving_for(a)


def test_the_overdraft_passes_to_the_route_the_consumer_starves_on_now() -> None:
    """Route 0's reader took the overdraft while the consumer starved on route 0, then waits for room again without
    having put a sample (the consumer took route 0's last one and went on to route 1). Route 1's reader, the one
    the consumer starves for now, must get the overdraft: kept by route 0's reader until a put, it waited for a put
    no reader could make, and a mix under a tight budget hung (benchmarks.mix --budget 32MiB)."""

    async def run() -> None:
        budget = ByteBudget(100)
        channel = RoutedChannel(budget, ordered=True, routes=2)
        a, b = object(), object()
        channel.open_shard(a, 0)
        channel.open_shard(b, 1)
        budget.add(150)  # partial samples fill the budget: nothing is deliverable
        assert _take(channel, 0) == []  # the consumer starves on route 0
        await asyncio.wait_for(budget.wait_for_room(a, channel), 1)  # a overdraws, reads a chunk, no sample yet
        again = asyncio.ensure_future(budget.wait_for_room(a, channel))
        assert _take(channel, 1) == []  # the consumer starves on route 1 now
        budget.wake()  # what the consumer's starving() does on the loop
        await asyncio.wait_for(budget.wait_for_room(b, channel), 1)
        await asyncio.sleep(0.01)
        assert not again.done()  # a waits for room like any reader the consumer does not starve for
        assert _take(channel, 0) == []  # back on route 0: a's turn again, b no longer starved for
        budget.wake()
        await asyncio.wait_for(again, 1)

    asyncio.run(run())


@pytest.mark.parametrize("budget", [1 << 20, 64 << 20])
def test_each_route_gets_what_an_engine_of_its_own_gives_under_any_budget(sources: list[str], budget: int) -> None:
    """Eight sources consumed in a skewed rotation (the first far more often than the last) through a shared
    engine whose byte budget holds a few shards at most: no hang, and each source's samples are exactly those
    of the source read alone, in the same order."""
    alone = [sample_digest(wds.WebDataset(url)) for url in sources]
    datasets = [wds.WebDataset(url) for url in sources]
    items = [ds.work_items() for ds in datasets]
    weights = [2.0 ** -k for k in range(SOURCES)]
    spec = StreamSpec(wds.EngineConfig(max_buffered_bytes=budget, deterministic=True))
    engine = SharedEngine(spec, Stats(), weights)
    try:
        for route in range(0, SOURCES, 2):  # half the routes primed, half not
            engine.prime(route, iter(items[route]))
        streams = [engine.batches(iter(items[route]), route) for route in range(SOURCES)]
        got: list[list[object]] = [[] for _ in range(SOURCES)]
        live = list(range(SOURCES))
        turn = 0
        while live:
            # Route k is visited about once per 2**k turns, the way a weighted mix visits its sources.
            route = live[turn % len(live)] if turn % 3 else live[0]
            turn += 1
            batch = next(streams[route], None)
            if batch is None:
                live.remove(route)
                continue
            got[route] += [x for x in batch if not isinstance(x, ItemDone)]
        assert len(engine_threads()) >= 1
        for route in range(SOURCES):
            assert sample_digest(got[route]) == alone[route], f"route {route}"  # type: ignore[arg-type]
    finally:
        engine.close()


def test_items_are_due_in_proportion_to_their_sources_shares() -> None:
    # The k-th further item of source n is due at k / share: 0 at 2, 4, 6; 1 at 4, 8; 2 at 4 (ties: lower first).
    assert due_order([0.5, 0.25, 0.25], [3, 2, 1]) == [0, 0, 1, 2, 0, 1]
    assert due_order([0.5, 0.0, 0.5], [2, 5, 0]) == [0, 0]  # share 0: never due; count 0: nothing to order
    # 0 at 2, 4, ... 12; 1 at 4, 8, 12; 2 at 8, 16: the rare source's items come where they are due.
    assert due_order([0.5, 0.25, 0.125], [6, 3, 2]) == [0, 0, 1, 0, 0, 1, 2, 0, 0, 1, 2]


class _Submissions(ItemFeed):
    """A feed that records what is submitted to it and passes it on to the engine's."""

    def __init__(self, feed: ItemFeed) -> None:
        super().__init__()
        self.feed = feed
        self.submitted: list[WorkItem] = []

    def submit(self, items: Sequence[WorkItem]) -> None:
        self.submitted += items
        self.feed.submit(items)


def test_a_mix_primes_every_first_item_then_the_rest_by_when_it_is_due(sources: list[str]) -> None:
    """First items in the order given (of first draws), then the windows interleaved by ``due_order``, in one
    submission; a plan shorter than its window gives what it has."""
    plans = [wds.WebDataset(url).work_items() for url in sources[:3]]
    spec = StreamSpec(wds.EngineConfig(max_connections=8, deterministic=True))
    engine = SharedEngine(spec, Stats(), [0.6, 0.3, 0.1])
    try:
        _bridge, feed = engine._started()
        recorder = engine._feed = _Submissions(feed)
        windows = [engine.window(route) for route in range(3)]
        assert windows == [1 + 5, 1 + 3, 1 + 1]  # 1 + ceil(share x 8)
        engine.prime_all([(2, iter(plans[2])), (0, iter(plans[0])), (1, iter(plans[1][:2]))])
        got = [(item.route, item.shard) for item in recorder.submitted]
        assert got[:3] == [(2, 0), (0, 0), (1, 0)]
        # Then by when each is due: route 0's next at 1/0.6, 2/0.6, ... draws (the 4 its plan has left; its window
        # would take 5), route 1's at 1/0.3 (the one its shortened plan has left), route 2's at 1/0.1.
        assert got[3:] == [(0, 1), (0, 2), (1, 1), (0, 3), (0, 4), (2, 1)]
    finally:
        engine.close()


def test_a_primed_item_the_source_does_not_ask_for_is_read_and_dropped(sources: list[str]) -> None:
    ds = wds.WebDataset(sources[0])
    planned = ds.work_items()
    engine = SharedEngine(StreamSpec(wds.EngineConfig(deterministic=True)), Stats(), [1.0])
    try:
        engine.prime(0, iter(planned))
        later = [WorkItem(id=item.id, shard=item.shard, url=item.url) for item in planned[2:]]  # a changed plan
        got = [x for batch in engine.batches(iter(later), 0) for x in batch]
    finally:
        engine.close()
    assert {x.url for x in got if not isinstance(x, ItemDone)} == {item.url for item in later}  # type: ignore[attr-defined]
    assert [x.id for x in got if isinstance(x, ItemDone)] == [item.id for item in later]  # type: ignore[attr-defined]
    assert sample_digest([x for x in got if not isinstance(x, ItemDone)]) == sample_digest(  # type: ignore[misc]
        wds.WebDataset([item.url for item in later]))


def test_the_shared_engine_is_one_loop_thread_and_closes(sources: list[str]) -> None:
    before = len(engine_threads())
    engine = SharedEngine(StreamSpec(wds.EngineConfig()), Stats(), [1.0, 1.0, 1.0])
    streams = [engine.batches(iter(wds.WebDataset(url).work_items()), route) for route, url in
               enumerate(sources[:3])]
    for stream in streams:
        next(stream)
    assert len(engine_threads()) == before + 1
    for stream in streams:
        stream.close()
    engine.close()
    assert len(engine_threads()) == before


def test_a_route_s_list_stays_in_the_budget_until_its_next_list_is_asked_for(sources: list[str]) -> None:
    items = wds.WebDataset(sources[0]).work_items()[:2]
    engine = SharedEngine(StreamSpec(wds.EngineConfig(max_buffered_bytes=1 << 20, deterministic=True)), Stats(), [1.0])
    try:
        stream = engine.batches(iter(items), 0)
        first = next(stream)
        assert engine._bridge is not None and isinstance(engine._bridge.channel, RoutedChannel)
        channel = engine._bridge.channel
        budget = channel.budget
        # Both items fit the budget: once they are read whole, only the consumer moves it.
        assert wait_until(lambda: channel.ended[0] == 2 and budget.reserved == 0)
        queued = sum(n for _, n in queued_in(channel.routes[0]))
        size = sum(sample_nbytes(x) for x in first if not isinstance(x, ItemDone))
        assert size > 0 and queued > 0
        assert budget.used == queued + size  # the list handed over is still counted
        assert next(stream)
        # The first list left the budget when the second was asked for; the second, taken from what was queued,
        # is counted until the consumer is done with it.
        assert wait_until(lambda: budget.used == queued)
        stream.close()
        assert wait_until(lambda: budget.used == 0)  # and the second when the consumer stopped
    finally:
        engine.close()


def test_a_route_s_lists_share_a_quarter_of_the_budget_by_square_roots() -> None:
    mib = 1 << 20
    shares = [0.64] + [0.018] * 20
    engine = SharedEngine(StreamSpec(wds.EngineConfig(max_buffered_bytes=256 * mib)), Stats(), shares)
    roots = 0.8 + 20 * math.sqrt(0.018)
    assert engine.handoff(0) == int(64 * mib * 0.8 / roots)  # the square root of its share of 64 MiB
    assert engine.handoff(1) == int(64 * mib * math.sqrt(0.018) / roots)
    assert sum(engine.handoff(i) for i in range(21)) <= 64 * mib
    # lists in proportion to the square roots make the fewest takes per sample for what they pin in the budget
    takes = sum(s / engine.handoff(i) for i, s in enumerate(engine.shares))
    for other in ([64 * mib * s for s in engine.shares], [64 * mib / 21] * 21):
        assert takes < sum(s / h for s, h in zip(engine.shares, other))
    few = SharedEngine(StreamSpec(wds.EngineConfig(max_buffered_bytes=256 * mib)), Stats(), [0.9, 0.1])
    assert few.handoff(0) == few.handoff(1) == 16 * mib  # never more than the hand-off size
    small = SharedEngine(StreamSpec(wds.EngineConfig(max_buffered_bytes=mib)), Stats(), [0.5] * 40)
    assert small.handoff(0) == 64 << 10  # never below 64 KiB


def test_a_routed_work_item_is_the_item_with_its_route() -> None:
    item = WorkItem(id=3, shard=1, url="http://127.0.0.1:1/a.tar", start=512, end=4096, compressed=False)
    assert item.routed(2) == WorkItem(id=3, shard=1, url=item.url, start=512, end=4096, compressed=False, route=2)
    assert item.routed(0, -7) == WorkItem(id=-7, shard=1, url=item.url, start=512, end=4096, compressed=False,
                                          route=0)
    assert item.route is None and item.id == 3  # the original is unchanged


def test_weights_size_the_prefetch_windows() -> None:
    engine = SharedEngine(StreamSpec(wds.EngineConfig(max_connections=40)), Stats(), [0.3, 0.695, 0.005])
    engine.stats.concurrency = 40
    assert [engine.window(route) for route in range(3)] == [13, 29, 2]


def test_a_route_needs_shares(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one"):
        SharedEngine(StreamSpec(), Stats(), [])


def test_items_read_ahead_of_the_consumer_free_their_place_in_the_window(tmp_path: Path) -> None:
    """A route's window counts the items still being read, not those waiting in the buffer for the consumer:
    with room in the budget, a route whose window of items is read keeps its readers busy with the next ones
    (counting the buffered ones left readers idle and kept a mix's autotuner from seeing work waiting)."""
    paths = [str(p) for p in make_shards(tmp_path, n_shards=9, shard_bytes=4 << 20, sample_bytes=256 << 10, seed=5)]
    spec = StreamSpec(wds.EngineConfig(max_connections=2, max_buffered_bytes=256 << 20, deterministic=True,
                                       handoff_max_bytes=1 << 20))
    engine = SharedEngine(spec, Stats(), [0.05, 0.95])
    assert engine.handoff(0) == 1 << 20  # route 0's hand-offs are 1 MiB: part of an item each
    try:
        engine.stats.concurrency = 2
        window = engine.window(0)
        assert window == 2
        stream = engine.batches(iter(wds.WebDataset(paths).work_items()), 0)
        first = next(stream)  # part of the first item, none of its end
        assert not any(isinstance(x, ItemDone) for x in first)
        channel = engine._started()[0].channel
        assert isinstance(channel, RoutedChannel)
        deadline = time.monotonic() + 30
        while channel.ended[0] < window:  # the window's items are read and wait in the buffer
            assert time.monotonic() < deadline, "the window's items were not read"
            time.sleep(0.01)
        time.sleep(0.2)
        assert channel.ended[0] == window  # nothing more was submitted while the consumer was away
        got = first + next(stream)  # the consumer is back: the route tops up past the items waiting in the buffer
        assert not any(isinstance(x, ItemDone) for x in got)  # still within the first item: none was consumed
        while channel.ended[0] <= window:
            assert time.monotonic() < deadline, "no item beyond the window was read while the others waited"
            time.sleep(0.01)
        got += [x for batch in stream for x in batch]
        assert [x.id for x in got if isinstance(x, ItemDone)] == list(range(9))  # type: ignore[attr-defined]
        alone = ({k: v for k, v in x.items() if k != "__local_path__"} for x in wds.WebDataset(paths))
        assert sample_digest([x for x in got if not isinstance(x, ItemDone)]) == sample_digest(alone)  # type: ignore[misc]
    finally:
        engine.close()


class _LastComeFirstServed(Limiter):
    """A limiter that hands a freed token to the task that queued last: any order of tokens must leave a route's
    items in their order."""

    def _hand_on(self) -> None:
        while self._waiters and self.borrowed < self.total:
            fut = self._waiters.pop()
            if not fut.done():
                self.borrowed += 1
                fut.set_result(None)


def test_a_routes_order_is_set_when_its_items_are_dispatched_not_when_they_get_tokens(tmp_path: Path) -> None:
    """A routed item takes its place in its route's order when the engine takes it from the feed. Opened when it
    got its token instead (a first version), an item dispatched later could come first whenever tokens were
    not handed out in dispatch order: here they never are, and with one token the route would deliver its items
    0, 5, 4, 3, 2, 1."""
    paths = [str(p) for p in make_shards(tmp_path, n_shards=6, shard_bytes=64 << 10, sample_bytes=4 << 10, seed=9)]
    spec = StreamSpec(wds.EngineConfig(deterministic=True))
    channel = RoutedChannel(ByteBudget(64 << 20), ordered=True, routes=1)
    feed = ItemFeed()
    feed.submit([WorkItem(id=n, shard=n, url=url, route=0) for n, url in enumerate(paths)])
    feed.close()
    engine = Engine(feed, spec, backends=BackendSet(spec.config), channel=channel, stats=Stats(),
                    limiter=_LastComeFirstServed(1), yield_tokens=True)
    thread = threading.Thread(target=asyncio.run, args=(engine.run(),))
    thread.start()
    got: list[object] = []
    try:
        while not (got and isinstance(got[-1], ItemDone) and got[-1].id == len(paths) - 1):
            items, done = channel.take_route(0, 1000, 1 << 30, 5.0, channel.budget.release, lambda: None)
            got += items
            assert items or not done, f"the route ended after {got[-1:]}"
    finally:
        thread.join(10)
    assert [x.id for x in got if isinstance(x, ItemDone)] == list(range(len(paths)))  # type: ignore[attr-defined]
    alone = ({k: v for k, v in x.items() if k != "__local_path__"} for x in wds.WebDataset(paths))
    assert sample_digest([x for x in got if not isinstance(x, ItemDone)]) == sample_digest(alone)  # type: ignore[misc]
