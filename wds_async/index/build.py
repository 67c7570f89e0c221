"""Building a shard index by streaming the shards once: :func:`build_index` (and ``wds-async index``).

The same pieces as the engine, without its channel: up to ``max_connections`` shards in flight in a
TaskGroup, each read whole through a :class:`~wds_async.io.reader.RangeReader` (retries and resume inside)
into a :class:`~wds_async.engine.tarstream.TarParser` and a :class:`~wds_async.engine.grouping.Grouper`. Only
``(key, offset, end)`` of each sample is kept; its bytes are dropped at once, so memory stays at one
sample per shard in flight. The identity comes from the reader's first open, ``compressed`` from the
parser. A shard that ends truncated, is not a tar, or breaks the grouping rules ends the build with an
error naming it: an index never silently misses samples. See :mod:`wds_async.index.format` for the file.
"""

from __future__ import annotations

import asyncio
from asyncio import TaskGroup
from collections.abc import Callable, Iterable, Mapping
from contextlib import aclosing
from typing import Any

from .._loop import run_private
from ..config import EngineConfig, RetryPolicy
from ..engine.shard import ShardParse, read_shard
from ..io import Backend, BackendSet, ObjectIdentity, scheme_options, validate_url
from ..io.listing import expand_globs
from ..io.reader import RangeReader, ReadContext
from ..urls import expand_urls, redact_url
from .format import ShardEntry, ShardIndex

__all__ = ["build_index"]

_GROUP = BaseExceptionGroup


async def _index_shard(backend: Backend, url: str, policy: RetryPolicy, tick: Callable[[int], None]) -> ShardEntry:
    """Stream one shard whole; keep (key, offset, end) per sample and drop the bytes at once. A truncated or
    corrupt shard is an error naming it, never a partial entry."""
    shown = redact_url(url)
    reader = RangeReader(backend, url, context=ReadContext(policy))
    parse = ShardParse(shown)
    keys: list[str] = []
    offsets: list[int] = []
    ends: list[int] = []
    nbytes = 0
    async with aclosing(read_shard(reader, parse)) as reads:
        async for chunk, samples in reads:
            nbytes += len(chunk)
            if chunk:
                tick(len(chunk))
            for s in samples:
                keys.append(s["__key__"])
                offsets.append(s.offset or 0)
                ends.append(s.end or 0)
    seen = reader.identity or ObjectIdentity()
    return ShardEntry(url=shown, size=seen.size if seen.size is not None else nbytes, etag=seen.etag,
                      generation=seen.generation, last_modified=seen.last_modified,
                      compressed=bool(parse.parser.compressed), keys=tuple(keys), offsets=tuple(offsets),
                      ends=tuple(ends))


async def _index_all(urls: list[str], config: EngineConfig, options: Mapping[str, Any],
                     overrides: Mapping[str, Any] | None,
                     progress: Callable[[int, int, int], None] | None) -> list[ShardEntry]:
    backends = BackendSet(config, overrides, options)
    results: list[ShardEntry | None] = [None] * len(urls)
    todo = iter(enumerate(urls))  # shared by the workers, so shards open in list order
    done, nbytes = 0, 0

    def tick(n: int) -> None:
        nonlocal nbytes
        nbytes += n
        if progress is not None:
            progress(done, len(urls), nbytes)

    async def worker() -> None:
        nonlocal done
        for i, url in todo:
            results[i] = await _index_shard(backends.for_url(url), url, config.retry, tick)
            done += 1
            tick(0)

    try:
        async with TaskGroup() as group:
            for _ in range(min(config.connections, len(urls))):
                group.create_task(worker())
    except _GROUP as errors:
        raise next(e for e in errors.exceptions if not isinstance(e, asyncio.CancelledError)) from None
    finally:
        await backends.aclose()
    return [e for e in results if e is not None]


def build_index(urls: str | Iterable[str], *, max_connections: int = 16,
                backend_options: Mapping[str, Any] | None = None, backends: Mapping[str, Any] | None = None,
                progress: Callable[[int, int, int], None] | None = None) -> ShardIndex:
    """Stream every shard of ``urls`` (braces and globs expanded as WebDataset does) once, up to
    ``max_connections`` at a time, and return their :class:`ShardIndex` in shard order.

    ``progress(shards_done, shards_total, bytes_read)`` is called as bytes arrive, in the thread that
    runs the private event loop (the caller's, or a helper thread when the caller runs a loop). Any
    error (a missing, truncated or corrupt shard, a repeated extension) ends the build and names the URL.
    ``backend_options`` are checked as WebDataset checks them (per scheme, or flat for one scheme).
    """
    shards = expand_urls(urls)
    for url in shards:
        validate_url(url)
    config = EngineConfig(max_connections=max_connections)
    options = scheme_options(backend_options, shards, backends)
    shards = expand_globs(shards, config, options, backends)
    return ShardIndex(run_private(lambda: _index_all(shards, config, options, backends, progress)))
