"""``WebDataset``: a ``torch.utils.data.IterableDataset`` over tar shards with webdataset's fluid API.

Nothing runs at construction except validating and expanding the URLs. Each ``iter()`` (in the main
process, or inside each DataLoader worker after fork or spawn) takes this process's share of the shards,
starts a :class:`~wds_async.bridge.Bridge` (loop thread, sessions, engine), and closes it when the
iteration ends for any reason: exhaustion, ``break``, an exception, ``del`` or garbage collection.

Shard assignment: the full list is (optionally) shuffled with ``(seed, epoch)``, identically in every
process, then split by node (``torch.distributed`` rank, or ``RANK``/``WORLD_SIZE``) and by DataLoader
worker, so that together the workers of all ranks read every shard exactly once.
"""

from __future__ import annotations

import copy
import functools
import os
import random
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

from torch.utils.data import IterableDataset, get_worker_info

from .backends import REGISTRY, supported_schemes
from .bridge import Bridge
from .config import EngineConfig, RetryPolicy
from .errors import UrlError
from .handlers import resolve_handler
from .listing import expand_globs
from .stages import batched, default_collation_fn, map_stage, select, shuffle, to_tuple
from .stats import Stats
from .urls import expand_urls, redact_url, scheme_of

__all__ = ["WebDataset", "split_by_node", "split_by_worker"]


def _node_info() -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:  # pragma: no cover
        pass
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    return (rank, world) if world > 1 else (0, 1)


def split_by_node(urls: list[str]) -> list[str]:
    """This rank's share: every ``world``-th shard starting at ``rank``."""
    rank, world = _node_info()
    return urls[rank::world]


def split_by_worker(urls: list[str]) -> list[str]:
    """This DataLoader worker's share of the node's shards."""
    info = get_worker_info()
    if info is None:
        return urls
    return urls[info.id :: info.num_workers]


def _validate(url: str) -> None:
    scheme = scheme_of(url)
    if scheme not in REGISTRY:
        raise UrlError(
            f"unknown URL scheme {scheme!r}; supported: {', '.join(s + ':' for s in supported_schemes())} "
            "and bare local paths", url=redact_url(url))
    if scheme in ("http", "https"):
        parts = urlsplit(url)
        if not parts.hostname or not url.lower().startswith(scheme + "://"):
            raise UrlError("malformed http(s) URL: it needs a host, as in https://host/path/shard.tar",
                           url=redact_url(url))
    if scheme == "pipe" and not url[len("pipe:"):].strip():
        raise UrlError("pipe: URL has no command after 'pipe:'", url=url)


class WebDataset(IterableDataset):  # type: ignore[type-arg]
    """Samples of WebDataset tar shards, streamed by the async engine.

    Args:
        urls: a brace pattern, ``::``-joined patterns, or a sequence of URLs.
        handler: error policy: a callable or a webdataset handler name (default: raise).
        shardshuffle: shuffle the shard list per epoch from ``(seed, epoch)``.
        seed: seed of the shard shuffle.
        deterministic: deliver samples shard by shard in shard order (default: as they arrive).
        max_connections, max_buffered_bytes, read_timeout, connect_timeout, retry: engine settings
            (see :class:`~wds_async.config.EngineConfig`); or pass a whole ``config``.
        nodesplitter, workersplitter: functions from the shard list to this rank's / worker's share.
        log_interval: seconds between ``stats()`` log lines on the ``wds_async`` logger (INFO).
        backends: scheme -> backend instance overrides (for tests and custom stores).
        backend_options: keyword options for the backends, e.g. ``{"endpoint_url": ...}`` for S3-compatible
            stores or ``{"anonymous": True}`` for public buckets.
        allow_pipe: forbid (False) or allow ``pipe:`` URLs; default: allowed unless ``WDS_ASYNC_NO_PIPE``.
    """

    def __init__(
        self,
        urls: str | Iterable[str],
        *,
        handler: Callable[[BaseException], bool] | str | None = None,
        shardshuffle: bool | int = False,
        seed: int = 0,
        deterministic: bool | None = None,
        max_connections: int | None = None,
        max_buffered_bytes: int | None = None,
        read_timeout: float | None = None,
        connect_timeout: float | None = None,
        retry: RetryPolicy | None = None,
        config: EngineConfig | None = None,
        nodesplitter: Callable[[list[str]], list[str]] | None = split_by_node,
        workersplitter: Callable[[list[str]], list[str]] | None = split_by_worker,
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
            _validate(url)
        self.urls = expand_globs(urls_list, self.config, self._backend_options, backends)
        self.handler = resolve_handler(handler)
        self.shardshuffle = shardshuffle
        self.seed = seed
        self.epoch = 0
        self.nodesplitter = nodesplitter
        self.workersplitter = workersplitter
        self.log_interval = log_interval
        self._stages: tuple[Callable[[Iterator[Any]], Iterator[Any]], ...] = ()
        self._stats_box: list[Stats | None] = [None]

    # -- shards and epochs ---------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose shard order the next iteration uses (with ``shardshuffle``)."""
        self.epoch = epoch

    def shard_list(self) -> list[str]:
        """The shards this process (rank and DataLoader worker) reads in the current epoch, in order."""
        urls = list(self.urls)
        if self.shardshuffle:
            random.Random(f"{self.seed}:{self.epoch}").shuffle(urls)
        if self.nodesplitter is not None:
            urls = self.nodesplitter(urls)
        if self.workersplitter is not None:
            urls = self.workersplitter(urls)
        return urls

    # -- iteration ---------------------------------------------------------------------------
    def _samples(self) -> Generator[Any, None, None]:
        urls = self.shard_list()
        stats = Stats()
        self._stats_box[0] = stats
        if not urls:
            return
        bridge = Bridge(urls, config=self.config, handler=self.handler, stats=stats, backends=self._backends,
                        backend_options=self._backend_options, log_interval=self.log_interval)
        bridge.start()
        try:
            for batch in bridge.batches():
                for item in batch:
                    if isinstance(item, BaseException):
                        raise item
                    yield item
        finally:
            bridge.close()

    def __iter__(self) -> Iterator[Any]:
        source = self._samples()
        stream: Iterator[Any] = source
        for stage in self._stages:
            stream = stage(stream)
        try:
            yield from stream
        finally:
            # Close from the outside in, so the bridge stops now rather than at garbage collection.
            close = getattr(stream, "close", None)
            if close is not None:
                close()
            source.close()

    def stats(self) -> dict[str, Any]:
        """Counters and rates of the latest iteration in this process (see :class:`~wds_async.stats.Stats`).

        With DataLoader workers, each worker has its own; in the main process this shows the main
        process's own iteration only.
        """
        stats = self._stats_box[0]
        return (stats or Stats()).snapshot()

    # -- fluid interface -------------------------------------------------------------------------
    def compose(self, stage: Callable[[Iterator[Any]], Iterator[Any]]) -> WebDataset:
        """A new pipeline with ``stage(iterator) -> iterator`` appended; ``self`` is unchanged."""
        new = copy.copy(self)
        new._stages = self._stages + (stage,)
        return new

    def shuffle(self, bufsize: int, initial: int = 100, seed: int | None = None) -> WebDataset:
        """Shuffle samples within a buffer of ``bufsize`` (0 or 1: no shuffle)."""
        if bufsize <= 1:
            return self
        rng = random.Random(seed) if seed is not None else None
        return self.compose(functools.partial(shuffle, bufsize=bufsize, initial=initial, rng=rng))

    def map(self, f: Callable[[Any], Any], handler: Callable[[BaseException], bool] | str | None = None
            ) -> WebDataset:
        """Apply ``f`` to every sample (``None`` results are dropped)."""
        return self.compose(functools.partial(map_stage, f=f, handler=resolve_handler(handler)))

    def select(self, predicate: Callable[[Any], bool]) -> WebDataset:
        """Keep the samples for which ``predicate`` is true."""
        return self.compose(functools.partial(select, predicate=predicate))

    def to_tuple(self, *keys: str, handler: Callable[[BaseException], bool] | str | None = None,
                 missing_is_error: bool = True) -> WebDataset:
        """Turn samples into tuples of the named fields (``"jpg;png"``: the first present)."""
        return self.compose(_ToTuple(keys, resolve_handler(handler), missing_is_error))

    def batched(self, batchsize: int, collation_fn: Callable[[list[Any]], Any] | None = default_collation_fn,
                partial: bool = True) -> WebDataset:
        """Group samples into batches of ``batchsize``, collated by ``collation_fn``."""
        return self.compose(functools.partial(batched, batchsize=batchsize, collation_fn=collation_fn,
                                              partial=partial))

    def __repr__(self) -> str:
        shown = redact_url(self.urls[0]) + (f" ... ({len(self.urls)} shards)" if len(self.urls) > 1 else "")
        return f"WebDataset({shown!r}, stages={len(self._stages)}, config={self.config})"


class _ToTuple:
    """Picklable ``to_tuple`` stage (partial cannot bind varargs before keyword data)."""

    def __init__(self, keys: tuple[str, ...], handler: Callable[[BaseException], bool], missing_is_error: bool):
        self.keys, self.handler, self.missing_is_error = keys, handler, missing_is_error

    def __call__(self, data: Iterator[Any]) -> Iterator[Any]:
        return to_tuple(data, *self.keys, handler=self.handler, missing_is_error=self.missing_is_error)
