"""The engine: many work items in flight, parsed as they arrive, into one byte-bounded channel.

``Engine.run()`` starts as many reader coroutines as the concurrency may ever reach, in a TaskGroup. Each
takes a token of the engine's :class:`~wds_async.engine.limiter.Limiter` (whose total the
:class:`~wds_async.engine.autotune.Autotuner` or a fixed ``max_connections`` sets), then the next
:class:`~wds_async.engine.work.WorkItem` (a whole shard, or a byte range of one at sample boundaries; plain URLs
become whole-shard items) from the shared iterator, so items open in plan order. It reads the item
(:mod:`wds_async.engine.itemread`: through its source and a :class:`~wds_async.engine.parts.PartedRead` into a
sans-IO tar parser and a grouper) and puts complete samples, tagged with the item's id, into the
:class:`~wds_async.engine.channel.SampleChannel`, followed by an :class:`~wds_async.engine.work.ItemDone` marker. Before
every read a reader waits on the shared :class:`~wds_async.io.budget.ByteBudget`, so a slow consumer stops the
downloads.

Errors that end an item are translated into our tree (:mod:`wds_async.engine.failures`: an exception group
becomes its most meaningful leaf, a ``MemoryError`` stays one and names the shard, anything foreign becomes
:class:`~wds_async.errors.EngineError`) and go to the user's handler (:mod:`wds_async.engine.outcomes`: skip,
stop or raise at this item's position); an error outside any item reaches the consumer translated the same way.

The engine owns no thread: the bridge runs it in its loop thread. Nor does it assume it is alone: the node
service (:mod:`wds_async.service`) runs one engine per client over one shared ``limiter`` (then neither
created nor autotuned here), with ``yield_tokens=True`` so that a reader waiting for room in its own
client's budget gives its token back meanwhile, and a slow client stalls only itself.

Items usually exist before the engine starts (a list, or a lazy iterator pulled in the loop thread). An
:class:`~wds_async.engine.feed.ItemFeed` in their place makes the engine long-lived: readers await the next item
submitted from another thread, and the engine finishes only once the feed is closed and drained (a map-style
dataset's ``__getitems__`` calls submit batches through :class:`~wds_async.engine.fetcher.Requests`). The shard
cache's lookahead sees the feed's queued items (``ItemFeed.peek``) as it sees an item list's next ones. With a
:class:`~wds_async.engine.channel.RoutedChannel` (a mix's sources on one engine) each submitted item gets a reader
of its own (see :meth:`Engine._dispatch`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from asyncio import TaskGroup
from collections.abc import Iterable, Iterator, Sized

from ..config import EngineConfig
from ..io import BackendSet
from ..io.backend import capabilities_of
from ..io.budget import ByteBudget
from ..io.source import ItemSource, StoreSource
from ..stats import Stats
from .autotune import Autotuner
from .channel import ChannelClosed, RoutedChannel, SampleChannel
from .failures import leaves, pick, translate
from .feed import ItemFeed
from .itemread import ItemReads
from .limiter import Limiter
from .outcomes import Outcomes
from .spec import Handler, StreamSpec
from .startup import PROBE_LEVEL
from .tokens import Tokens
from .work import ItemDone, WorkItem

__all__ = ["Engine", "Handler"]  # Handler: re-exported from .spec, where it is defined

log = logging.getLogger("wds_async")

_GROUP = BaseExceptionGroup

#: The byte-budget allowance of one open http(s) stream (``HttpBackend.capabilities.buffer_allowance``): the engine
#: allows at most as many streams as fit in half the budget.
STREAM_ALLOWANCE = 640 << 10
#: Readers started per turn of the loop at the start: between turns the loop polls, so the first readers'
#: connections complete (and their requests go out) while the rest are set up, not after all of them.
START_AT_ONCE = 8



def connection_cap(config: EngineConfig, budget_limit: int) -> int:
    """The most requests an engine lets stream at once. Every open stream counts its transport's buffer allowance
    in the byte budget (see RangeReader), so concurrency beyond what half the budget can hold would only make
    readers wait for room."""
    return min(config.connections, max(1, budget_limit // (2 * STREAM_ALLOWANCE)))


#: ``EngineConfig.start_connections`` when the user left it alone.
_DEFAULT_START: int = EngineConfig.start_connections


def _default_start(config: EngineConfig) -> bool:
    """Whether the start is the library's to choose: an autotuned start left at its default (a chosen or learned
    start is kept). Then a list of local files starts at the floor, and any other cold start probes first."""
    return config.autotune and config.start_connections == _DEFAULT_START


def start_level(config: EngineConfig, budget_limit: int, *, local: bool = False, routes: int = 1) -> int:
    """The concurrency an engine of its own limiter starts at: with ``local`` (every item from a backend with
    ``local_reads``), an autotuned engine whose start is the default starts at its floor. The engine of a mix
    of ``routes`` sources starts ``routes - 1`` higher where the start is the default, at most twice one
    dataset's start: each source keeps one item beyond its share of the level (engine/shared.py), and every
    source's first item is read at the start, most of them for sources that are drawn rarely; at the level of
    one dataset those took the tokens of the items the first draws need (a 20-source mix waited 1.4x what one
    dataset of the same shards did over its first 1,500 samples). The bound keeps a mix of hundreds of sources,
    in each of several DataLoader workers, from opening hundreds of connections per worker before the
    autotuner has seen an answer."""
    if local and _default_start(config):
        return min(connection_cap(config, budget_limit), config.min_connections)
    extra = min(max(0, routes - 1), config.first_connections) if _default_start(config) else 0
    first = config.first_connections + extra
    return min(connection_cap(config, budget_limit), first)


def probed_start(config: EngineConfig, budget_limit: int, *, local: bool = False,
                 routes: int = 1) -> tuple[int, int | None]:
    """``(first level, probe_to)`` of an autotuned engine: a cold start at the default start level probes with
    ``PROBE_LEVEL`` requests and goes to :func:`start_level` (``probe_to``) unless the store answers within
    ``PROBE_WAIT`` (see engine/startup.py, ``probe``); a start the user set, a learned one (``early_start`` off)
    and a list of local files start at :func:`start_level` (``probe_to`` None). A mix's engine (``routes``) probes
    too: its sources size their first windows at the level after the probe (``SharedEngine.prime_all``), and
    going to its start level at once cost its first sample 9 ms (0.097 against 0.088 s, medians of 8 rounds in
    turn on ``benchmarks.mix``'s store)."""
    level = start_level(config, budget_limit, local=local, routes=routes)
    if local or not config.early_start or not _default_start(config) or level <= PROBE_LEVEL:
        return level, None
    return PROBE_LEVEL, level


#: How many of a list's first items :func:`_all_local` looks at: a pass over 100,000 shards would otherwise delay
#: its first read by a tenth of a second.
_LOCAL_PROBE = 64


def _all_local(urls: object, backends: BackendSet) -> bool:
    """Whether ``urls``, a known list of URLs or work items, comes from backends with ``local_reads``, judged by
    its first :data:`_LOCAL_PROBE` items (a list that turns remote later starts low and ramps)."""
    if isinstance(urls, ItemFeed) or not isinstance(urls, list) or not urls:
        return False
    for entry in urls[:_LOCAL_PROBE]:
        url = entry.url if isinstance(entry, WorkItem) else str(entry)
        if not capabilities_of(backends.for_url(url)).local_reads:
            return False
    return True


class Engine:
    """Fetches ``urls`` concurrently into ``channel`` (see module docstring)."""

    def __init__(self, urls: Iterable[str | WorkItem] | ItemFeed, spec: StreamSpec, *, backends: BackendSet,
                 channel: SampleChannel, stats: Stats, source: ItemSource | None = None, limiter: Limiter | None = None,
                 yield_tokens: bool = False) -> None:
        """Read ``urls`` (URLs or work items, or an :class:`ItemFeed` of work items) as ``spec`` says, through ``backends`` and ``source`` (the store, or
        the shard cache wrapped around it), into ``channel``, counting in ``stats``."""
        #: Where items' bytes come from: the store, or the shard cache wrapped around it (see io/source.py).
        self.source: ItemSource = source if source is not None else StoreSource()
        #: A limiter given by the caller is shared with other engines (the node service runs one engine per
        #: client over one node-wide limiter, tuned by its own autotuner): used as is, never autotuned here.
        self._shared_limiter = limiter
        #: Give the token back while waiting for room in the byte budget (see tokens.py).
        self.yield_tokens = yield_tokens
        self.spec = spec
        # A list, or a lazy iterator (resampled or pipeline shard streams), pulled only in the loop thread.
        self.urls = urls
        self.backends = backends
        self.channel = channel
        self.budget: ByteBudget = channel.budget
        self.config = spec.config
        self.stats = stats
        self.log_interval = spec.log_interval
        self.limiter = limiter if limiter is not None else Limiter(1)
        self._exhausted = False  # every item has been handed to a reader
        #: What ends an item becomes (the handler's answer), and whether the engine or a route stops reading.
        self._outcomes = Outcomes(spec, channel, stats)
        self.stats.shards_total = len(urls) if isinstance(urls, Sized) else 0
        self.stats.buffer_limit = self.budget.limit
        self.stats.budget = self.budget
        #: What a reader does with its token while it cannot read, and how it reads one item (both made in
        #: ``run``, once the limiter is known).
        self._tokens: Tokens
        self._item_reads: ItemReads

    async def run(self) -> None:
        """Fetch every shard; errors that escape the handler logic are delivered via the channel."""
        shards: Iterator[WorkItem] | ItemFeed = self.urls if isinstance(self.urls, ItemFeed) else self._items()
        config = self.config
        cap = connection_cap(config, self.budget.limit)
        tuner = None
        if self._shared_limiter is not None:
            self.stats.concurrency = self.stats.concurrency_cap = self.limiter.total
            self.stats.concurrency_reason = "shared: the node service's limiter"
        elif config.autotune:
            local = _default_start(config) and _all_local(self.urls, self.backends)  # (no scan otherwise)
            # A mix's routes prime their first windows at the level after the probe (SharedEngine.prime_all)
            routes = len(self.channel.routes) if isinstance(self.channel, RoutedChannel) else 1
            first, probe_to = probed_start(config, self.budget.limit, local=local, routes=routes)
            self.limiter = Limiter(first)
            tuner = Autotuner(self.limiter, self.stats, self.budget, minimum=min(config.min_connections, cap),
                              cap=cap, has_work=lambda: not self._exhausted, cold=config.early_start,
                              start_reason="start: local files, from min_connections" if local else "start",
                              probe_to=probe_to)
        else:
            self.limiter = Limiter(start_level(config, self.budget.limit))
            self.stats.concurrency = self.stats.concurrency_cap = cap
            self.stats.concurrency_reason = f"fixed: max_connections={config.connections}" + (
                f", lowered to {cap}: each open stream takes {STREAM_ALLOWANCE >> 10} KiB of max_buffered_bytes="
                f"{self.budget.limit}" if cap < config.connections else "")
        self._tokens = Tokens(self.limiter, self.channel, yield_tokens=self.yield_tokens)
        self._item_reads = ItemReads(self.source, self.backends, self.channel, self.stats, self.config,
                                     self._outcomes, self._tokens, self.limiter)
        try:
            async with TaskGroup() as outer:
                logger = outer.create_task(self._log_periodically()) if self.log_interval else None
                tuning = outer.create_task(tuner.run()) if tuner is not None else None
                self.source.start(outer)
                async with TaskGroup() as readers:
                    if isinstance(shards, ItemFeed) and isinstance(self.channel, RoutedChannel):
                        readers.create_task(self._dispatch(shards, readers))
                    else:
                        count = len(self.urls) if isinstance(self.urls, Sized) else cap
                        for n in range(min(cap, count)):  # the limiter, not the task count, sets the concurrency
                            readers.create_task(self._reader(shards))
                            if n % START_AT_ONCE == START_AT_ONCE - 1:
                                await asyncio.sleep(0)
                for task in (logger, tuning):
                    if task is not None:
                        task.cancel()
                self.source.close()
        except ChannelClosed:
            pass
        except _GROUP as group:  # delivered as one exception of our tree, never as a group
            if not all(isinstance(e, ChannelClosed) for e in leaves(group)):
                self._fail(translate(group))
        except Exception as exc:  # a bug, not a shard problem: surface it to the consumer
            self._fail(translate(exc))
        finally:
            self.stats.finished = time.perf_counter()
            self.channel.finish()

    def _items(self) -> Iterator[WorkItem]:
        assert not isinstance(self.urls, ItemFeed)
        """The work in order: work items as given, or one whole-shard item per plain URL. A source that looks
        ahead (the shard cache's identity checks) is told of the next ``source.lookahead`` items early, so
        that what it starts for them runs before they are handed out."""
        items = (entry if isinstance(entry, WorkItem) else WorkItem(id=n, shard=n, url=str(entry))
                 for n, entry in enumerate(self.urls))
        ahead = self.source.lookahead
        if not ahead:
            yield from items
            return
        window: collections.deque[WorkItem] = collections.deque()
        for item in items:
            window.append(item)
            self.source.ahead(item.url, self.backends.for_url(item.url))
            if len(window) > ahead:
                yield window.popleft()
        yield from window

    def _fail(self, exc: BaseException) -> None:
        if isinstance(exc, ChannelClosed):
            return
        log.debug("engine failed", exc_info=exc)
        token = object()
        self.channel.open_shard(token)
        self.channel.put_error(token, exc)
        self.channel.close_shard(token)

    async def _log_periodically(self) -> None:
        assert self.log_interval
        while True:
            await asyncio.sleep(self.log_interval)
            log.info("wds-async: %s", self.stats.line())

    async def _next_from_feed(self, feed: ItemFeed) -> WorkItem | None:
        """The feed's next item (waiting for one); the source hears of the items queued behind it early."""
        item = await feed.get()
        ahead = self.source.lookahead
        if item is not None and ahead:
            for queued in feed.peek(ahead):
                self.source.ahead(queued.url, self.backends.for_url(queued.url))
        return item

    async def _reader(self, items: Iterator[WorkItem] | ItemFeed) -> None:
        """Take a token, then the next item; read it; give the token back; repeat until no items remain.
        From a feed the item comes first, then the token: a reader waiting for work must not hold a token,
        or idle readers could hold every token while a lowered limit keeps a requeued read waiting for one."""
        feed = items if isinstance(items, ItemFeed) else None
        while not (self._outcomes.stopping or self.channel.abandoned):
            item: WorkItem | None = None
            if feed is not None:
                item = await self._next_from_feed(feed)
                if item is None:
                    self._exhausted = True
                    return
            await self.limiter.acquire()
            try:
                if item is None:
                    item = next(items, None)  # type: ignore[arg-type]  # not a feed here
                    if item is None:
                        self._exhausted = True
                        return
                if self._outcomes.stopping or self.channel.abandoned:
                    return
                if self._outcomes.route_ended(item):
                    continue
                await self._read_item(item)
            finally:
                self.limiter.release()

    async def _dispatch(self, feed: ItemFeed, readers: TaskGroup) -> None:
        """A routed channel's readers: one task per submitted item, each waiting for a token in submission order.

        Routes (a mix's sources) are consumed by turns, so a route's readers may wait for room in the budget
        until its consumer comes back to it, while the consumer waits for another route's next item. With a
        fixed set of readers that item could sit in the feed behind items whose readers all wait; with a task
        per item it is always held by a reader, and gets a token since waiting readers give theirs back
        (``yield_tokens``). The limiter, as everywhere, sets how many read at once."""
        while not (self._outcomes.stopping or self.channel.abandoned):
            item = await self._next_from_feed(feed)
            if item is None:
                self._exhausted = True
                return
            token = object()
            self.channel.open_shard(token, item.route)  # its place in its route's order (see _read_routed)
            readers.create_task(self._read_routed(item, token))

    async def _read_routed(self, item: WorkItem, token: object) -> None:
        """Read ``item`` once a token is free. It took its place in its route's order when it was dispatched, not
        when it gets its token: a token that frees up after the limiter handed one to a waiting task, and before
        that task runs, goes to whichever task asks first, which may be one dispatched later; opened at its token,
        the later item would come first in a deterministic order. The item the consumer starves for takes its token
        over the limit (``Tokens.first``)."""
        read = False
        try:
            await self._tokens.first(token)
            try:
                if not (self._outcomes.stopping or self.channel.abandoned or self._outcomes.route_ended(item)):
                    read = True
                    await self._read_item(item, token)
            finally:
                self.limiter.release()
        finally:
            if not read and not self.channel.abandoned:
                self.channel.close_shard(token)

    async def _read_item(self, item: WorkItem, token: object | None = None) -> None:
        """One item from open to close in the channel (opened already when ``token`` is given), errors sent to the
        handler."""
        if token is None:
            token = object()
            self.channel.open_shard(token, item.route)
        self.stats.shards_in_flight += 1
        try:
            await self._item_reads.fetch(item, token)
            self.stats.shards_done += 1
            self.channel.put(token, ItemDone(item.id), 0)
        except Exception as exc:  # every failure ends in the channel, or the handler skips it
            self._outcomes.failed(token, item, pick(exc))
        finally:
            self.stats.shards_in_flight -= 1
            self.budget.forget(token)
            if not self.channel.abandoned:
                self.channel.close_shard(token)
