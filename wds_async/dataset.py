"""``WebDataset``: a ``torch.utils.data.IterableDataset`` over tar shards with webdataset's fluid API.

Nothing runs at construction except validating the URLs and expanding brace patterns and globs. Each
``iter()`` (in the main process, or inside each DataLoader worker after fork or spawn) takes this
process's share of the shards, starts a :class:`~wds_async.bridge.Bridge` (loop thread, sessions,
engine), and closes it when the iteration ends for any reason: exhaustion, ``break``, an exception,
``del`` or garbage collection.

Shard assignment: the full list is (optionally) shuffled with ``(seed, epoch)``, identically in every
process, then split by node and by DataLoader worker, so that together the workers of all ranks read
every shard exactly once. ``resampled=True`` instead draws shards with replacement, independently per
rank and worker, forever (bound an epoch with ``.with_epoch(n)``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .backends import validate_url
from .config import EngineConfig, RetryPolicy
from .fluid import FluidPipeline
from .handlers import resolve_handler
from .listing import expand_globs
from .pipeline import ResampledShards, split_by_node, split_by_worker, stream_samples
from .stats import Stats
from .urls import expand_urls, redact_url

__all__ = ["WebDataset"]

log = logging.getLogger("wds_async")


class WebDataset(FluidPipeline):
    """Samples of WebDataset tar shards, streamed by the async engine.

    Args:
        urls: a brace pattern, ``::``-joined patterns, a glob, or a sequence of URLs.
        handler: error policy: a callable or a webdataset handler name (default: raise).
        shardshuffle: shuffle the shard list per epoch from ``(seed, epoch)`` (True or any positive int).
        seed: seed of the shard shuffle (the same in every process, so ranks and workers stay disjoint).
        detshuffle: accepted for compatibility; the shard shuffle is always deterministic in ``(seed, epoch)``.
        resampled: draw shards with replacement, endlessly, per rank and worker.
        repeat: iterate the shards again and again (``.repeat()``).
        deterministic: deliver samples shard by shard in shard order (default: as they arrive).
        max_connections, max_buffered_bytes, read_timeout, connect_timeout, retry: engine settings
            (see :class:`~wds_async.config.EngineConfig`); or pass a whole ``config``.
        nodesplitter, workersplitter: ``iterable of {"url": ...} -> iterable`` selecting this rank's and
            this worker's shares (webdataset's signature); ``None`` disables a split.
        select_files, rename_files: per-member filter and renamer, applied before grouping.
        empty_check: raise if this process was given shards but they held no sample at all.
        log_interval: seconds between ``stats()`` log lines on the ``wds_async`` logger (INFO).
        backends: scheme -> backend instance overrides (for tests and custom stores).
        backend_options: keyword options for the backends, e.g. ``{"endpoint_url": ...}`` for S3-compatible
            stores or ``{"anonymous": True}`` for public buckets.
        allow_pipe: forbid (False) or allow ``pipe:`` URLs; default: allowed unless ``WDS_ASYNC_NO_PIPE``.
    """

    def __init__(
        self,
        urls: str | Iterable[str],
        handler: Callable[[BaseException], bool] | str | None = None,
        *,
        shardshuffle: bool | int | None = False,
        seed: int = 0,
        detshuffle: bool = False,
        resampled: bool = False,
        repeat: bool = False,
        deterministic: bool | None = None,
        max_connections: int | None = None,
        max_buffered_bytes: int | None = None,
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
    ) -> None:
        super().__init__()
        changes = {k: v for k, v in dict(
            max_connections=max_connections, max_buffered_bytes=max_buffered_bytes, read_timeout=read_timeout,
            connect_timeout=connect_timeout, retry=retry, deterministic=deterministic).items() if v is not None}
        self.config = (config or EngineConfig()).replace(**changes)
        self._backends = backends
        self._backend_options: dict[str, Any] = dict(backend_options or {})
        if allow_pipe is not None:
            self._backend_options["allow_pipe"] = allow_pipe
        urls_list = expand_urls(urls)
        for url in urls_list:
            validate_url(url)
        self.urls = expand_globs(urls_list, self.config, self._backend_options, backends)
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
        if repeat:
            self._repetitions = 2**62

    # -- shards and epochs ---------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose shard order the next iteration uses (with ``shardshuffle``)."""
        self.epoch = epoch

    def shard_list(self) -> list[str]:
        """The shards this process (rank and DataLoader worker) reads in the current epoch, in order."""
        urls = list(self.urls)
        if self.shardshuffle:
            random.Random(f"{self.seed}:{self.epoch}").shuffle(urls)
        items: Iterable[Any] = [{"url": u} for u in urls]
        for splitter in (self.nodesplitter, self.workersplitter):
            if splitter is not None:
                items = splitter(items)
        return [item["url"] if isinstance(item, dict) else item for item in items]

    def _shard_stream(self) -> Iterable[str]:
        if self.resampled:
            source = ResampledShards(self.urls, seed=self.seed, deterministic=self.detshuffle)
            source.epoch = self.epoch
            return (item["url"] for item in source)
        return self.shard_list()

    # -- iteration ---------------------------------------------------------------------------
    def _source(self) -> Iterator[Any]:
        return self._samples()

    def _samples(self) -> Iterator[Any]:
        shards = self._shard_stream()
        stats = Stats()
        self._stats_box[0] = stats
        if isinstance(shards, list) and not shards:
            log.info("wds-async: this process has no shards (%d shards for more ranks/workers)", len(self.urls))
            return
        count = 0
        samples = stream_samples(
            shards, config=self.config, handler=self.handler, stats=stats, backends=self._backends,
            backend_options=self._backend_options, log_interval=self.log_interval,
            select_files=self.select_files, rename_files=self.rename_files)
        try:
            for sample in samples:
                count += 1
                yield sample
        finally:
            samples.close()
        if self.empty_check and count == 0 and stats.shards_skipped == 0:
            raise ValueError(
                f"no samples found in {len(shards) if isinstance(shards, list) else 'the'} shards of this "
                "process (are they empty tars?); turn this check off with WebDataset(..., empty_check=False)")

    def stats(self) -> dict[str, Any]:
        """Counters and rates of the latest iteration in this process (see :class:`~wds_async.stats.Stats`).

        With DataLoader workers, each worker has its own; in the main process this shows the main
        process's own iteration only.
        """
        stats = self._stats_box[0]
        return (stats or Stats()).snapshot()

    def __repr__(self) -> str:
        shown = redact_url(self.urls[0]) + (f" ... ({len(self.urls)} shards)" if len(self.urls) > 1 else "")
        return f"WebDataset({shown!r}, stages={len(self._stages)}, config={self.config})"
