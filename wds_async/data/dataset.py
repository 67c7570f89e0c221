"""``WebDataset``: a ``torch.utils.data.IterableDataset`` over tar shards with webdataset's fluid API.

Nothing runs at construction except validating the URLs and expanding brace patterns and globs. Each
``iter()`` (in the main process, or inside each DataLoader worker after fork or spawn) takes this
process's share of the shards, starts a :class:`~wds_async.engine.bridge.Bridge` (loop thread, sessions,
engine), and closes it when the iteration ends for any reason: exhaustion, ``break``, an exception,
``del`` or garbage collection.

Work assignment (:mod:`wds_async.data.epoch`, :mod:`wds_async.data.plan`): the list is split by node and by
DataLoader worker, so that together the workers of all ranks read every shard exactly once, then each process
(optionally) shuffles its shards as webdataset 1.0.2 does, with the same draws. With an ``index``, samples are
split instead, in equal shares per rank and worker of the list shuffled by ``(seed, epoch)``. ``resampled=True``
draws shards with replacement, per rank and worker, forever (bound an epoch with ``.with_epoch(n)``).

Checkpoints (``state_dict`` / ``load_state_dict``, see :mod:`wds_async.data.state`) record which work items were
delivered and where each one in flight stands; the engine's settings are this process's share of the node
budgets (:mod:`wds_async.node`), computed at iteration time inside each worker.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

from ..backends.file import local_path
from ..backends.pipe import pipes_allowed
from ..cache.disk import make_cache
from ..config import EngineConfig, RetryPolicy
from ..engine.shared import SharedEngine
from ..engine.spec import StreamSpec
from ..errors import EmptyShards
from ..index.format import ShardIndex
from ..io import import_backends, scheme_options, validate_url
from ..io.listing import expand_globs
from ..node import share_config
from ..service.options import check_service_options, service_settings
from ..service.paths import default_socket_path, resolve_service
from ..stats import SharedStats, Stats
from ..urls import expand_urls, redact_text, redact_url, scheme_of
from .epoch import Planner
from .fluid import FluidPipeline
from .handlers import resolve_handler
from .pipeline import deliver, split_by_node, split_by_worker, stream_samples

__all__ = ["WebDataset"]

log = logging.getLogger("wds_async")


class WebDataset(FluidPipeline):
    """Samples of WebDataset tar shards, streamed by the async engine.

    (A mix of datasets reads its sources' copies on one engine of its own: :mod:`wds_async.data.mix`.)

    Args:
        urls: a brace pattern, ``::``-joined patterns, a glob, or a sequence of URLs.
        handler: error policy: a callable or a webdataset handler name (default: raise).
        shardshuffle: shuffle each process's shards with webdataset's buffer shuffle of this size (True: 100).
        seed: seed of the shard shuffle, ``seed + epoch`` after epoch 0; None: ``WDS_SEED`` or a random one.
        detshuffle: advance the epoch by one on every new iteration in this process, as webdataset's does;
            with ``resampled``, draw from webdataset's deterministic ``ResampledShards`` seed.
        resampled: draw shards with replacement, endlessly, per rank and worker.
        repeat: iterate the shards again and again (``.repeat()``).
        deterministic: deliver samples shard by shard in shard order, as webdataset does (default True);
            False interleaves the shards in flight as their bytes arrive (see ``EngineConfig.deterministic``).
        max_connections: requests in flight: ``"auto"`` (default; tuned at run time within this process's
            share of the node, see :mod:`wds_async.engine.autotune`) or a fixed int.
        part_bytes: shards larger than this are fetched as concurrent ranged parts (0: never).
        max_buffered_bytes: the engine's byte budget (see :class:`~wds_async.config.EngineConfig`, as for the
            next three); or pass a whole ``config``.
        read_timeout: seconds a stream may go without a byte before it is retried.
        connect_timeout: seconds to open a connection.
        retry: the :class:`~wds_async.config.RetryPolicy`.
        config: a whole :class:`~wds_async.config.EngineConfig`; the options above override its fields.
        max_sample_bytes: the largest member or sample accepted (default 1 GiB): a tar header announcing
            more fails its shard with :class:`~wds_async.errors.SampleTooLarge` before the bytes are read,
            so a corrupt size field cannot exhaust memory; the handler decides as for any shard error.
        nodesplitter: ``iterable of {"url": ...} -> iterable`` selecting this rank's share (webdataset's
            signature); ``None`` disables the split.
        workersplitter: the same for this DataLoader worker's share.
        select_files: per-member filter, applied before grouping.
        rename_files: per-member renamer, applied before grouping.
        empty_check: raise :class:`~wds_async.errors.EmptyShards` (a ``ValueError``) if this process was given
            shards but they held no sample at all (for example empty tars: only end-of-archive blocks).
        log_interval: seconds between ``stats()`` log lines on the ``wds_async`` logger (INFO).
        backends: scheme -> backend instance overrides (for tests and custom stores).
        backend_options: keyword options per scheme, e.g. ``{"s3": {"endpoint_url": ...}, "gs": {"anonymous":
            True}}``; the flat form (``{"endpoint_url": ...}``) when all URLs use one scheme. An option the
            scheme's backend does not take is a :class:`~wds_async.errors.UrlError` here, at construction.
        allow_pipe: forbid (False) or allow ``pipe:`` URLs; default: allowed unless ``WDS_ASYNC_NO_PIPE``.
        cache_dir: keep a copy of every remote shard in ``cache_dir`` (default
            ``WDS_ASYNC_CACHE_DIR``, else webdataset's ``WDS_CACHE``; None: no cache), written while the shard
            streams and read from disk in later epochs, by every process of the node (see
            :mod:`wds_async.cache.disk`).
        cache_size: the most bytes the copies take (an int or ``"200GB"``;
            default ``WDS_ASYNC_CACHE_SIZE``, else no limit as in webdataset; -1: no limit; 0: no cache),
            least recently used copies evicted first.
        cache_validate: before reading a copy, ask the store (one 1-byte request) whether the object is still
            that version, and refetch it if not. False trusts the copies (no request at all), as webdataset's
            cache does.
        index: a shard index (path, store URL or :class:`~wds_async.ShardIndex`): split samples, not shards,
            into equal shares per rank and worker, and check each shard's identity against it.
        drop_last: with an index, drop the remainder instead of padding the last shares by wrapping around.
        node_connections: node-wide connection budget divided among the local loader processes
            (default: ``WDS_ASYNC_NODE_CONNECTIONS``, else 256).
        node_buffered_bytes: node-wide byte budget, divided the same way (default:
            ``WDS_ASYNC_NODE_BUFFERED_BYTES``, else 2 GiB).
        service: read through the node service (``wds-async serve``, :mod:`wds_async.service`) instead of an
            engine in this process: ``"unix://PATH"`` (its socket), or ``"auto"`` (the default socket when a
            service answers there, else in-process); default ``WDS_ASYNC_SERVICE``, else in-process. Planning
            (ranks, workers, index shares, shuffle, resume) stays here and behaves exactly the same. Options
            the service cannot run (``select_files``, ``rename_files``, ``backends`` instances) are a
            ``ValueError`` here.
    """

    #: Set on the copies a mix makes of its sources: the mix's engine and this source's route in it.
    _shared: tuple[SharedEngine, int] | None = None

    def __init__(
        self,
        urls: str | Iterable[str],
        handler: Callable[[BaseException], bool] | str | None = None,
        *,
        shardshuffle: bool | int | None = False,
        seed: int | str | None = None,
        detshuffle: bool = False,
        resampled: bool = False,
        repeat: bool = False,
        deterministic: bool | None = None,
        max_connections: int | str | None = None,
        max_buffered_bytes: int | None = None,
        max_sample_bytes: int | None = None,
        part_bytes: int | None = None,
        read_timeout: float | None = None,
        connect_timeout: float | None = None,
        retry: RetryPolicy | None = None,
        config: EngineConfig | None = None,
        nodesplitter: Callable[[Iterable[Any]], Iterable[Any]] | None = split_by_node,
        workersplitter: Callable[[Iterable[Any]], Iterable[Any]] | None = split_by_worker,
        select_files: Callable[[str], bool] | None = None,
        rename_files: Callable[[str], str] | None = None,
        empty_check: bool = True,
        log_interval: float | None = None,
        backends: dict[str, Any] | None = None,
        backend_options: dict[str, Any] | None = None,
        allow_pipe: bool | None = None,
        index: str | os.PathLike[str] | ShardIndex | None = None,
        drop_last: bool = False,
        node_connections: int | None = None,
        node_buffered_bytes: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_size: int | str | None = None,
        cache_validate: bool = True,
        service: str | None = None,
    ) -> None:
        super().__init__()
        changes = {k: v for k, v in dict(
            max_connections=max_connections, max_buffered_bytes=max_buffered_bytes, part_bytes=part_bytes,
            read_timeout=read_timeout, max_sample_bytes=max_sample_bytes,
            connect_timeout=connect_timeout, retry=retry, deterministic=deterministic).items() if v is not None}
        self.config = (config or EngineConfig()).replace(**changes)
        self._explicit = frozenset(["max_connections", "max_buffered_bytes"] if config is not None else
                                   [k for k in ("max_connections", "max_buffered_bytes") if k in changes])
        self.node_connections, self.node_buffered_bytes = node_connections, node_buffered_bytes
        self._backends = backends
        urls_list = expand_urls(urls)
        pipes = pipes_allowed(allow_pipe)
        for url in urls_list:
            validate_url(url, allow_pipe=pipes)
        self._backend_options = scheme_options(backend_options, urls_list, backends)
        if allow_pipe is not None:
            self._backend_options["pipe"] = {**self._backend_options.get("pipe", {}), "allow_pipe": allow_pipe}
        self.urls = expand_globs(urls_list, self.config, self._backend_options, backends)
        self.cache = make_cache(cache_dir, cache_size, validate=cache_validate)
        self.service = resolve_service(service)
        self._service_used: str | None = None
        if self.service is not None:
            check_service_options(self.service, select_files, rename_files, backends, self._backend_options)
        import_backends(self.urls, backends)
        self._local = any(scheme_of(u) == "file" for u in self.urls)  # samples get __local_path__
        self.handler = resolve_handler(handler)
        self.shardshuffle = bool(shardshuffle)
        self.seed = seed
        self.detshuffle = detshuffle
        self.resampled = resampled
        self.epoch = 0
        self.nodesplitter = nodesplitter
        self.workersplitter = workersplitter
        self.select_files = select_files
        self.rename_files = rename_files
        self.empty_check = empty_check
        self.log_interval = log_interval
        self._stats_box: list[Stats | None] = [None]
        self._worker_stats = SharedStats()  # created before any DataLoader worker forks: see stats()
        self._tuned = 0  # the concurrency the previous iteration's autotuner ended at
        if repeat:
            self._repetitions = 2**62
        self.drop_last = drop_last
        if index is not None and rename_files is not None:
            raise ValueError("rename_files changes how members group into samples, so an index's sample ranges "
                             "would not hold; build the index from shards named as they should be read")
        self.index: ShardIndex | None = None
        if index is not None:
            self.index = index if isinstance(index, ShardIndex) else ShardIndex.load(
                index, backend_options=self._backend_options)
        self._planner = Planner(
            self.urls, entries=self.index.entries_for(self.urls) if self.index is not None else None,
            shardshuffle=shardshuffle, seed=seed, resampled=resampled, detshuffle=detshuffle,
            drop_last=drop_last, splitters=(nodesplitter, workersplitter))

    def __getstate__(self) -> dict[str, Any]:
        # A mix's copy of a source pickles without its binding to the mix's engine (a thread and a lock).
        state = dict(self.__dict__)
        state.pop("_shared", None)
        return state

    # -- shards and epochs ---------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose shard order the next iteration uses (with ``shardshuffle``)."""
        self.epoch = epoch

    def shard_list(self) -> list[str]:
        """The shards this process (rank and DataLoader worker) reads in the current epoch, in order
        (without an index: with one, see :meth:`work_items`)."""
        return [item.url for item in self.work_items()]

    def work_items(self) -> list[Any]:
        """This process's work items of the current epoch: ``(shard, start, end)`` byte ranges."""
        return self._planner.work_items(self.epoch)

    # -- iteration ---------------------------------------------------------------------------
    def _source(self, run: Any, resume: dict[str, Any] | None) -> Iterator[Any]:
        ep = self._planner.start(self.epoch, resume, self._held_positions)
        run.source = ep
        return self._samples(run, ep)

    @staticmethod
    def _held_positions(state: dict[str, Any]) -> list[list[int]]:
        return [pos for stage in state["stages"] if stage for group in stage["held"] for pos in group]

    def _source_state(self, run: Any) -> dict[str, Any]:
        return self._planner.source_state(run.source if run is not None else None)

    def _stream_spec(self) -> tuple[StreamSpec, Any]:
        """How this process reads now: the spec for an engine, and this process's share of the node."""
        config, share = share_config(self.config, node_connections=self.node_connections,
                                     node_buffered_bytes=self.node_buffered_bytes, explicit=self._explicit)
        config = config.starting_at(self._tuned)  # a new epoch starts where the last one's autotuner settled
        path = self._service_path()
        settings = service_settings(config, share.processes, self._explicit) if path is not None else None
        spec = StreamSpec(config, self.handler, self.select_files, self.rename_files, backends=self._backends,
                          backend_options=self._backend_options, cache=self.cache, log_interval=self.log_interval,
                          service=path, service_settings=settings)
        return spec, share

    def _engine(self, items: Any, stats: Stats, *, shared: bool = True,
                **callbacks: Any) -> Generator[Any, None, None]:
        if shared and self._shared is not None:  # a source of a mix: read on the mix's engine
            engine, route = self._shared
            return deliver(engine.batches(items, route), **callbacks)
        spec, share = self._stream_spec()
        stats.node_share = share.as_dict()
        return stream_samples(items, spec, stats=stats, **callbacks)

    def _service_path(self) -> str | None:
        """The socket this iteration reads through, or None for in-process (``"auto"`` asks the default one)."""
        if self.service != "auto":
            self._service_used = self.service
            return self.service
        from ..service.client import service_answers

        path = default_socket_path()
        self._service_used = path if service_answers(path) else None
        log.info("wds-async: %s", f"reading through the node service at {path}" if self._service_used else
                 f"no node service answers at {path}: reading in-process")
        return self._service_used

    def _reread(self, run: Any, positions: list[list[int]]) -> list[Any]:
        ep = run.source
        wanted = {(ep.item(item_id).shard, offset) for item_id, offset, _ in positions}
        items = self._planner.reread_items(ep, positions)
        found: dict[tuple[int, int], Any] = {}
        samples = self._engine(items, Stats(), shared=False)  # a restore reads on an engine of its own
        set_path = _path_setter() if self._local else None
        try:
            for sample in samples:
                if set_path is not None:
                    set_path(sample)
                key = (items[sample.item].shard, sample.offset)
                if key in wanted:
                    found[key] = sample
        finally:
            samples.close()
        missing = wanted - set(found)
        if missing:
            shard, offset = min(missing)
            raise ValueError(f"cannot restore the pipeline's buffers: no sample starts at byte {offset} of "
                             f"{redact_url(self.urls[shard])} any more")
        out = []
        for item_id, offset, _ in positions:
            sample = found[(ep.item(item_id).shard, offset)]
            sample.item = item_id
            out.append(sample)
        return out

    def _samples(self, run: Any, ep: Any) -> Iterator[Any]:
        previous = self._stats_box[0]
        if previous is not None and previous.concurrency:
            self._tuned = previous.concurrency
        elif not self._tuned and self._shared is None:  # a DataLoader worker forked for this epoch: its slot knows
            self._tuned = self._worker_stats.learned_level()
        stats = self._shared[0].stats if self._shared is not None else Stats()
        self._stats_box[0] = stats
        todo = ep.todo()
        if isinstance(ep.items, list):
            todo = list(todo)
            if not todo:
                if self._shared is None:
                    self._worker_stats.publish(stats)()  # a DataLoader worker clears its slot in stats()
                if not ep.items:
                    log.info("wds-async: this process has no work (%d shards for more ranks/workers)", len(self.urls))
                return
        progress = ep.progress
        fresh = progress.done_below == 0 and not progress.done and not progress.pos
        # In order, as the engine that reads them delivers (a mix's sources: the mix's engine)
        ordered = (self._shared[0].spec.config if self._shared is not None else self.config).deterministic
        samples = self._engine(todo, stats, recorder=run.recorder(progress.pos, progress.finished,
                                                                  one_item_runs=ordered))
        set_path = _path_setter() if self._local else None
        # DataLoader workers only (see stats()); a mix's source leaves that to the mix, which owns the engine.
        stop_publishing = self._worker_stats.publish(stats) if self._shared is None else _no_publishing
        empty = True
        try:
            if set_path is not None:
                for sample in samples:
                    empty = False
                    set_path(sample)
                    yield sample
            else:
                for sample in samples:  # the first sample; then no bytecode of ours per sample
                    empty = False
                    yield sample
                    yield from samples
        finally:
            samples.close()
            stop_publishing()
        # Only shards read from their start must hold samples: the rest of one that a merged state hands over
        # (merge_states, another number of processes) may hold none, its last sample delivered before the checkpoint
        whole = [item for item in todo if getattr(item, "start", 0) == 0] if isinstance(todo, list) else None
        if self.empty_check and fresh and empty and stats.shards_skipped == 0 and (whole is None or whole):
            first = getattr(whole[0], "url", None) if whole else None
            raise EmptyShards(
                f"no samples found in {len(whole) if whole is not None else 'the'} shards of this "
                "process (are they empty tars?); turn this check off with WebDataset(..., empty_check=False)",
                url=redact_url(first) if first else None, shards=len(whole) if whole is not None else 0)

    def stats(self) -> dict[str, Any]:
        """Counters and rates of the latest iteration (see :class:`~wds_async.stats.Stats`).

        In the main process, when DataLoader workers ran the latest iteration, their counters are summed
        (fork or spawn, persistent or not; refreshed every 0.1 s by a thread in each worker) and ``workers``
        says how many; rates are over the span from the first worker's start to its latest update. Inside a
        worker: that worker's own.
        """
        snapshot = self._worker_stats.combined(self._stats_box[0])
        if self.service is not None:
            snapshot["service"] = self._service_used or self.service
        return snapshot

    def __repr__(self) -> str:
        # redact_text, not redact_url: a pipe: command's URLs are scrubbed too (a repr is only shown, never a key)
        shown = redact_text(self.urls[0]) + (f" ... ({len(self.urls)} shards)" if len(self.urls) > 1 else "")
        return f"WebDataset({shown!r}, stages={len(self._stages)}, config={self.config})"


def _no_publishing() -> None:
    return None


def _path_setter() -> Callable[[Any], None]:
    """A step that adds ``__local_path__`` to each sample of a local shard, as webdataset's ``WebDataset`` does:
    the path of the file read (a bare path as given, a ``file://`` URL's path); remote samples get none."""
    paths: dict[str, str | None] = {}

    def set_path(sample: Any) -> None:
        url = sample.url
        try:
            path = paths[url]
        except KeyError:
            path = paths[url] = local_path(url) if scheme_of(url) == "file" else None
        if path is not None:
            sample["__local_path__"] = path

    return set_path
