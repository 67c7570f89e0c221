"""``IndexedWebDataset``: random access to the samples of tar shards, through their index.

A map-style dataset (``torch.utils.data.Dataset`` when torch is installed, a plain sequence without it): ``ds[i]``
is the ``i``-th sample in index order (shard by shard, in the order of ``urls``), exactly the dict streaming yields
for it (``__key__``, ``__url__``, one ``bytes`` value per extension; ``__local_path__`` for a local shard), after
the per-sample stages added with the fluid methods (``decode``, ``map``, ``to_tuple``, ...).

How a batch is read (:meth:`IndexedWebDataset.__getitems__`, which torch's DataLoader calls with a batch of sampler
indices): the indices are mapped to ``(shard, sample)`` through the index (:class:`~wds_async.index.ShardIndex`);
samples of one shard that lie next to each other are coalesced into one byte range (up to ``coalesce_bytes``);
each range becomes one :class:`~wds_async.engine.work.WorkItem` that carries the shard's identity from the index,
so a shard rewritten since the index was built fails with :class:`~wds_async.errors.ObjectChanged`. All ranges of
a batch are submitted at once to this process's long-lived engine (:class:`~wds_async.engine.fetcher.Requests`),
which reads them concurrently through the same limiter, autotuner, byte budget, retries and ranged reads as
streaming. Every sample returned is checked to be the one asked for (its key and offset).

Reading ahead: torch's DataLoader hands a worker's dataset one batch of indices at a time (the batches queued for
the worker are out of its sight), so each batch would pay the store's time to first byte in turn. Where the dataset
knows its sampler's order, each process finds where a batch lies in it and starts its next ``readahead`` batches at
once (:mod:`wds_async.data.readahead`): a sampler it follows (:meth:`follow`, which
:class:`~wds_async.BlockShuffleSampler` calls), or else, in a forked DataLoader worker, the DataLoader's own sampler
replayed from what the worker inherited at the fork (:mod:`wds_async.data.inherited`: ``RandomSampler`` and the rest
of torch's samplers). A guess that misses is dropped, and an error of a batch read ahead is raised only when that
batch is asked for.

Processes: nothing runs at construction but loading and matching the index. The engine (a loop thread and its
connections) starts on the first read in each process, with this process's share of the node budgets
(:mod:`wds_async.node`); a forked DataLoader worker sees another pid and starts its own. Pickling drops it
(spawned workers start their own too).

Shard cache (``cache_dir``): the first read of a shard in a process whose copy is not on disk yet reads the
whole shard (into the cache, as streaming fills it) and takes the samples asked for from it; later reads are
ranges of the local copy, with no store bytes. Copies are trusted (``cache_validate=False`` by default): a
copy of another version than the index's fails its reads with ``ObjectChanged``, as the store would.

Without an index (``nsamples=``, one count per shard: what wids' shard lists give), a shard is read whole on its first
use in each process, through the cache when there is one, and its layout (keys, offsets, ends) learned from the
samples that read delivered; a count that differs from the shard's is a ``ShardFormatError`` naming it.
"""

from __future__ import annotations

import bisect
import copy
import multiprocessing.util
import operator
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..backends.pipe import pipes_allowed
from ..cache.disk import make_cache
from ..config import EngineConfig, RetryPolicy
from ..engine.grouping import Sample
from ..engine.spec import StreamSpec
from ..index.format import ShardEntry, ShardIndex
from ..io import import_backends, scheme_options, validate_url
from ..node import share_config
from ..stats import SharedStats
from ..urls import expand_urls, redact_url, scheme_of
from ._torch import HAVE_TORCH
from .inherited import inherited_order, watch_forks
from .reads import ProcessReads, ShardLayout
from .sample_stages import SampleStages
from .topology import worker_info

if TYPE_CHECKING or HAVE_TORCH:
    from torch.utils.data import Dataset as _MapBase
else:  # a plain sequence: __len__ and __getitem__ make it one

    class _MapBase:
        def __class_getitem__(cls, item: Any) -> Any:
            return cls


if TYPE_CHECKING:
    from typing import Self

__all__ = ["IndexedWebDataset"]

#: Where the autotuner starts (unless a config is given): a DataLoader batch of 64 samples in random order is 64
#: requests, each mostly time to first byte, so a batch's worth in flight at once is the useful start. A process's
#: first batch raises it to what that batch puts in flight: its size, times ``1 + readahead`` where it reads ahead.
START_CONNECTIONS = 64

#: Adjacent samples of one shard are read as one range up to this many bytes.
COALESCE_BYTES = 8 << 20


class IndexedWebDataset(SampleStages, _MapBase[Any]):
    """Random access to the samples of ``urls`` through their shard ``index`` (see the module docstring).

    Args:
        urls: a brace pattern, ``::``-joined patterns or a sequence of URLs, each covered by the index.
        index: the shard index (a path, a store URL, or a :class:`~wds_async.ShardIndex`), as written by
            ``wds-async index`` or ``ShardWriter(index=...)``.
        nsamples: instead of an index, the number of samples of each shard: a shard is then read whole on its
            first use in each process (into ``cache_dir`` when given) and its sample boundaries learned from that
            read; later reads are ranges (of the local copy, with a cache). What wids does, without the index.
        coalesce_bytes: adjacent samples of one shard asked for in one batch are read as one request of at most
            this many bytes.
        max_connections: requests in flight: ``"auto"`` (default, autotuned within this process's share of the
            node) or a fixed int.
        max_buffered_bytes: the engine's byte budget; with the next options as in
            :class:`~wds_async.WebDataset`; ``config`` a whole :class:`~wds_async.config.EngineConfig`.
        part_bytes: a coalesced range longer than this is read as concurrent ranged parts (as a large shard is
            when streaming): where one connection's bandwidth, not the time to first byte, bounds a long range.
        read_timeout: seconds a stream may go without a byte before it is retried.
        connect_timeout: seconds to open a connection.
        retry: the :class:`~wds_async.config.RetryPolicy`.
        config: a whole :class:`~wds_async.config.EngineConfig`; the options above override its fields.
        backends: scheme -> backend instance overrides (for tests and custom stores).
        backend_options: keyword options per scheme (as for :class:`~wds_async.WebDataset`).
        cache_dir: keep whole copies of the shards there (see the module docstring); default none.
        cache_size: the most bytes the copies take (as for :class:`~wds_async.WebDataset`).
        cache_validate: ask the store whether a copy is still current before reading it (default False: the
            index's identity is checked against the copy instead).
        node_connections: node-wide connection budget divided among the local loader processes.
        node_buffered_bytes: node-wide byte budget, divided the same way.
        readahead: batches each process reads ahead along its sampler's order: one it follows (:meth:`follow`;
            :class:`~wds_async.BlockShuffleSampler` registers itself), or in a forked DataLoader worker torch's own
            (``RandomSampler``, ...); 0 reads each batch only when asked.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        index: str | os.PathLike[str] | ShardIndex | None = None,
        *,
        nsamples: Sequence[int] | None = None,
        coalesce_bytes: int = COALESCE_BYTES,
        max_connections: int | str | None = None,
        max_buffered_bytes: int | None = None,
        part_bytes: int | None = None,
        read_timeout: float | None = None,
        connect_timeout: float | None = None,
        retry: RetryPolicy | None = None,
        config: EngineConfig | None = None,
        backends: dict[str, Any] | None = None,
        backend_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_size: int | str | None = None,
        cache_validate: bool = False,
        node_connections: int | None = None,
        node_buffered_bytes: int | None = None,
        readahead: int = 2,
    ) -> None:
        changes = {k: v for k, v in dict(
            max_connections=max_connections, max_buffered_bytes=max_buffered_bytes, part_bytes=part_bytes,
            read_timeout=read_timeout,
            connect_timeout=connect_timeout, retry=retry).items() if v is not None}
        # Interleaved delivery: a batch is assembled by item id, so no item waits behind a slower one.
        base = config or EngineConfig()
        if config is None:  # a batch is many small requests at once: start the autotuner at a batch's worth
            base = base.replace(start_connections=max(base.start_connections, START_CONNECTIONS))
        self.config = base.replace(**changes, deterministic=False)
        self._start_is_ours = config is None  # the autotuner's start may follow the first batch (see _spec)
        self._explicit = frozenset(["max_connections", "max_buffered_bytes"] if config is not None else
                                   [k for k in ("max_connections", "max_buffered_bytes") if k in changes])
        self.node_connections, self.node_buffered_bytes = node_connections, node_buffered_bytes
        if not isinstance(coalesce_bytes, int) or coalesce_bytes < 0:
            raise ValueError(f"coalesce_bytes must be a non-negative int, not {coalesce_bytes!r}")
        if not isinstance(readahead, int) or isinstance(readahead, bool) or readahead < 0:
            raise ValueError(f"readahead must be a non-negative int (batches), not {readahead!r}")
        self.readahead = readahead
        self._order: Any = None  # the sampler whose order this dataset reads ahead along (follow())
        self.urls = expand_urls(urls)
        if not self.urls:
            raise ValueError("IndexedWebDataset needs at least one shard URL")
        pipes = pipes_allowed(None)
        for url in self.urls:
            validate_url(url, allow_pipe=pipes)
            if scheme_of(url) == "pipe":
                raise ValueError(f"{redact_url(url)}: a pipe: URL cannot be read at byte ranges; "
                                 "use IndexedWebDataset with store URLs or local files")
        self._backends = backends
        self._backend_options = scheme_options(backend_options, self.urls, backends)
        import_backends(self.urls, backends)  # a missing SDK fails here; forked workers inherit the imports
        self.cache = make_cache(cache_dir, cache_size, validate=cache_validate) if cache_dir is not None else None
        self.index: ShardIndex | None = None
        if index is None:
            if nsamples is None:
                raise TypeError("IndexedWebDataset needs an index (or, without one, nsamples=[count per shard])")
            counts = list(nsamples)
            if len(counts) != len(self.urls) or not all(isinstance(n, int) and n >= 0 for n in counts):
                raise ValueError(f"nsamples must be one count (an int >= 0) per shard: {len(self.urls)} shards, "
                                 f"{len(counts)} counts")
        elif nsamples is not None:
            raise TypeError("give an index or nsamples, not both")
        elif isinstance(index, ShardIndex):
            self.index = index
        elif isinstance(index, (str, os.PathLike)):
            self.index = ShardIndex.load(index, backend_options=self._backend_options)
        else:
            raise TypeError(f"index must be a path, a URL or a ShardIndex, not {type(index).__name__}")
        #: Per shard its index entry; None for a shard whose layout this process has not learned yet.
        self.entries: list[ShardEntry | None] = list(self.index.entries_for(self.urls)) if self.index else [
            None] * len(self.urls)
        self.counts: list[int] = [e.nsamples for e in self.entries if e is not None] if self.index else counts
        self._starts: list[int] = []
        total = 0
        for count in self.counts:
            self._starts.append(total)
            total += count
        self._len = total
        self._stages = []
        self.layout = ShardLayout(self.urls, self.entries, self.counts, coalesce_bytes, self.cache,
                                  local=any(scheme_of(u) == "file" for u in self.urls))
        self._proc: ProcessReads | None = None
        self._worker_stats = SharedStats()  # created before any DataLoader worker forks: see stats()

    @property
    def coalesce_bytes(self) -> int:
        """The longest range that adjacent samples of one shard are read as (kept by :attr:`layout`)."""
        return self.layout.coalesce_bytes

    # -- the sequence ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    def locate(self, i: int) -> tuple[int, int]:
        """``(shard, sample)`` of index ``i`` (negative counts from the end); IndexError out of range."""
        n = self._position(i)
        shard = bisect.bisect_right(self._starts, n) - 1
        return shard, n - self._starts[shard]

    def _position(self, i: Any) -> int:
        if isinstance(i, bool) or not hasattr(i, "__index__"):
            raise TypeError(f"{type(self).__name__} indices must be integers, not {type(i).__name__}")
        n = operator.index(i)
        if n < 0:
            n += self._len
        if not 0 <= n < self._len:
            raise IndexError(f"{type(self).__name__} index {operator.index(i)} out of range "
                             f"(it holds {self._len} samples)")
        return n

    def __getitem__(self, i: int) -> Any:  # type: ignore[override]
        if isinstance(i, slice):
            return self.__getitems__(list(range(self._len))[i])
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples at ``indices`` (in that order), read concurrently: what DataLoader calls for a batch."""
        located = [self.locate(i) for i in indices]
        return self._deliver(located, self._read(indices, located))

    def _deliver(self, located: list[tuple[int, int]], samples: dict[tuple[int, int], Sample]) -> list[Any]:
        """The samples at ``located``, in that order, through the per-sample stages."""
        out = []
        given: set[tuple[int, int]] = set()
        for at in located:
            got = samples[at]
            if at in given:  # the same index twice in one batch: a sample dict of its own each time
                got = copy.copy(got)
            given.add(at)
            out.append(self._apply(got))
        return out

    def follow(self, sampler: Any) -> Self:
        """Read ahead along ``sampler``'s order: ``sampler`` is the DataLoader's (any object whose iteration gives
        the indices, with ``set_epoch`` when the order changes by epoch; :class:`~wds_async.BlockShuffleSampler`
        calls this itself). Each process then keeps its next ``readahead`` batches in flight while the DataLoader
        uses the current one, instead of one batch at a time; see :mod:`wds_async.data.readahead`. Returns self."""
        if not hasattr(sampler, "__iter__"):
            raise TypeError(f"follow() needs a sampler (an iterable of indices), not {type(sampler).__name__}")
        self._order = sampler
        return self

    def __iter__(self) -> Iterator[Any]:
        """Every sample in index order, a batch of ranges at a time."""
        step = 256
        for lo in range(0, self._len, step):  # index order: not the followed sampler's, so nothing to read ahead
            located = [self.locate(i) for i in range(lo, min(lo + step, self._len))]
            yield from self._deliver(located, self._fetch(located))

    # -- reading ---------------------------------------------------------------------------------
    def _process(self, in_flight: int = 0) -> ProcessReads:
        """This process's reads, started on first use; ``in_flight``: the requests the read that starts them puts
        in flight at once (see :data:`START_CONNECTIONS`)."""
        proc = self._proc
        if proc is None or proc.pid != os.getpid():
            proc = self._proc = ProcessReads(self._spec(in_flight))
            # A DataLoader worker's counters go to its slot for stats() and the metrics of the main process: every
            # 0.1 s, and a last time when the worker exits (a map-style dataset never learns that its epoch ended).
            stop = self._worker_stats.publish(proc.requests.stats)
            multiprocessing.util.Finalize(proc, stop, exitpriority=0)
        return proc

    def _spec(self, in_flight: int = 0) -> StreamSpec:
        config, _share = share_config(self.config, node_connections=self.node_connections,
                                      node_buffered_bytes=self.node_buffered_bytes, explicit=self._explicit)
        if self._start_is_ours and in_flight > config.start_connections:  # the engine caps it at what it allows
            config = config.replace(start_connections=in_flight)
        # A DataLoader worker new this epoch starts where the last epoch's worker settled.
        config = config.starting_at(self._worker_stats.learned_level())
        return StreamSpec(config, backends=self._backends, backend_options=self._backend_options, cache=self.cache)

    def _fetch(self, located: Iterable[tuple[int, int]], in_flight: int = 0) -> dict[tuple[int, int], Sample]:
        proc = self._process(in_flight)
        planned = self.layout.plan(proc, located)
        return self.layout.finish(proc, planned, proc.requests.fetch(planned.items))

    def _read(self, indices: Sequence[int], located: list[tuple[int, int]]) -> dict[tuple[int, int], Sample]:
        """The batch ``indices``, with the next batches of this process started first where the order is known."""
        order = self._order if self._order is not None else inherited_order(self)
        if order is None or not self.readahead or self.cache is not None or (
                self.index is None and None in self.entries):  # only a dataset without an index has shards to learn
            return self._fetch(located, len(indices))  # no order to follow; whole-shard reads are not guessed
        proc = self._process(len(indices) * (1 + self.readahead))
        planned = proc.submit_ahead(order, self.readahead, worker_info()[1], indices, located, self.layout, self.locate)
        try:
            return self.layout.finish(proc, planned, proc.requests.collect([item.id for item in planned.items]))
        except Exception:
            if not proc.guessed:  # a batch taken from proc.pending was a guess too, so guessed is set then
                raise
        # Something in flight failed, and reads guessed ahead (kept or dropped, still read until the engine stops)
        # may have been among it: the engine stopped them all. Read this batch again on its own, so that an error is
        # raised by the batch that holds its sample, and only by it.
        proc.forget_guesses()
        return self._fetch(located)

    def stats(self) -> dict[str, Any]:
        """Counters of this process's engine (requests, bytes, retries, ...; see :class:`~wds_async.stats.Stats`).
        In the main process, when DataLoader workers did the latest reads, their counters summed, with
        ``workers`` (as :meth:`WebDataset.stats <wds_async.WebDataset.stats>`); inside a worker, its own."""
        proc = self._proc
        return self._worker_stats.combined(proc.requests.stats if proc is not None and proc.pid == os.getpid()
                                           else None)

    def close(self) -> None:
        """Stop this process's engine (the next read starts a new one)."""
        proc = self._proc
        if proc is not None and proc.pid == os.getpid():
            proc.requests.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_proc"] = None  # threads and sockets stay in their process
        return state

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({redact_url(self.urls[0])!r}{' ...' if len(self.urls) > 1 else ''}, "
                f"{len(self.urls)} shards, {self._len} samples, stages={len(self._stages)})")


watch_forks(IndexedWebDataset)  # forked DataLoader workers read ahead along RandomSampler's order too
